"""A model's IR version: the least its opsets need, and a serialized model declared at another.

onnx writes the newest IR version it knows by default, which can be newer than the installed
ONNX Runtime reads; a model that uses nothing of the newer versions runs there declared at an
older one. Declaring is done on the serialized bytes: a protobuf scalar field given twice takes
its last value, so one appended field re-declares the model without a copy of its weights.
"""

from __future__ import annotations

import onnx
from onnx import helper

_IR_VERSION_TAG = b"\x08"
"""ModelProto.ir_version is field 1, a varint: tag (1 << 3) | 0."""


def needed_ir_version(model: onnx.ModelProto) -> int:
    """The least IR version the model's opset imports need (3, the first with opsets, where onnx
    knows none of them)."""
    try:
        return helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    except Exception:  # an opset newer than this onnx knows: the runtime says whether it reads it
        return 3


def declared_at(serialized: bytes, version: int) -> bytes:
    """``serialized`` (a ModelProto) declared at IR ``version``."""
    return serialized + _IR_VERSION_TAG + _varint(version)


def declared_ir_version(serialized: bytes) -> int | None:
    """The IR version a serialized ModelProto declares where it leads with it, as onnx writes
    it (fields in number order); None otherwise."""
    if not serialized.startswith(_IR_VERSION_TAG):
        return None
    value = shift = 0
    for byte in serialized[1:11]:
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value
        shift += 7
    return None


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
