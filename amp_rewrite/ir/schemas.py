"""Which inputs and outputs of a node share a type parameter, from the ONNX op schemas
(ONNX Runtime's for its contrib ops, see ``ort_schemas``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import onnx
import onnx.defs
from onnx import TensorProto

from amp_rewrite.ir.ort_schemas import OrtSchema, ort_schema

_TYPE_NAMES: dict[int, str] = {
    value: f"tensor({name})"
    for name, value in (
        ("float", TensorProto.FLOAT), ("float16", TensorProto.FLOAT16), ("bfloat16", TensorProto.BFLOAT16),
        ("double", TensorProto.DOUBLE), ("int8", TensorProto.INT8), ("int16", TensorProto.INT16),
        ("int32", TensorProto.INT32), ("int64", TensorProto.INT64), ("uint8", TensorProto.UINT8),
        ("uint16", TensorProto.UINT16), ("uint32", TensorProto.UINT32), ("uint64", TensorProto.UINT64),
        ("bool", TensorProto.BOOL), ("string", TensorProto.STRING),
    )
}
_TYPE_CODES = {name: code for code, name in _TYPE_NAMES.items()}


def type_string(elem_type: int) -> str | None:
    return _TYPE_NAMES.get(elem_type)


@dataclass(frozen=True)
class Signature:
    """Type parameter (or fixed type string) of each actual input and output of a node."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    allowed: dict[str, frozenset[str]]

    def is_param(self, type_str: str) -> bool:
        return type_str in self.allowed

    def fixed_type(self, type_str: str) -> int | None:
        """The element type of a fixed formal such as ``tensor(int64)``, or of a type
        parameter that admits one type only (Shape's ``T1``)."""
        allowed = self.allowed.get(type_str)
        if allowed is not None and len(allowed) == 1:
            return _TYPE_CODES.get(next(iter(allowed)))
        return _TYPE_CODES.get(type_str)


@functools.cache
def signature(domain: str, op_type: str, opset: int, n_inputs: int, n_outputs: int) -> Signature | None:
    """The schema signature for a node, or None when no schema is known."""
    schema: onnx.defs.OpSchema | OrtSchema | None
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        schema = ort_schema(domain, op_type, opset)  # a contrib op: ONNX Runtime's schema
        if schema is None:
            return None
    allowed = {c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints}
    return Signature(
        inputs=_bind(schema.inputs, n_inputs),
        outputs=_bind(schema.outputs, n_outputs),
        allowed=allowed,
    )


def _bind(formals, count: int) -> tuple[str, ...]:
    if not formals:
        return ()
    last = len(formals) - 1
    return tuple(formals[min(i, last)].type_str for i in range(count))
