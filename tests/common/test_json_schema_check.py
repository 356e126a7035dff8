"""The JSON schema check refuses what xgrammar would accept without enforcing (naming it and where)
and shapes too costly to compile, and passes the schemas real tools send (pydantic's, OpenAI's)."""

from __future__ import annotations

import pytest

from testing.json_schemas import random_schemas
from zserve.common.json_schema_check import check_json_schema

REFUSED = [
    ({"not": {"type": "string"}}, r"`not` at #,"),
    ({"type": "object", "properties": {"a": {"if": {"type": "string"}, "then": {"minLength": 3}}}}, r"`if` at #/properties/a"),
    ({"type": "array", "items": {"type": "array", "contains": {"const": 5}}}, r"`contains` at #/items"),
    ({"type": "array", "uniqueItems": True}, "`uniqueItems`"),
    ({"anyOf": [{"type": "object", "dependentRequired": {"a": ["b"]}}]}, r"`dependentRequired` at #/anyOf/0"),
    ({"allOf": [{"type": "string"}, {"maxLength": 1}]}, "`allOf` of 2 schemas"),
    ({"$ref": "http://example.com/s.json"}, "only references inside the schema"),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(300)}}, "300 properties"),
    ({"$defs": {"A": {"not": {}}}, "$ref": "#/$defs/A"}, r"`not` at #/\$defs/A"),
]


@pytest.mark.parametrize(("schema", "needle"), REFUSED, ids=[n for _, n in REFUSED])
def test_refused_with_the_keyword_and_its_place(schema, needle):
    with pytest.raises(ValueError, match=needle):
        check_json_schema(schema)


def test_depth_is_bounded_anywhere_in_the_document():
    deep = {"type": "string"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(ValueError, match="nests deeper than 64 levels"):
        check_json_schema(deep)
    nested_enum: list = ["x"]
    for _ in range(200):
        nested_enum = [nested_enum]
    with pytest.raises(ValueError, match="nests deeper"):
        check_json_schema({"enum": [nested_enum]})


ACCEPTED = [
    # pydantic v2: a nested model by $ref, a described field wrapped in a one-schema allOf, Optional as anyOf with null
    {"$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "title": "Address"}},
     "type": "object", "properties": {"home": {"allOf": [{"$ref": "#/$defs/Address"}], "description": "where"},
                                      "age": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}},
     "required": ["home"], "title": "Person"},
    # a property named like a keyword is a name, not the keyword
    {"type": "object", "properties": {"not": {"type": "string"}, "if": {"type": "integer"}}, "required": ["not"]},
    {"type": "array", "uniqueItems": False, "items": {"type": "integer"}},
    True,
]


@pytest.mark.parametrize("schema", ACCEPTED + random_schemas(30))
def test_real_and_generated_schemas_pass(schema):
    check_json_schema(schema)
