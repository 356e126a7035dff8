"""Small real tokenizers, trained in about a second, saved as Hugging Face model directories.

Other tests (end-to-end included) import these: each builder takes a target directory, which may
already hold a tiny model (config.json, safetensors), and writes only tokenizer files into it:
tokenizer.json, tokenizer_config.json and, for the byte-level one, chat_template.jinja the way
transformers 5 saves it. transformers' AutoTokenizer loads both, so tests can use it as the oracle.

- `build_byte_level_bpe`: GPT-2 / SmolLM2 style. Byte-level BPE (every byte is a token, so any
  text encodes), digits split one by one, ChatML specials `<|endoftext|>` `<|im_start|>`
  `<|im_end|>`, no BOS added, ChatML chat template.
- `build_metaspace_bpe`: Llama-2 style. `▁` marks spaces, a prefix space is added, characters
  missing from the vocab fall back to `<0xNN>` byte tokens, `<s>` is added in front of every
  encoding, and the Llama-2 `[INST]` chat template (which writes `<s>` itself and calls
  `raise_exception`) sits in tokenizer_config.json.
- `build_gpt2_bpe` (with `fetch_gpt2_ranks`): the real GPT-2 tokenizer, from the BPE ranks in
  openai-whisper's sdist on PyPI, cached; `demo_tokenizer_dir`: the SmolLM2 demo model, if built.

Ids: byte-level 0 `<|endoftext|>`, 1 `<|im_start|>` (bos), 2 `<|im_end|>` (eos);
metaspace 0 `<unk>`, 1 `<s>` (bos), 2 `</s>` (eos), 3-258 `<0x00>`..`<0xFF>`.
Training is deterministic: the same vocab_size gives the same files, and the vocab has exactly
vocab_size tokens (specials included) for sizes up to at least 8000.
"""

from __future__ import annotations

import base64
import json
import os
import random
import string
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer

# Text with multi-byte characters of every UTF-8 length: accented Latin (2 bytes), CJK and
# Hangul (3 bytes), emoji (4 bytes, some joined by ZWJ or with skin-tone modifiers).
CORPUS_LINES: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you today? I'm fine, thanks.",
    "A café in Zürich serves crème brûlée; the naïve façade of São Paulo.",
    "Ångström, Øresund, élève, señor, über, straße, Łódź, Dvořák.",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "日本語のテキストです。東京は大きな都市です。",
    "한국어 문장입니다. 서울은 아름답습니다.",
    "Emoji time: 🙂 🚀 👍🏽 🎉 ❤️ 👩‍💻 🇫🇷 done.",
    "def add(a, b):\n    return a + b  # 1234567890\n",
    "Numbers: 3.14159, 2718, 42, 1000000 and 2024-06-01.",
    "Ελληνικά γράμματα και Русский текст рядом.",
    "Tabs\tand\nnewlines\n\nand   multiple   spaces.",
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)
BYTE_LEVEL_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
METASPACE_SPECIALS = ("<unk>", "<s>", "</s>")
# Letters the Llama-style fixture learns; everything else (emoji, Hangul, Greek, most CJK) falls
# back to <0xNN> byte tokens.
METASPACE_ALPHABET = (
    string.ascii_letters + string.digits + " .,!?;:'\"-()#+=\n\t" + "éèêëàâçñüöäßø" + "你好世界日本"
)


def corpus(num_lines: int = 3000, seed: int = 0) -> list[str]:
    """Deterministic training text: the base lines, and lines of made-up words (so larger
    vocabularies fill up) sprinkled with accented letters, CJK and emoji."""
    rng = random.Random(seed)
    onsets = ("", "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "st", "tr", "ch", "sh")
    vowels = ("a", "e", "i", "o", "u", "é", "ü", "ai", "ou")
    codas = ("", "", "n", "r", "s", "t", "l", "ng")
    extras = ("你好", "世界", "日本", "東京", "한국", "🙂", "🚀", "👍🏽", "ß", "ø", "42", "2024", ",", ".", "!", "?")
    lines = list(CORPUS_LINES)
    while len(lines) < num_lines:
        words = []
        for _ in range(rng.randint(4, 14)):
            syllables = rng.randint(1, 3)
            words.append("".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(syllables)))
            if rng.random() < 0.15:
                words.append(rng.choice(extras))
        line = " ".join(words).capitalize()
        lines.append(line if rng.random() < 0.8 else f"{line} {rng.choice(CORPUS_LINES)}")
    return lines


