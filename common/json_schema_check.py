"""What a request's JSON schema may contain before the grammar compiler sees it.

xgrammar compiles most of JSON Schema, but some keywords it accepts without enforcing them: the
text would then follow a looser schema than the client gave, and fail the client's own
validation. A schema using one of them is refused naming it, as OpenAI's strict mode refuses what
it does not support. Found by compiling each keyword with a value that forbids a sample and
checking whether xgrammar still accepts the sample (xgrammar 0.2.8): `not`, `if`/`then`/`else`,
`allOf` of more than one schema, `contains` (and its min/max), `uniqueItems: true`,
`dependentRequired`, `dependentSchemas`, and a `$ref` to anything but this document (`#...`).

The shape is bounded too (RequestLimits): xgrammar's compile time grows steeply with nesting and
with the number of optional properties in one object, and one compile holds the compile thread.
"""

from __future__ import annotations

from typing import Any

from zserve.common.request_limits import LIMITS

NOT_ENFORCED = ("not", "if", "then", "else", "contains", "minContains", "maxContains", "dependentRequired",
                "dependentSchemas", "unevaluatedProperties", "unevaluatedItems")
SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")  # name -> schema
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUBSCHEMAS = ("items", "additionalProperties", "propertyNames", "additionalItems")


def check_json_schema(schema: Any) -> None:
    """Raise ValueError naming what makes `schema` unusable; `schema` is parsed JSON."""
    if _json_depth(schema) > 2 * LIMITS.max_schema_depth:  # containers anywhere (enum values, defaults) count too
        raise ValueError(f"json_schema nests deeper than {LIMITS.max_schema_depth} levels")
    stack: list[tuple[Any, str, int]] = [(schema, "#", 1)]
    while stack:
        node, path, depth = stack.pop()
        if depth > LIMITS.max_schema_depth:
            raise ValueError(f"json_schema nests deeper than {LIMITS.max_schema_depth} levels")
        if not isinstance(node, dict):
            continue  # true / false, or a value the compiler will name
        for keyword in NOT_ENFORCED:
            if keyword in node:
                raise ValueError(f"json_schema uses `{keyword}` at {path}, which this server cannot enforce")
        if node.get("uniqueItems") is True:
            raise ValueError(f"json_schema uses `uniqueItems` at {path}, which this server cannot enforce")
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
            raise ValueError(
                f"json_schema uses `allOf` of {len(node['allOf'])} schemas at {path}; this server enforces one only"
            )
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            raise ValueError(
                f"json_schema refers to {ref[:100]!r} at {path}; only references inside the schema (#...) can be used"
            )
        properties = node.get("properties")
        if isinstance(properties, dict) and len(properties) > LIMITS.max_schema_properties:
            raise ValueError(
                f"json_schema has an object with {len(properties)} properties at {path}; "
                f"at most {LIMITS.max_schema_properties}"
            )
        for key in SUBSCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack.extend((value, f"{path}/{key}/{name}", depth + 2) for name, value in node[key].items())
        for key in SUBSCHEMA_LISTS:
            if isinstance(node.get(key), list):
                stack.extend((value, f"{path}/{key}/{i}", depth + 2) for i, value in enumerate(node[key]))
        for key in SUBSCHEMAS:
            if key in node:
                stack.append((node[key], f"{path}/{key}", depth + 1))


def _json_depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest
