"""Workloads: the requests a benchmark sends (text or token ids, and how many tokens to generate).

Three families:

- repeats: the design posts' mix. A base prompt repeated by a cycle of counts: with
  `1,1,1,64`, requests 0, 1, 2 carry the base prompt once and request 3 carries it 64 times,
  then the cycle starts again. `unique="suffix"` appends a distinct tag per request (no two
  prompts are identical, but repeated prompts still share a prefix); `unique="prefix"` puts the
  tag first, so no two requests share a cached prefix at all.
- random: token ids drawn uniformly from the vocabulary (special tokens excluded), lengths drawn
  uniformly from [min_len, max_len] per request (see `LengthRange`).
- shared prefix: SGLang's generated-shared-prefix set: `num_groups` long system prompts, each
  followed by `prompts_per_group` short distinct questions; requests are interleaved across
  groups so the cache must hold every group's prefix at once.
- echo: chat requests whose answers copy long spans of the prompt (fix the typos in a paragraph,
  rewrite it with one word changed, rename a variable in a function): the workload n-gram
  speculative decoding is for (texts in benchmarks/echo_corpus.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_BASE_PROMPT = "Explain why the sky is blue, and what makes sunsets red. "


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request of a workload: exactly one of `prompt` / `input_ids` / `messages` is set;
    `sampling` adds sampling fields (name, value) such as a json_schema."""

    max_tokens: int
    prompt: str | None = None
    input_ids: tuple[int, ...] | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content) turns of a chat
    sampling: tuple[tuple[str, object], ...] = ()

    def client_kwargs(self) -> dict:
        if self.input_ids is not None:
            return {"input_ids": list(self.input_ids), **dict(self.sampling)}
        if self.messages is not None:
            return {"messages": [{"role": role, "content": content} for role, content in self.messages], **dict(self.sampling)}
        return {"prompt": self.prompt, **dict(self.sampling)}


@dataclass(frozen=True, slots=True)
class LengthRange:
    """Lengths drawn uniformly (integers, both ends included) from [min_len, max_len].

    SGLang's convention: `from_ratio(max_len, range_ratio)` gives [max(1, int(max_len * range_ratio)), max_len],
    so `--input-len 512 --range-ratio 1.0` is always 512 and `0.0625` is 32..512.
    """

    min_len: int
    max_len: int

    def __post_init__(self) -> None:
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got [{self.min_len}, {self.max_len}]")

    @staticmethod
    def from_ratio(max_len: int, range_ratio: float, min_len: int | None = None) -> LengthRange:
        if not 0.0 <= range_ratio <= 1.0:
            raise ValueError(f"range_ratio must be in [0, 1], got {range_ratio}")
        low = min_len if min_len is not None else max(1, int(max_len * range_ratio))
        return LengthRange(low, max_len)

    def sample(self, rng: np.random.Generator, num: int) -> list[int]:
        return [int(x) for x in rng.integers(self.min_len, self.max_len + 1, size=num)]


def parse_counts(text: str) -> list[int]:
    """'1,1,1,64' -> [1, 1, 1, 64]."""
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or min(counts) < 1:
        raise ValueError(f"prompt repeat counts must be positive integers, got {text!r}")
    return counts


def repeats_workload(
    base_prompt: str, repeat_counts: list[int], num_requests: int, max_tokens: int, unique: str = "none", salt: str = "",
) -> list[BenchRequest]:
    """`salt` starts every prompt (a different one per repeat keeps one repeat's prompts out of
    the next repeat's prefix hits when a server serves several repeats)."""
    if unique not in ("none", "suffix", "prefix"):
        raise ValueError(f"unique must be none, suffix or prefix, got {unique!r}")
    requests = []
    for i in range(num_requests):
        text = salt + base_prompt * repeat_counts[i % len(repeat_counts)]
        if unique == "suffix":
            text = f"{text}(request {i})"
        elif unique == "prefix":
            text = f"(request {i}) {text}"  # before the salt is as good as after it: nothing is shared
        requests.append(BenchRequest(max_tokens, prompt=text))
    return requests


