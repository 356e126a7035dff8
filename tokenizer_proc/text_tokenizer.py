"""Text <-> token ids for one model, without torch or transformers (fast to start, small).

Loads tokenizer.json with the `tokenizers` library, as written: its normalizer, pre-tokenizer,
post-processor (which decides whether a BOS is added) and decoder. This is what transformers 5's
AutoTokenizer does for tokenizers declared as PreTrainedTokenizerFast / TokenizersBackend and for
model types it knows, and what transformers 4, vLLM and SGLang do for every fast tokenizer.
Known difference: transformers 5 rebuilds some classes from vocab and merges with its own
pipeline instead (e.g. `LlamaTokenizer` gets a non-legacy Metaspace pre-tokenizer), so for a
Llama-2 tokenizer.json it can differ from the file (and from sentencepiece) around leading spaces
and text right after special tokens; we follow the file, which is what the model was trained on.

As transformers 5 does, named special tokens (bos/eos/unk/pad/..., and additional ones) missing
from tokenizer.json's added tokens are added as special tokens, so they are never split in text
and `skip_special_tokens` drops them. `clean_up_tokenization_spaces` is not applied (transformers
5 ignores it for BPE, which every model family we serve uses).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

from zserve.tokenizer_proc.chat_template import ChatTemplate
from zserve.tokenizer_proc.tokenizer_files import TokenizerFiles


class TextTokenizer:
    def __init__(
        self,
        backend: Tokenizer,
        *,
        special_tokens: dict[str, str],
        eos_token_ids: tuple[int, ...],
        chat_templates: dict[str, ChatTemplate],
        name: str,
    ):
        """Prefer `from_model_dir`. `special_tokens` maps "bos_token" etc. to token strings (all
        present in `backend`); they are also the chat template's variables."""
        self._backend = backend
        self.special_tokens = dict(special_tokens)
        self.eos_token_ids = eos_token_ids
        self.chat_templates = dict(chat_templates)
        self.name = name
        added_ids = backend.get_added_tokens_decoder()
        # Ids the tokenizer can produce or decode are [0, vocab_size); added ids may leave gaps.
        self.vocab_size = max(backend.get_vocab_size(with_added_tokens=False), max(added_ids, default=-1) + 1)
        # Longest token string (byte-level tokens spell one character per byte): no token covers
        # more characters of text than this.
        self.max_token_len = max(map(len, backend.get_vocab(with_added_tokens=True)), default=1)
        bos = special_tokens.get("bos_token")
        self.bos_token_id: int | None = backend.token_to_id(bos) if bos is not None else None
        # For the detokenizer: byte-fallback vocabularies (<0xNN> tokens) decode a run of byte
        # tokens all-or-nothing; appending this invalid byte shows whether a run is still open.
        byte_fallback = getattr(backend.model, "byte_fallback", False)
        self.invalid_byte_token_id: int | None = backend.token_to_id("<0x80>") if byte_fallback else None
        self.adds_bos = self.bos_token_id is not None and backend.encode("a").ids[:1] == [self.bos_token_id]

    @staticmethod
    def from_model_dir(model_dir: str | Path) -> TextTokenizer:
        files = TokenizerFiles.read(model_dir)
        try:
            backend = Tokenizer.from_file(str(files.tokenizer_json))
        except Exception as exc:  # the Rust side raises a bare Exception for any malformed file
            raise ValueError(f"{files.tokenizer_json}: not a valid tokenizers file: {exc}") from exc

        present = {t.content for t in backend.get_added_tokens_decoder().values()}
        wanted = list(files.special_tokens.values()) + list(files.extra_special_tokens)
        missing = [t for t in dict.fromkeys(wanted) if t not in present]
        if missing:
            backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])

        eos_ids: list[int] = []
        eos = files.special_tokens.get("eos_token")
        if eos is not None:
            eos_ids.append(backend.token_to_id(eos))
        eos_ids += [i for i in files.eos_token_ids if i not in eos_ids]

        templates = {name: ChatTemplate(src, origin) for name, (src, origin) in files.chat_templates.items()}
        return TextTokenizer(
            backend,
            special_tokens=files.special_tokens,
            eos_token_ids=tuple(eos_ids),
            chat_templates=templates,
            name=str(files.model_dir),
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Same ids as transformers' `tokenizer(text)["input_ids"]` (BOS included if the
        tokenizer adds one); special-token text in `text` becomes the special token."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def token_strs(self, token_ids: Sequence[int]) -> list[str]:
        """Each id's own string in the vocabulary (byte-level BPE's `Ġ` and such kept), as vLLM's /tokenize
        `token_strs` and transformers' convert_ids_to_tokens give them."""
        return [self._backend.id_to_token(int(t)) or "" for t in token_ids]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def with_chat_template(self, source: str, origin: str) -> TextTokenizer:
        """This tokenizer with `source` as its default chat template (--chat-template)."""
        other = copy.copy(self)
        other.chat_templates = {**self.chat_templates, "default": ChatTemplate(source, origin)}
        return other

    @property
    def chat_template_source(self) -> str | None:
        """The default chat template's Jinja source (None without one)."""
        template = self.chat_templates.get("default")
        return None if template is None else template.source

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_templates)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, *,
        max_chars: int | None = None, timeout_s: float | None = None, tools: list[dict[str, Any]] | None = None,
        continue_final_message: bool = False, template_kwargs: dict[str, Any] | None = None,
        template: ChatTemplate | None = None,
    ) -> str:
        """Render `messages` with `template`, or the model's default chat template (None). Raises ValueError (fit
        for the client) when the model has none or the template rejects the conversation, fails on
        it, or passes `max_chars` or `timeout_s` (see ChatTemplate.render, also for
        `continue_final_message`, which needs `add_generation_prompt` false)."""
        return (template or self._chat_template()).render(
            messages, add_generation_prompt=add_generation_prompt, special_tokens=self.special_tokens,
            max_chars=max_chars, timeout_s=timeout_s, tools=tools, continue_final_message=continue_final_message,
            template_kwargs=template_kwargs,
        )

    def encode_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, *,
        max_chars: int | None = None, timeout_s: float | None = None, tools: list[dict[str, Any]] | None = None,
        continue_final_message: bool = False, template_kwargs: dict[str, Any] | None = None,
        template: ChatTemplate | None = None,
    ) -> list[int]:
        """Same ids as transformers' `apply_chat_template(messages, tokenize=True)`: the rendered
        text encoded without adding special tokens, since the template writes its own BOS."""
        text = self.apply_chat_template(messages, add_generation_prompt, max_chars=max_chars, timeout_s=timeout_s,
                                        tools=tools, continue_final_message=continue_final_message,
                                        template_kwargs=template_kwargs, template=template)
        return self.encode(text, add_special_tokens=False)

    def _chat_template(self) -> ChatTemplate:
        if not self.chat_templates:
            raise ValueError(
                f"this model ({self.name}) has no chat template, so chat requests (messages) are not "
                "supported; send a prompt or input_ids instead"
            )
        if "default" not in self.chat_templates:
            raise ValueError(
                f"this model ({self.name}) has chat templates {sorted(self.chat_templates)} but none named "
                "'default'; chat requests are not supported"
            )
        return self.chat_templates["default"]
