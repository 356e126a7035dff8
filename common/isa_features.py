"""Which x86 instructions the CPU kernels may use: a set of features, chosen from the CPU's
/proc/cpuinfo flags. The rules are torch-free, so the launcher checks `--cpu-isa` before it starts
anything (model_proc/kernels/cpu_isa.py builds the kernels for the set).

    feature       /proc/cpuinfo flags                    what the kernels do with it
    avx2          avx2 fma f16c                          256-bit kernels (-march=x86-64-v3): the widening GEMM,
                                                         attention, fused ops, int8 dot products by VPMADDUBSW ymm
    avx512        avx512f avx512bw avx512dq avx512vl     512-bit kernels (-march=x86-64-v4); includes avx2
    avx512_vnni   avx512_vnni   (needs avx512)           int8 dot products by VPDPBUSD zmm (-mavx512vnni)
    avx_vnni      avx_vnni      (needs avx2)             int8 dot products by VPDPBUSD ymm, VEX-encoded (-mavxvnni),
                                                         in a 256-bit build (one without avx512)
    avx512_bf16   avx512_bf16   (needs avx512)           the VDPBF16PS GEMM for bf16 (-mavx512bf16)
    amx_int8      amx_tile amx_int8  (needs avx512)      int8 dot products of many rows in AMX tiles by TDPBSUD
                                                         (-mamx-tile -mamx-int8; kernels/gemm_amx.cpp), when the
                                                         OS also grants the process the tile data (asked at run
                                                         time; refused: VPDPBUSD, logged once)

A set is written as its features joined by "+" (`avx512+avx512_vnni`, `avx2+avx_vnni`), or by one
of the old level names, each a fixed set: `baseline` (none: scalar loops the compiler vectorizes
as it can; the only choice off x86), `avx2`, `avx512`, and `avx512_bf16`, which means
avx512+avx512_vnni+avx512_bf16 (every CPU with AVX512-BF16 has AVX512-VNNI). Its canonical name
(`IsaFeatures.name`, in the config, the build folder and the logs) is the widest base followed by
the extensions in the order above: `avx512+avx512_vnni+avx_vnni+avx512_bf16+amx_int8` on a Sapphire
Rapids.

The default is every feature the CPU has. A smaller set may be forced on a bigger CPU (so one
machine tests every path it can run); a feature the CPU lacks is an error naming the missing
flags, because the build would issue instructions the CPU cannot run.

    CPU (examples)                      its set
    Zen 2/3, Haswell..Comet Lake        avx2
    Skylake-SP Xeon                     avx512
    Cascade Lake, Ice Lake Xeon         avx512+avx512_vnni
    Alder Lake, Raptor Lake             avx2+avx_vnni
    Zen 4 / Cooper Lake                 avx512+avx512_vnni+avx512_bf16
    Zen 5                               avx512+avx512_vnni+avx_vnni+avx512_bf16
    Sapphire Rapids and later           avx512+avx512_vnni+avx_vnni+avx512_bf16+amx_int8
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

# the default of --cpu-isa; and how the launcher hands the resolved set to the model worker
CPU_ISA_ENV = "ZSERVE_CPU_ISA"
FEATURE_FLAGS = {  # in canonical order: the bases, then the extensions
    "avx2": ("avx2", "fma", "f16c"),
    "avx512": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl"),
    "avx512_vnni": ("avx512_vnni",),
    "avx_vnni": ("avx_vnni",),
    "avx512_bf16": ("avx512_bf16",),
    "amx_int8": ("amx_tile", "amx_int8"),
}
FEATURES = tuple(FEATURE_FLAGS)
BASES = ("avx2", "avx512")  # narrowest first; avx512 includes avx2
# the base each extension needs
EXTENSION_BASE = {"avx512_vnni": "avx512", "avx_vnni": "avx2", "avx512_bf16": "avx512", "amx_int8": "avx512"}
LEVELS = {  # the old level names, lowest first, and the set each means
    "baseline": (),
    "avx2": ("avx2",),
    "avx512": ("avx2", "avx512"),
    "avx512_bf16": ("avx2", "avx512", "avx512_vnni", "avx512_bf16"),
}
X86_MACHINES = ("x86_64", "AMD64")


@dataclass(frozen=True, slots=True)
class IsaFeatures:
    """A set of FEATURES closed under its bases: avx512 brings avx2, and each extension is there
    only with its base."""

    features: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        assert self.features <= set(FEATURES), self.features
        assert "avx512" not in self.features or "avx2" in self.features, self.features
        assert all(EXTENSION_BASE[f] in self.features for f in self.features if f in EXTENSION_BASE), self.features

    def __contains__(self, feature: str) -> bool:
        return feature in self.features

    def __str__(self) -> str:
        return self.name

    @property
    def name(self) -> str:
        """`baseline`, or the widest base and then the extensions: `avx512+avx512_vnni`."""
        bases = [base for base in BASES if base in self.features]
        if not bases:
            return "baseline"
        return "+".join([bases[-1], *(f for f in FEATURES if f in self.features and f not in BASES)])

    @property
    def vector_bits(self) -> int:
        """The width of the kernels' vectors: 512, 256, or 0 (scalar)."""
        return 512 if "avx512" in self.features else 256 if "avx2" in self.features else 0

    def required_flags(self) -> frozenset[str]:
        return frozenset(flag for feature in self.features for flag in FEATURE_FLAGS[feature])

    def issubset(self, other: IsaFeatures) -> bool:
        return self.features <= other.features

    @classmethod
    def of_cpu(cls, flags: frozenset[str]) -> IsaFeatures:
        """Every feature whose flags (and whose base's) are all in `flags`."""
        present = {f for f in FEATURES if all(flag in flags for flag in FEATURE_FLAGS[f])}
        return cls(frozenset(f for f in present if EXTENSION_BASE.get(f, f) in present))

    @classmethod
    def parse(cls, text: str, what: str = "--cpu-isa") -> IsaFeatures:
        """A level name or features joined by "+" (ValueError naming `what` when neither)."""
        if text in LEVELS:
            return cls(frozenset(LEVELS[text]))
        names = text.split("+")
        unknown = [name for name in names if name not in FEATURES]
        if unknown or not text:
            raise ValueError(
                f"{what} {text!r}: expected auto, a level ({', '.join(LEVELS)}) or features joined by + "
                f"({', '.join(FEATURES)})"
            )
        features = set(names) | ({"avx2"} if "avx512" in names else set())
        for name in names:
            base = EXTENSION_BASE.get(name)
            if base is not None and base not in features:
                raise ValueError(f"{what} {text}: {name} needs {base} ({base}+{name})")
        return cls(frozenset(features))


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's flags (empty where /proc/cpuinfo has none)."""
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def choose_isa(flags: frozenset[str], forced: str | None, machine: str, what: str = "--cpu-isa") -> IsaFeatures:
    """The set to build for: everything the CPU has, or `forced` when the CPU has all of it ("auto",
    "" and None force nothing). `what` names the setting in errors."""
    forced = None if forced in (None, "", "auto") else forced
    if machine not in X86_MACHINES:
        if forced not in (None, "baseline"):
            raise ValueError(f"{what} {forced}: this is a {machine} CPU, only baseline applies")
        return IsaFeatures()
    best = IsaFeatures.of_cpu(flags)
    if forced is None:
        return best
    chosen = IsaFeatures.parse(forced, what)
    missing = sorted(chosen.required_flags() - flags)
    if missing:
        raise ValueError(f"{what} {forced}: this CPU lacks {', '.join(missing)} (it has {best.name})")
    return chosen


def resolve_cpu_isa(choice: str) -> str:
    """`--cpu-isa` on this machine, as the set's canonical name: "auto" becomes everything the CPU
    has; a feature it lacks is refused."""
    return choose_isa(cpu_flags(), choice, platform.machine()).name
