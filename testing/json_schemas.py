"""Random JSON schemas for structured-output tests and benchmarks: nested objects, arrays, enums,
required and optional fields, integers and numbers with bounds, bounded strings and booleans.

Every construct is bounded (string lengths, array sizes, nesting depth), so a model that follows
the grammar finishes in a few dozen tokens whatever it prefers.
"""

from __future__ import annotations

import random
from typing import Any

WORDS = ["name", "city", "color", "count", "price", "tags", "owner", "size", "items", "score", "open", "kind", "level", "note"]
ENUMS = [["red", "green", "blue"], ["small", "large"], ["yes", "no", "maybe"], ["north", "south", "east", "west"]]


def random_schemas(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` different schemas, each an object at the top (as `response_format` json_schema wants)."""
    rng = random.Random(seed)
    return [_object(rng, depth=0) for _ in range(count)]


def _object(rng: random.Random, depth: int) -> dict[str, Any]:
    names = rng.sample(WORDS, rng.randint(1, 3 if depth else 4))
    properties = {name: _value(rng, depth + 1) for name in names}
    required = [n for n in names if rng.random() < 0.7] or names[:1]
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _value(rng: random.Random, depth: int) -> dict[str, Any]:
    kinds = ["integer", "number", "enum", "string", "boolean"] + (["object", "array"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "object":
        return _object(rng, depth)
    if kind == "array":
        return {"type": "array", "items": _value(rng, depth + 1), "minItems": 1, "maxItems": rng.randint(1, 3)}
    if kind == "enum":
        return {"enum": rng.choice(ENUMS)}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(1, 100)}
    if kind == "number":
        return {"type": "number", "minimum": 0, "maximum": rng.choice([1, 10, 1000])}
    if kind == "string":
        return {"type": "string", "minLength": 1, "maxLength": rng.randint(4, 16)}
    return {"type": "boolean"}
