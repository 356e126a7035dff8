"""The feature-set rules of the CPU kernels (common/isa_features.py), on fake /proc/cpuinfo flags of
the CPUs they are meant for: no torch, no build."""

from __future__ import annotations

import pytest

from zserve.common.isa_features import FEATURES, LEVELS, IsaFeatures, choose_isa, cpu_flags

ZEN3 = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"})
SKYLAKE_SP = ZEN3 | {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}
CASCADE_LAKE = SKYLAKE_SP | {"avx512_vnni"}
ALDER_LAKE = ZEN3 | {"avx_vnni"}
ZEN4 = CASCADE_LAKE | {"avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN4 | {"avx_vnni", "amx_bf16", "amx_int8", "amx_tile"}
ZEN5 = ZEN4 | {"avx_vnni"}


@pytest.mark.parametrize(
    "flags, name",
    [
        (frozenset({"sse2"}), "baseline"),
        (frozenset({"avx2", "fma"}), "baseline"),  # no F16C: no base, so no avx_vnni either
        (frozenset({"avx2", "fma", "avx_vnni"}), "baseline"),
        (ZEN3, "avx2"),
        (SKYLAKE_SP, "avx512"),
        (CASCADE_LAKE, "avx512+avx512_vnni"),
        (ALDER_LAKE, "avx2+avx_vnni"),
        (ZEN4, "avx512+avx512_vnni+avx512_bf16"),
        (ZEN5, "avx512+avx512_vnni+avx_vnni+avx512_bf16"),
        (SAPPHIRE_RAPIDS, "avx512+avx512_vnni+avx_vnni+avx512_bf16+amx_int8"),
        (ZEN5 | {"amx_int8"}, "avx512+avx512_vnni+avx_vnni+avx512_bf16"),  # AMX-INT8 needs the tile flag too
        (SKYLAKE_SP | {"avx512_bf16"}, "avx512+avx512_bf16"),  # no such CPU, but the rule is per feature
    ],
)
def test_the_default_is_every_feature_the_cpu_has(flags, name):
    assert choose_isa(flags, None, "x86_64").name == name
    assert choose_isa(flags, "auto", "x86_64") == choose_isa(flags, "", "x86_64") == IsaFeatures.of_cpu(flags)


def test_the_level_names_are_fixed_sets():
    assert {level: IsaFeatures.parse(level).name for level in LEVELS} == {
        "baseline": "baseline", "avx2": "avx2", "avx512": "avx512", "avx512_bf16": "avx512+avx512_vnni+avx512_bf16",
    }
    assert IsaFeatures.parse("avx512").features == {"avx2", "avx512"}  # an x86-64-v4 build is a v3 build and more
    # as a level avx512_bf16 brings VNNI (every CPU with AVX512-BF16 has it); as a feature it does not
    assert "avx512_vnni" not in IsaFeatures.parse("avx512+avx512_bf16")


@pytest.mark.parametrize(
    "text, name",
    [
        ("avx2+avx_vnni", "avx2+avx_vnni"),
        ("avx_vnni+avx2", "avx2+avx_vnni"),
        ("avx512+avx512_vnni", "avx512+avx512_vnni"),
        ("avx2+avx512", "avx512"),
        ("avx512+avx512_bf16+avx512_vnni+avx_vnni", "avx512+avx512_vnni+avx_vnni+avx512_bf16"),
        ("amx_int8+avx512", "avx512+amx_int8"),
    ],
)
def test_explicit_sets_and_their_canonical_names(text, name):
    isa = IsaFeatures.parse(text)
    assert isa.name == name and IsaFeatures.parse(isa.name) == isa  # the name is what the launcher hands on


def test_malformed_sets_are_refused_naming_the_setting():
    for text in ("sse9", "avx2+", "baseline+avx2", "avx2+amx"):
        with pytest.raises(ValueError, match="expected auto, a level .* or features joined by") as refused:
            IsaFeatures.parse(text)
        assert str(refused.value).startswith(f"--cpu-isa {text!r}: ")
    with pytest.raises(ValueError, match=r"--cpu-isa avx2\+avx512_vnni: avx512_vnni needs avx512"):
        IsaFeatures.parse("avx2+avx512_vnni")
    with pytest.raises(ValueError, match=r"--cpu-isa avx2\+amx_int8: amx_int8 needs avx512"):
        IsaFeatures.parse("avx2+amx_int8")
    with pytest.raises(ValueError, match="--cpu-isa avx_vnni: avx_vnni needs avx2"):
        IsaFeatures.parse("avx_vnni")
    with pytest.raises(ValueError, match=r"\$ZSERVE_CPU_ISA 'x'"):
        choose_isa(ZEN3, "x", "x86_64", what="$ZSERVE_CPU_ISA")


def test_a_feature_the_cpu_lacks_is_refused_with_its_flags():
    assert choose_isa(SAPPHIRE_RAPIDS, "avx2", "x86_64").name == "avx2"
    assert choose_isa(SAPPHIRE_RAPIDS, "avx512+avx512_vnni", "x86_64").name == "avx512+avx512_vnni"  # Cascade Lake's
    assert choose_isa(SAPPHIRE_RAPIDS, "avx2+avx_vnni", "x86_64").name == "avx2+avx_vnni"  # Alder Lake's
    with pytest.raises(ValueError, match=r"avx512_bf16: this CPU lacks avx512_bf16, avx512_vnni, avx512bw, avx512dq, "
                                         r"avx512f, avx512vl \(it has avx2\)"):
        choose_isa(ZEN3, "avx512_bf16", "x86_64")
    with pytest.raises(ValueError, match=r"--cpu-isa avx2\+avx_vnni: this CPU lacks avx_vnni \(it has avx512\+avx512_vnni\)"):
        choose_isa(CASCADE_LAKE, "avx2+avx_vnni", "x86_64")
    with pytest.raises(ValueError, match=r"this CPU lacks avx512_bf16 \(it has avx512\+avx512_vnni\)"):
        choose_isa(CASCADE_LAKE, "avx512_bf16", "x86_64")
    with pytest.raises(ValueError, match="this CPU lacks avx512bw, avx512dq, avx512f, avx512vl"):
        choose_isa(ALDER_LAKE, "avx512", "x86_64")


def test_off_x86_only_baseline_applies():
    assert choose_isa(frozenset(), None, "aarch64") == IsaFeatures()
    assert choose_isa(frozenset(), "baseline", "aarch64").name == "baseline"
    with pytest.raises(ValueError, match="aarch64"):
        choose_isa(frozenset(), "avx2", "aarch64")


def test_a_set_without_its_base_cannot_be_made():
    with pytest.raises(AssertionError):
        IsaFeatures(frozenset({"avx512_vnni", "avx2"}))
    assert len(FEATURES) == len(set(FEATURES))


def test_cpu_flags_reads_the_first_processor(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "fma"}
    assert cpu_flags(tmp_path / "missing") == frozenset()