def build_byte_level_bpe(target_dir: str | Path, vocab_size: int = 600) -> Path:
    """GPT-2 / SmolLM2-style tokenizer files in `target_dir` (created if missing); returns the path."""
    if vocab_size < 256 + len(BYTE_LEVEL_SPECIALS) + 16:
        raise ValueError(f"vocab_size must be at least {256 + len(BYTE_LEVEL_SPECIALS) + 16}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(BYTE_LEVEL_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    endoftext, im_start, im_end = BYTE_LEVEL_SPECIALS
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": im_start,
        "eos_token": im_end,
        "unk_token": endoftext,
        "pad_token": endoftext,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
    }
    out = _save(tok, config, target_dir)
    (out / "chat_template.jinja").write_text(CHATML_TEMPLATE, encoding="utf-8")
    return out


def build_metaspace_bpe(target_dir: str | Path, vocab_size: int = 700) -> Path:
    """Llama-2-style (sentencepiece BPE with byte fallback) tokenizer files in `target_dir`."""
    num_fixed = len(METASPACE_SPECIALS) + 256
    if vocab_size < num_fixed + 64:
        raise ValueError(f"vocab_size must be at least {num_fixed + 64}, got {vocab_size}")
    # Train on ▁-marked words, then rebuild the vocab the way Llama lays it out:
    # 0-2 specials, 3-258 byte tokens <0x00>..<0xFF>, then the learned pieces.
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer_tok.pre_tokenizer = pre_tokenizers.Split(Regex("▁[^▁]*|[^▁]+"), behavior="isolated")
    trainer = BpeTrainer(vocab_size=vocab_size - num_fixed, show_progress=False)
    # Characters outside METASPACE_ALPHABET never reach training, so they are missing from the
    # vocab and encode as byte tokens. (The trainer's own limit_alphabet breaks frequency ties
    # in hash order, which makes the vocab differ from run to run.)
    allowed = set(METASPACE_ALPHABET)
    lines = ("".join(c for c in line if c in allowed) for line in corpus())
    trainer_tok.train_from_iterator(lines, trainer=trainer)
    learned = json.loads(trainer_tok.to_str())["model"]
    pieces = sorted(learned["vocab"], key=learned["vocab"].get)
    vocab = {t: i for i, t in enumerate(METASPACE_SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]

    unk, bos, eos = METASPACE_SPECIALS
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in METASPACE_SPECIALS])
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
    )
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": unk,
        "pad_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "legacy": True,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": LLAMA2_TEMPLATE,
    }
    return _save(tok, config, target_dir)


def fetch_gpt2_ranks(cache_dir: str | Path) -> Path | None:
    """GPT-2's BPE ranks (`gpt2.tiktoken`, 50256 base64 tokens with their ranks), taken from
    openai-whisper's source distribution on PyPI and cached in `cache_dir`; None if unavailable."""
    cache = Path(cache_dir)
    target = cache / "gpt2.tiktoken"
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--retries", "0"]
        cmd += ["--timeout", "20", "-q", "-d", tmp, "openai-whisper"]
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=180)
        except (OSError, subprocess.SubprocessError):
            return None
        for sdist in Path(tmp).glob("openai_whisper-*.tar.gz"):
            with tarfile.open(sdist) as tar:
                member = next((m for m in tar.getmembers() if m.name.endswith("whisper/assets/gpt2.tiktoken")), None)
                source = tar.extractfile(member) if member is not None else None
                if source is None:
                    return None
                staged = Path(tmp) / "gpt2.tiktoken"
                staged.write_bytes(source.read())
                os.replace(staged, target)  # atomic: concurrent test runs never see half a file
                return target
    return None


def build_gpt2_bpe(target_dir: str | Path, ranks_path: str | Path) -> Path:
    """The real GPT-2 tokenizer (byte-level BPE, 50257 tokens) from tiktoken ranks, as a model
    directory. A pair merges when both halves and their concatenation are tokens, with the
    concatenation's rank as priority: the same result as tiktoken's rank-based BPE."""
    ranks = load_tiktoken_ranks(ranks_path)
    to_unicode = _bytes_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(to_unicode[b] for b in token)

    merges = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], spell(left), spell(right)))
    merges.sort()
    vocab = {spell(token): rank for token, rank in ranks.items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's own regex
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    endoftext = "<|endoftext|>"
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": endoftext,
        "eos_token": endoftext,
        "unk_token": endoftext,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1024,
    }
    return _save(tok, config, target_dir)


def load_tiktoken_ranks(path: str | Path) -> dict[bytes, int]:
    ranks = {}
    for line in Path(path).read_text(encoding="ascii").splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (bytes that are printable map to themselves)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def demo_tokenizer_dir() -> Path | None:
    """The real SmolLM2 demo model directory (`zserve-fetch-demo`), if it is there; tests that
    compare against a real tokenizer skip when this is None."""
    from zserve.launcher.demo_model import demo_model_dir  # cheap: no torch, no transformers

    path = demo_model_dir()
    return path if (path / "tokenizer.json").is_file() else None


def _save(tok: Tokenizer, config: dict, target_dir: str | Path) -> Path:
    out = Path(target_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    return out
