"""The low-precision target types and what fits in them."""

from __future__ import annotations

import enum
from functools import cached_property

import ml_dtypes
import numpy as np
from onnx import TensorProto


class Precision(str, enum.Enum):
    """A low-precision floating-point target."""

    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"

    @cached_property
    def onnx_type(self) -> int:
        return TensorProto.FLOAT16 if self is Precision.FLOAT16 else TensorProto.BFLOAT16

    @cached_property
    def numpy_type(self) -> np.dtype:
        return np.dtype(np.float16) if self is Precision.FLOAT16 else np.dtype(ml_dtypes.bfloat16)

    @cached_property
    def max(self) -> float:
        """Largest finite value."""
        return float(ml_dtypes.finfo(self.numpy_type).max)

    @cached_property
    def flush_below(self) -> float:
        """Magnitudes below this (half the smallest subnormal) round to zero."""
        return float(ml_dtypes.finfo(self.numpy_type).smallest_subnormal) / 2

    @cached_property
    def smallest_normal(self) -> float:
        """Below this, values are subnormal: fewer significant bits, down to one."""
        return float(ml_dtypes.finfo(self.numpy_type).smallest_normal)

    @cached_property
    def short(self) -> str:
        return "fp16" if self is Precision.FLOAT16 else "bf16"

    @cached_property
    def schema_type(self) -> str:
        """The type string ONNX schemas and kernel tables use."""
        return f"tensor({self.value})"

