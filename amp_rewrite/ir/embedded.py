"""An embedded tensor holds the values its type and shape claim, before anything reads it.

A model file is untrusted input: a tensor may declare dims of 2**40 elements over 16 bytes of raw
data, or a type its data field cannot hold. ``check`` refuses such a tensor in one line
(``ClaimMismatch``) when the model is loaded, so that no reader later allocates what the dims claim,
or fails inside numpy on what the data holds.
"""

from __future__ import annotations

import math

import onnx

from amp_rewrite.errors import UserError, printable
from amp_rewrite.ir.external import PER_BYTE, raw_size

_PAIRS = frozenset({onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128})
"""Types whose typed field holds two numbers per value."""


class ClaimMismatch(UserError):
    """An embedded tensor whose data is not what its type and shape claim."""


def check(tensor: onnx.TensorProto, where: str) -> None:
    """Refuse ``tensor`` (an initializer or a node's tensor attribute; ``where`` says which) unless
    its type is known and its raw data, or its typed field, holds exactly the values its dims claim."""
    name = printable(tensor.name)
    if any(d < 0 for d in tensor.dims):
        raise ClaimMismatch(f"{where} {name!r} has negative dims {list(tensor.dims)}")
    try:
        field = onnx.helper.tensor_dtype_to_field(tensor.data_type)
    except (KeyError, ValueError):
        raise ClaimMismatch(f"{where} {name!r} has an unknown element type {tensor.data_type}") from None
    count = math.prod(tensor.dims)
    if tensor.HasField("raw_data"):
        if tensor.data_type == onnx.TensorProto.STRING:
            raise ClaimMismatch(f"{where} {name!r} holds strings as raw data, which ONNX does not allow")
        held, needed = len(tensor.raw_data), raw_size(tensor)
        unit = "bytes"
    else:
        per = PER_BYTE.get(tensor.data_type)
        held = len(getattr(tensor, field))
        needed = -(-count // per) if per else count * (2 if tensor.data_type in _PAIRS else 1)
        unit = f"entries in {field}"
    if held != needed:
        raise ClaimMismatch(f"{where} {name!r} holds {held} {unit} where its type and shape {list(tensor.dims)} "
                            f"need {needed}")
