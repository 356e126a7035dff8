"""Kernel choices are ServerConfig fields with flags (--cpu-isa, --gemm-backend, --attention-backend,
--fused-ops). A ZSERVE_* variable only sets a flag's default, read once where the launcher builds
the config; the flag wins; the config is what the model worker's ModelRunner chooses by."""

from __future__ import annotations

import pytest
import torch

from testing.model_fixtures import runner_of
from zserve.common.isa_features import IsaFeatures, choose_isa, cpu_flags, resolve_cpu_isa
from zserve.common.server_config import ServerConfig
from zserve.common.server_flags import FLAG_SPECS, env_defaults
from zserve.common.worker_env import worker_env
from zserve.launcher.cli import parse_config
from zserve.model_proc.kernels.cpu_kernels import load_paged_attention
from zserve.model_proc.layers.weight_kernels.registry import choose_kernel

ENV = ("ZSERVE_CPU_ISA", "ZSERVE_GEMM", "ZSERVE_ATTENTION", "ZSERVE_FUSED_OPS")


@pytest.fixture(autouse=True)
def no_kernel_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def test_flags_set_the_fields_and_default_to_auto():
    assert (ServerConfig().cpu_isa, ServerConfig().gemm_backend, ServerConfig().attention_backend, ServerConfig().fused_ops) == ("auto",) * 4
    cfg = parse_config(["--cpu-isa", "baseline", "--gemm-backend", "torch", "--attention-backend", "torch", "--fused-ops", "off"])
    assert (cfg.cpu_isa, cfg.gemm_backend, cfg.attention_backend, cfg.fused_ops) == ("baseline", "torch", "torch", "off")
    assert ServerConfig.from_json(cfg.to_json()) == cfg  # what every child process receives


def test_an_environment_variable_is_the_default_and_the_flag_wins(monkeypatch):
    monkeypatch.setenv("ZSERVE_GEMM", "onednn")
    monkeypatch.setenv("ZSERVE_FUSED_OPS", "off")
    assert env_defaults() == {"gemm_backend": ("ZSERVE_GEMM", "onednn"), "fused_ops": ("ZSERVE_FUSED_OPS", "off")}
    assert (parse_config([]).gemm_backend, parse_config([]).fused_ops) == ("onednn", "off")
    assert parse_config(["--gemm-backend", "torch"]).gemm_backend == "torch"


def test_a_bad_environment_value_is_refused_naming_the_variable(monkeypatch, capsys):
    monkeypatch.setenv("ZSERVE_ATTENTION", "fast")
    with pytest.raises(SystemExit) as exit_info:
        parse_config([])
    assert exit_info.value.code == 2
    assert "$ZSERVE_ATTENTION='fast' (the default of --attention-backend): expected one of auto, torch, kernel" in capsys.readouterr().err
    assert parse_config(["--attention-backend", "torch"]).attention_backend == "torch"  # a flag given replaces it


def test_cpu_isa_is_resolved_once_by_the_launcher_and_handed_to_the_worker():
    assert resolve_cpu_isa("auto") == IsaFeatures.of_cpu(cpu_flags()).name
    assert resolve_cpu_isa("baseline") == "baseline"
    with pytest.raises(ValueError, match="--cpu-isa avx512_bf16: this CPU lacks avx512_bf16, avx512_vnni"):
        choose_isa(frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl"}), "avx512_bf16", "x86_64")
    # a set, not one of a few choices: the launcher's resolve_config refuses a bad one (ValueError naming the flag)
    assert FLAG_SPECS["cpu_isa"].choices is None
    assert parse_config(["--cpu-isa", "avx2+avx_vnni"]).cpu_isa == "avx2+avx_vnni"
    with pytest.raises(ValueError, match="--cpu-isa 'sse9': expected auto, a level"):
        resolve_cpu_isa("sse9")
    assert worker_env(1, "cpu", 0, "avx2")["ZSERVE_CPU_ISA"] == "avx2"
    assert worker_env(1, "cpu", 0, "avx512+avx512_vnni")["ZSERVE_CPU_ISA"] == "avx512+avx512_vnni"
    assert "ZSERVE_CPU_ISA" not in worker_env(1, "cpu", 0)


def test_the_config_is_what_the_workers_model_runner_chooses_by(model_dir, monkeypatch):
    """runner_of builds the runner as the worker does (model_proc/worker_process.py, from the config's
    sections): the config's choice wins over anything in the worker's environment."""
    monkeypatch.setenv("ZSERVE_ATTENTION", "kernel")  # ignored: the worker reads the config
    monkeypatch.setenv("ZSERVE_GEMM", "onednn")
    small = dict(device="cpu", dtype="bfloat16", kv_cache_tokens=64, num_threads=1)
    reference = runner_of(
        ServerConfig(model=str(model_dir), gemm_backend="torch", attention_backend="torch", fused_ops="off", **small)
    )
    assert (reference.gemm_backend, reference.attention_backend) == ("torch", "torch")
    assert not any(getattr(m, "fused", False) or getattr(m, "fused_rope", False) for m in reference.model.modules())
    default = runner_of(ServerConfig(model=str(model_dir), **small))
    kernels = load_paged_attention() is not None
    assert default.attention_backend == ("cpu_kernel" if kernels else "torch")
    assert default.gemm_backend == choose_kernel(torch.device("cpu"), torch.bfloat16, "auto").name
    assert any(getattr(m, "fused", False) for m in default.model.modules()) == kernels
