"""msgpack framing for typed messages. No pickle anywhere: msgpack cannot execute code.

A message is a dataclass declared with `@message(tag)`; a frame is `msgpack([tag, field0, field1,
...])`, fields in declaration order. Each socket decodes with a `Codec` built from the explicit,
small set of message classes that socket carries; an unknown tag or a malformed frame raises
`WireError` (the receiving process answers or drops that frame, never crashes).

    @message(20)
    class TokenizedReq:
        req_id: int
        input_ids: Int32Array       # raw little-endian int32 bytes on the wire
        params: SamplingParams      # a nested message (declared with @message()): its field list

The field types a message may declare, and what travels for them:

    int, float, str, bytes, bool     themselves (a float field takes an int and makes it a float)
    an IntEnum                       its int; decoding refuses a value the enum does not have
    a @message class                 its field list, without a tag
    list[X], tuple[X, ...]           a msgpack array, every element checked as X
    dict[str, X]                     a msgpack map with str keys
    X | None, X | Y                  the first alternative that accepts the value
    Any                              anything msgpack decodes, unchecked: the receiver validates it
    Int32Array, Int64Array,          a 1-D numpy array as raw little-endian bytes, decoded as a
    Float32Array, BoolArray          read-only np.frombuffer view of the frame (copy to mutate)

A bare `list` or `dict` is refused when the class is declared: every element type is stated.
Decoding checks every field against its type, so a forged frame fails in `Codec.decode`, never
deep inside a process.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Annotated, Any, NamedTuple, Protocol, Union, get_args, get_origin, get_type_hints

import msgpack
import numpy as np

from zserve.common.array_codec import pack_array, unpack_array


class WireError(ValueError):
    """A frame that is not one of the messages this socket carries."""


class WireMessage(Protocol):
    TAG: int | None

    def to_wire(self) -> list[Any]: ...

    @classmethod
    def from_wire(cls, fields: list[Any]) -> WireMessage: ...


@dataclass(frozen=True, slots=True)
class ArrayOf:
    """Annotation marker: a 1-D numpy array of `dtype`, sent as its raw bytes."""

    dtype: np.dtype


Int32Array = Annotated[np.ndarray, ArrayOf(np.dtype("<i4"))]
Int64Array = Annotated[np.ndarray, ArrayOf(np.dtype("<i8"))]
Float32Array = Annotated[np.ndarray, ArrayOf(np.dtype("<f4"))]
BoolArray = Annotated[np.ndarray, ArrayOf(np.dtype(np.bool_))]

Encode = Callable[[Any], Any]
Decode = Callable[[Any], Any]  # raises TypeError / ValueError for a value of the wrong type


class FieldCodec(NamedTuple):
    """How one field travels. `decode` alone defines the check; `dtype` and `exact` let the
    compiled `from_wire` do the commonest fields inline instead of calling `decode`."""

    encode: Encode | None  # None: msgpack packs the value as it is
    decode: Decode
    dtype: np.dtype | None = None  # an array: pack_array / unpack_array with this dtype
    exact: type | None = None  # a msgpack scalar that decodes as itself: `type(v) is exact`
    optional: bool = False  # with `exact`: None is accepted too


def message(tag: int | None = None):
    """Class decorator: a dataclass (made one with slots=True if it is not one already) sent as
    `[tag, *fields in declaration order]`. Without a tag the class travels only nested inside
    other messages. Adds `TAG`, `to_wire()` and `from_wire(list)`."""

    def wrap(cls):
        if not dataclasses.is_dataclass(cls):
            cls = dataclass(slots=True)(cls)
        hints = get_type_hints(cls, include_extras=True)
        names = tuple(f.name for f in dataclasses.fields(cls))
        if not names:
            raise TypeError(f"message {cls.__name__} has no fields")
        codecs = []
        for name in names:
            try:
                codecs.append(_codec(hints[name]))
            except TypeError as exc:
                raise TypeError(f"{cls.__name__}.{name}: {exc}") from None
        to_wire, from_wire = _compile(names, codecs)
        cls.TAG = tag
        cls.to_wire = to_wire
        cls.from_wire = classmethod(from_wire)
        return cls

    return wrap


class Codec:
    def __init__(self, *classes: type[WireMessage]):
        self._by_tag: dict[int, type[WireMessage]] = {}
        for cls in classes:
            if cls.TAG is None:
                raise ValueError(f"{cls.__name__} has no tag: it only travels nested in other messages")
            if cls.TAG in self._by_tag:
                raise ValueError(f"tag {cls.TAG} used by both {self._by_tag[cls.TAG].__name__} and {cls.__name__}")
            self._by_tag[cls.TAG] = cls

    def encode(self, msg: WireMessage) -> bytes:
        if self._by_tag.get(msg.TAG) is not type(msg):
            raise TypeError(f"{type(msg).__name__} is not carried by this socket")
        return msgpack.packb([msg.TAG, *msg.to_wire()], use_bin_type=True)

    def decode(self, frame: bytes) -> WireMessage:
        try:
            obj = msgpack.unpackb(frame, raw=False, strict_map_key=False)
        except (msgpack.UnpackException, ValueError, TypeError) as exc:
            raise WireError(f"undecodable frame ({len(frame)} bytes): {exc}") from exc
        if not isinstance(obj, list) or not obj or type(obj[0]) is not int:
            raise WireError(f"frame is not a tagged message list: {type(obj).__name__}")
        cls = self._by_tag.get(obj[0])
        if cls is None:
            raise WireError(f"unknown message tag {obj[0]}")
        try:
            return cls.from_wire(obj[1:])
        except WireError:
            raise
        except (IndexError, TypeError, ValueError, KeyError) as exc:
            raise WireError(f"malformed {cls.__name__}: {exc}") from exc


# ---- field codecs ----------------------------------------------------------------------------


def _codec(tp: Any) -> FieldCodec:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        marker = next((a for a in args[1:] if isinstance(a, ArrayOf)), None)
        if marker is None:
            raise TypeError(f"{tp!r} has no ArrayOf marker")
        return FieldCodec(*_array_codec(marker.dtype), dtype=marker.dtype)
    if origin is Union or origin is types.UnionType:
        return _union_codec(args)
    if origin is list or origin is tuple:
        if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):
            raise TypeError(f"a tuple field is tuple[X, ...], got {tp!r}")
        element = _codec(args[0])
        return _sequence_codec(origin, element.encode, element.decode)
    if origin is dict:
        if args[0] is not str:
            raise TypeError(f"a dict field has str keys, got {tp!r}")
        value = _codec(args[1])
        return _dict_codec(value.encode, value.decode)
    if origin is None and tp is Any:
        return FieldCodec(None, _any)
    if origin is None and tp is float:
        return FieldCodec(None, _float)
    if origin is None and tp in (int, str, bytes, bool, type(None)):
        return FieldCodec(None, _exact_decoder(tp), exact=tp)
    if isinstance(tp, type) and issubclass(tp, IntEnum):
        return FieldCodec(None, _enum_decoder(tp, optional=False))
    if isinstance(tp, type) and hasattr(tp, "from_wire"):
        return FieldCodec(tp.to_wire, _nested_decoder(tp))
    raise TypeError(f"{tp!r} cannot travel on the wire (a list or dict needs its element type)")


def _expected(what: str, value: Any) -> TypeError:
    return TypeError(f"expected {what}, got {type(value).__name__}")


def _exact_decoder(kind: type, optional: bool = False) -> Decode:
    """int, str, bytes, bool: the value must be of exactly that type (so a bool is not an int)."""

    def decode(v: Any) -> Any:
        if type(v) is not kind and not (optional and v is None):
            raise _expected(kind.__name__, v)
        return v

    return decode


def _float(v: Any) -> float:
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v)
    raise _expected("float", v)


def _any(v: Any) -> Any:
    return v


def _array_codec(dtype: np.dtype) -> tuple[Encode, Decode]:
    def encode(arr: np.ndarray) -> bytes:
        return pack_array(arr, dtype)

    def decode(raw: Any) -> np.ndarray:
        return unpack_array(raw, dtype)

    return encode, decode


def _enum_decoder(enum: type[IntEnum], optional: bool) -> Decode:
    members = {int(m): m for m in enum}

    def decode(v: Any) -> IntEnum | None:
        member = members.get(v) if type(v) is int else None
        if member is not None or (optional and v is None):
            return member
        raise ValueError(f"{v!r} is not a {enum.__name__}") if type(v) is int else _expected(enum.__name__, v)

    return decode


def _nested_decoder(cls: type) -> Decode:
    def decode(v: Any) -> Any:
        if type(v) is not list:
            raise _expected(f"a {cls.__name__} field list", v)
        return cls.from_wire(v)

    return decode


def _sequence_codec(kind: type, enc: Encode | None, dec: Decode) -> FieldCodec:
    def decode(v: Any) -> Any:
        if type(v) is not list:
            raise _expected("a list", v)
        items = [dec(x) for x in v]
        return items if kind is list else tuple(items)

    return FieldCodec(None if enc is None else lambda v: [enc(x) for x in v], decode)


def _dict_codec(enc: Encode | None, dec: Decode) -> FieldCodec:
    def decode(v: Any) -> dict[str, Any]:
        if type(v) is not dict:
            raise _expected("a map", v)
        if not all(type(k) is str for k in v):
            raise TypeError("map keys must be strings")
        return {k: dec(x) for k, x in v.items()}

    return FieldCodec(None if enc is None else lambda v: {k: enc(x) for k, x in v.items()}, decode)


def _union_codec(alternatives: tuple[Any, ...]) -> FieldCodec:
    optional = type(None) in alternatives
    others = [a for a in alternatives if a is not type(None)]
    if len(others) == 1 and optional:  # X | None: the common case, and X may need encoding
        (alt,) = others
        if isinstance(alt, type) and issubclass(alt, IntEnum):
            return FieldCodec(None, _enum_decoder(alt, optional=True))
        enc, dec, _, exact, _ = _codec(alt)
        if exact is not None:
            return FieldCodec(None, _exact_decoder(exact, optional=True), exact=exact, optional=True)
        return FieldCodec(None if enc is None else lambda v: None if v is None else enc(v), lambda v: None if v is None else dec(v))
    codecs = [_codec(a) for a in others]
    if any(c.encode is not None for c in codecs):
        raise TypeError(f"a union of several types takes msgpack-native types only, got {alternatives!r}")
    decoders = [c.decode for c in codecs]
    names = " | ".join(getattr(a, "__name__", repr(a)) for a in alternatives)

    def decode(v: Any) -> Any:
        if v is None and optional:
            return None
        for dec in decoders:
            try:
                return dec(v)
            except (TypeError, ValueError):
                pass
        raise _expected(names, v)

    return FieldCodec(None, decode)


def _compile(names: tuple[str, ...], codecs: list[FieldCodec]) -> tuple[Callable, Callable]:
    """`to_wire` and `from_wire` as straight-line code, one expression per field (the way
    dataclasses writes `__init__`), so that the hot messages (ForwardBatch every step, one
    TokenOut per request per step) cost what hand-written code would. Field names are
    identifiers, and every value is reached through `env`, never pasted into the source.

    from_wire checks scalar fields inline, all in one condition, and calls `decode` for the
    rest; when anything fails, `_first_bad_field` finds and names the field."""
    env: dict[str, Any] = {
        "WireError": WireError, "pack_array": pack_array, "unpack_array": unpack_array,
        "first_bad_field": _first_bad_field, "names": names, "decoders": tuple(c.decode for c in codecs),
    }
    encoded, checks, decoded = [], [], []
    for i, (name, codec) in enumerate(zip(names, codecs, strict=True)):
        v = f"v{i}"
        if codec.dtype is not None:
            env[f"dtype_{i}"] = codec.dtype
            encoded.append(f"pack_array(self.{name}, dtype_{i})")
            decoded.append(f"unpack_array({v}, dtype_{i})")
            continue
        if codec.encode is None:
            encoded.append(f"self.{name}")
        else:
            env[f"encode_{i}"] = codec.encode
            encoded.append(f"encode_{i}(self.{name})")
        if codec.exact is not None:
            env[f"exact_{i}"] = codec.exact
            checks.append(f"({v} is None or type({v}) is exact_{i})" if codec.optional else f"type({v}) is exact_{i}")
            decoded.append(v)
        else:
            env[f"decode_{i}"] = codec.decode
            decoded.append(f"decode_{i}({v})")
    n = len(names)
    check = f"""
        if not ({" and ".join(checks)}):
            raise TypeError""" if checks else ""
    source = f"""
def to_wire(self):
    return [{", ".join(encoded)}]

def from_wire(cls, values):
    if type(values) is not list or len(values) != {n}:
        got = f"{{len(values)}} fields" if type(values) is list else type(values).__name__
        raise WireError(f"{{cls.__name__}} takes {n} fields, got {{got}}")
    {", ".join(f"v{i}" for i in range(n))}, = values
    try:{check}
        return cls({", ".join(decoded)})
    except (TypeError, ValueError):
        raise WireError(first_bad_field(cls.__name__, names, decoders, values)) from None
"""
    exec(source, env)
    return env["to_wire"], env["from_wire"]


def _first_bad_field(cls_name: str, names: tuple[str, ...], decoders: tuple[Decode, ...], values: list[Any]) -> str:
    """The slow path after a failed decode: which field, and why."""
    for name, dec, value in zip(names, decoders, values, strict=True):
        try:
            dec(value)
        except (TypeError, ValueError) as exc:
            return f"{cls_name}.{name}: {exc}"
    return f"{cls_name}: undecodable"