def random_workload(
    token_ids: np.ndarray, num_requests: int, input_lens: LengthRange, output_lens: LengthRange, seed: int, salt: int = 0,
) -> list[BenchRequest]:
    """Random token-id prompts: exact prompt lengths, no tokenizer round trip. Lengths depend on
    `seed` only; the ids also on `salt` (one per repeat: same lengths, no cross-repeat hits)."""
    rng = np.random.default_rng(seed)
    in_lens = input_lens.sample(rng, num_requests)
    out_lens = output_lens.sample(rng, num_requests)
    id_rng = np.random.default_rng([seed, salt])
    return [
        BenchRequest(out_len, input_ids=tuple(int(t) for t in id_rng.choice(token_ids, size=in_len)))
        for in_len, out_len in zip(in_lens, out_lens, strict=True)
    ]


def shared_prefix_workload(
    token_ids: np.ndarray, num_groups: int, prompts_per_group: int, system_len: int, question_len: int,
    max_tokens: int, seed: int, salt: int = 0,
) -> list[BenchRequest]:
    rng = np.random.default_rng([seed, salt])
    systems = [rng.choice(token_ids, size=system_len) for _ in range(num_groups)]
    requests = []
    for _ in range(prompts_per_group):  # round-robin over groups
        for system in systems:
            question = rng.choice(token_ids, size=question_len)
            ids = tuple(int(t) for t in np.concatenate([system, question]))
            requests.append(BenchRequest(max_tokens, input_ids=ids))
    return requests


def with_typos(text: str, rng: np.random.Generator, rate: float = 0.08) -> str:
    """`text` with about `rate` of its words of 4+ letters given one typo (two neighbouring letters swapped)."""
    words = text.split(" ")
    for i, word in enumerate(words):
        if len(word) >= 4 and word.isalpha() and rng.random() < rate:
            j = int(rng.integers(1, len(word) - 2))
            words[i] = word[:j] + word[j + 1] + word[j] + word[j + 2 :]
    return " ".join(words)


def echo_workload(num_requests: int, max_tokens: int, seed: int, salt: int = 0) -> list[BenchRequest]:
    """Chat requests whose answer is mostly a copy of the prompt, cycling over three tasks: fix the
    typos of a paragraph, repeat a paragraph word for word, rename a variable
    in a function. `salt` (one per repeat) tags each prompt so a repeat finds no earlier repeat's
    prompts in the prefix cache; `max_tokens` caps each answer (the model usually stops earlier)."""
    from benchmarks.echo_corpus import CODE, CODE_RENAMES, PROSE

    rng = np.random.default_rng([seed, salt])
    requests = []
    for i in range(num_requests):
        task = i % 3
        tag = f"(Task {salt}-{i}.) "
        if task == 0:
            text = with_typos(PROSE[i % len(PROSE)], rng)
            content = f"{tag}Fix the spelling mistakes in the following text. Reply with the corrected text only.\n\n{text}"
        elif task == 1:
            content = f"{tag}Repeat the following text exactly, word for word.\n\n{PROSE[(i + 3) % len(PROSE)]}"
        else:
            k = i % len(CODE)
            old, new = CODE_RENAMES[k]
            content = f"{tag}Rename the variable `{old}` to `{new}` in this Python function and reply with the whole function.\n\n```python\n{CODE[k]}```"
        requests.append(BenchRequest(max_tokens, messages=(("user", content),)))
    return requests


def sampleable_token_ids(model_dir: str | Path) -> np.ndarray:
    """Every id of the model's tokenizer that is not a special (added) token."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    special = {i for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special}
    ids = np.array([i for i in range(tokenizer.get_vocab_size(with_added_tokens=False)) if i not in special], np.int64)
    if len(ids) == 0:
        raise ValueError(f"{model_dir}: tokenizer has no ordinary tokens")
    return ids
