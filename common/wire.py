"""msgpack framing for typed messages, built on msgspec. No pickle anywhere: msgpack cannot
execute code, and nothing here generates code either.

A message is a `msgspec.Struct` subclass of `Message`, declared with its tag; a frame is
`msgpack([tag, field0, field1, ...])`, fields in declaration order (`array_like`). Each socket
decodes with a `Codec` built from the explicit, small set of message classes that socket carries
(a tagged union); an unknown tag, a malformed frame or a field of the wrong type raises
`WireError` (the receiving process answers or drops that frame, never crashes).

    class TokenizedReq(Message, tag=20):
        req_id: int
        input_ids: Int32Array       # raw little-endian int32 bytes on the wire
        params: SamplingParams      # a nested message (a Message without a tag): its field list

The field types a message may declare, and what travels for them (msgspec checks each one on
decode, so a forged frame fails in `Codec.decode`, never deep inside a process):

    int, float, str, bytes, bool     themselves (a float field takes an int and makes it a float;
                                     an int field refuses a bool)
    an IntEnum                       its int; decoding refuses a value the enum does not have
    a Message class                  its field list, without a tag
    list[X], tuple[X, ...]           a msgpack array, every element checked as X
    dict[str, X]                     a msgpack map with str keys
    X | None, X | Y                  msgspec's unions (at most one type of each msgpack kind)
    Any                              anything msgpack decodes, unchecked: the receiver validates it
                                     (a socket carrying Any fields carries no arrays)
    Int32Array, Int64Array,          a 1-D numpy array of exactly that dtype, as a msgpack ext
    Float32Array, BoolArray          whose code names the dtype and whose data is the array's raw
                                     little-endian bytes; decoded as a read-only np.frombuffer
                                     view (copy to mutate). A sender passes arrays of the declared
                                     dtype: the receiver refuses any other dtype, and a list.
"""

from __future__ import annotations

import re
from typing import Any, Union

import msgspec
import numpy as np
from msgspec.msgpack import Ext


class WireError(ValueError):
    """A frame that is not one of the messages this socket carries."""


