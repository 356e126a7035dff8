"""One checked value of config.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def config_field(raw: dict[str, Any], path: Path, keys: tuple[str, ...], default: Any, kind: type) -> Any:
    """The first of `keys` present (and not null) in config.json, checked to be of `kind`; `default`
    when none is (`...`: required, ValueError naming `path`)."""
    for key in keys:
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
            raise ValueError(f"{path}: {key!r} must be {kind.__name__}, got {value!r}")
        return kind(value)
    if default is ...:
        raise ValueError(f"{path}: missing {' / '.join(repr(k) for k in keys)}")
    return default