class Message(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    """Base of every wire message. `class X(Message, tag=N)` travels on its own (a Codec lists
    it); without a tag a message travels only nested inside others. `gc=False`: a message is
    plain data that never refers back to itself, so the cycle collector need not track it."""


def tag_of(cls: type[Message]) -> int | None:
    """The tag a message class was declared with (None: it travels only nested)."""
    return cls.__struct_config__.tag


# ---- numpy arrays ----------------------------------------------------------------------------


class _ArrayType(type):
    """Metaclass of the array field types: `isinstance(a, Int32Array)` holds for an ndarray of
    int32. msgspec checks every decoded array against its field's declared type this way."""

    dtype: np.dtype
    ext_code: int

    def __instancecheck__(cls, obj: Any) -> bool:
        return type(obj) is np.ndarray and obj.dtype is cls.dtype  # decoded dtypes are numpy's canonical ones


class Int32Array(metaclass=_ArrayType):
    dtype, ext_code = np.dtype("<i4"), 1


class Int64Array(metaclass=_ArrayType):
    dtype, ext_code = np.dtype("<i8"), 2


class Float32Array(metaclass=_ArrayType):
    dtype, ext_code = np.dtype("<f4"), 3


class BoolArray(metaclass=_ArrayType):
    dtype, ext_code = np.dtype(np.bool_), 4


_ARRAY_TYPES = (Int32Array, Int64Array, Float32Array, BoolArray)
_EXT_CODE_BY_DTYPE = {t.dtype: t.ext_code for t in _ARRAY_TYPES}
_DTYPE_BY_EXT_CODE = {t.ext_code: t.dtype for t in _ARRAY_TYPES}


def _encode_array(obj: Any) -> Ext:
    """msgspec's enc_hook: the one type it does not know is a numpy array, sent flattened (the
    bytes of a tiny array are cheaper to copy than to reference)."""
    if type(obj) is not np.ndarray:
        raise NotImplementedError(f"{type(obj).__name__} cannot travel on the wire")
    try:
        return Ext(_EXT_CODE_BY_DTYPE[obj.dtype], obj.tobytes())
    except KeyError:
        raise TypeError(f"a wire array is int32, int64, float32 or bool, got {obj.dtype}") from None


def _decode_array(code: int, data: memoryview) -> np.ndarray:
    """msgspec's ext_hook: a read-only view of the array's bytes in the frame (no copy; keeping
    the array keeps the whole frame alive). msgspec then checks its dtype against the field's.
    Raises KeyError for an unknown code, ValueError for a length that is not whole items."""
    return np.frombuffer(data, _DTYPE_BY_EXT_CODE[code])


# ---- the codec -------------------------------------------------------------------------------


class Codec:
    """The messages one socket carries: encodes only those, decodes only those."""

    def __init__(self, *classes: type[Message]):
        self._by_tag: dict[int, type[Message]] = {}
        seen: set[type] = set()
        kinds: set[str] = set()
        for cls in classes:
            tag = tag_of(cls)
            if type(tag) is not int:
                raise ValueError(f"{cls.__name__} has no int tag: it only travels nested in other messages")
            if tag in self._by_tag:
                raise ValueError(f"tag {tag} used by both {self._by_tag[tag].__name__} and {cls.__name__}")
            self._by_tag[tag] = cls
            _check_declared(cls, seen, kinds)
        if kinds == {"any", "array"}:  # the ext hook would make arrays inside the unchecked values too
            raise ValueError("a socket carries Any fields or array fields, not both")
        self._classes = frozenset(classes)
        self._encoder = msgspec.msgpack.Encoder(enc_hook=_encode_array)
        # Without array fields an ext value stays a msgspec Ext (in an Any field, for its reader to refuse).
        ext_hook = _decode_array if "array" in kinds else None
        self._decoder = msgspec.msgpack.Decoder(Union[classes], ext_hook=ext_hook)  # noqa: UP007 (a runtime union of classes)

    def encode(self, msg: Message) -> bytes:
        if type(msg) not in self._classes:
            raise TypeError(f"{type(msg).__name__} is not carried by this socket")
        return self._encoder.encode(msg)

    def decode(self, frame: bytes) -> Message:
        try:
            return self._decoder.decode(frame)
        except msgspec.ValidationError as exc:
            raise WireError(_describe(self._message_of(frame), str(exc))) from None
        except (msgspec.DecodeError, RecursionError) as exc:
            raise WireError(f"undecodable frame ({len(frame)} bytes): {exc}") from None
        except ValueError as exc:  # from _decode_array, which msgspec does not wrap
            raise WireError(_describe(self._message_of(frame), f"an array's {exc}")) from None
        except KeyError as exc:
            raise WireError(_describe(self._message_of(frame), f"unknown ext type {exc}")) from None

    def _message_of(self, frame: bytes) -> type[Message] | None:
        """The class a frame's tag names, read again on the (slow) error path."""
        try:
            elements = msgspec.msgpack.decode(frame, type=list[msgspec.Raw])  # a frame is [tag, ...]
            tag = msgspec.msgpack.decode(elements[0], type=int) if elements else None
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return None
        return self._by_tag.get(tag)


def _check_declared(cls: type[Message], seen: set[type], kinds: set[str]) -> None:
    """Every list, tuple and dict field states its element type (msgspec would take a bare `list`
    as a list of anything, unchecked). Adds to `kinds` "any" and "array" for the fields seen."""
    if cls in seen:
        return
    seen.add(cls)
    for field in msgspec.structs.fields(cls):
        stack = [field.type]
        while stack:
            tp = stack.pop()
            if tp in (list, tuple, dict, set, frozenset):
                raise TypeError(f"{cls.__name__}.{field.name}: {tp.__name__} has no element type")
            if tp is Any:
                kinds.add("any")
            elif type(tp) is _ArrayType:
                kinds.add("array")
            elif isinstance(tp, type) and issubclass(tp, Message):
                _check_declared(tp, seen, kinds)
            stack.extend(a for a in getattr(tp, "__args__", ()) if a is not Ellipsis)


# ---- error messages that name the field --------------------------------------------------------

_AT = re.compile(r" - at (?:`key` in )?`\$([^`]*)`$")
_SEGMENT = re.compile(r"\[(\d+|\.\.\.)\]")
_QUOTED = re.compile(r"`[^`]*`")
_KIND = re.compile(r"\b(?:array|object|null)\b")  # msgspec says what JSON calls them
_PYTHON_KIND = {"array": "list", "object": "map", "null": "None"}


def _describe(cls: type[Message] | None, error: str) -> str:
    """msgspec's "Expected `int`, got `str` - at `$[2][0]`" as "Shape.ids[0]: Expected `int`, got
    `str`": the path's indices become the field names of the message the tag names, and msgpack's
    kinds get their Python names (list, map, None)."""
    match = _AT.search(error)
    without_path = error[: match.start()] if match else error
    what = _QUOTED.sub(lambda q: _KIND.sub(lambda m: _PYTHON_KIND[m.group(0)], q.group(0)), without_path)
    if cls is None:
        return f"malformed frame: {what}"
    if match is None:
        return f"malformed {cls.__name__}: {what}"
    where, tp, offset = cls.__name__, cls, 1  # in a tagged frame, element 0 is the tag
    for index in _SEGMENT.findall(match.group(1)):
        tp = _without_none(tp)
        if isinstance(tp, type) and issubclass(tp, Message) and index != "...":
            i = int(index) - offset
            if not 0 <= i < len(tp.__struct_fields__):
                return f"{where}: {what}" if i >= 0 else f"{where} tag: {what}"
            field = msgspec.structs.fields(tp)[i]
            where, tp = f"{where}.{field.name}", field.type
        else:
            args = getattr(tp, "__args__", ())
            element_tp = args[-1] if args and args[-1] is not Ellipsis else (args[0] if args else Any)
            where, tp = f"{where}[{index}]", element_tp
        offset = 0
    if "`key` in" in error:
        where += " (a key)"
    return f"{where}: {what}"


def _without_none(tp: Any) -> Any:
    args = [a for a in getattr(tp, "__args__", ()) if a is not type(None)]
    return args[0] if len(args) == 1 and type(None) in getattr(tp, "__args__", ()) else tp
