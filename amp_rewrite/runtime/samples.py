"""Input samples for running a model: read from .npz files, or generated to fit its inputs.

Generated inputs respect each input's element type and shape: a dimension with a
name (``batch``, ``seq``) takes one value shared by every input that names it,
``shapes`` fixes an input's shape outright, and integer inputs are drawn from a
range that indexes whatever they index (a token id feeding an embedding Gather
stays below the vocabulary size; an input named like a mask is all ones).
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from amp_rewrite.errors import UserError
from amp_rewrite.ir.graph import ModelIndex

Sample = dict[str, np.ndarray]

NAMED_DIM = 8
"""Extent given to a named (symbolic) dimension that no ``shapes`` entry fixes."""
UNNAMED_DIM = 1
INTEGER_HIGH = 4
"""Integer inputs that index nothing known are drawn from [0, INTEGER_HIGH)."""
MASK_NAME = re.compile(r"mask", re.IGNORECASE)
# Inputs of these ops index the first dimension of the op's data input.
_INDEXING = {("Gather", 1): 0, ("GatherElements", 1): 0, ("GatherND", 1): 0}
# Integer inputs reach an indexing op through these type-preserving ops.
_PASS_THROUGH = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand",
                           "Transpose"})


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME:DIMS`` with DIMS like ``1x128`` or ``1,128`` -> (name, dims)."""
    name, sep, dims = text.rpartition(":")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in re.split(r"[x,]", dims) if d != "")
        if any(d < 0 for d in shape):
            raise ValueError
    except ValueError:
        raise UserError(f"bad --shape {text!r}: expected NAME:DIMS such as input_ids:1x128") from None
    return name, shape


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an .npz file, by name; a clear error for a missing or unreadable file."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except FileNotFoundError:
        raise UserError(f"data file not found: {path}") from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise UserError(f"not a readable .npz file: {path} ({type(exc).__name__})") from None


def load_npz(path: str | os.PathLike, model: onnx.ModelProto) -> Sample:
    """One sample from an .npz file keyed by input name, checked against the model's inputs."""
    return checked(read_npz(path), model, str(path))


def resolve(items: Iterable, model: onnx.ModelProto) -> list[Sample]:
    """Samples from .npz paths or dicts of arrays, checked against the model's inputs."""
    return [checked(item, model) if isinstance(item, Mapping) else load_npz(item, model) for item in items]


def checked(sample: Mapping[str, np.ndarray], model: onnx.ModelProto, origin: str = "input data") -> Sample:
    """The sample cast to the model's input types; UserError on a missing, unknown or misshaped input."""
    inputs = graph_inputs(model)
    unknown = sorted(set(sample) - set(inputs))
    if unknown:
        raise UserError(f"{origin}: {', '.join(unknown)} not among the model inputs ({', '.join(inputs)})")
    missing = [n for n in inputs if n not in sample]
    if missing:
        raise UserError(f"{origin}: no data for model input(s) {', '.join(missing)}")
    result = {}
    for name, info in inputs.items():
        array = np.asarray(sample[name])
        dims = info.type.tensor_type.shape.dim
        if info.type.tensor_type.HasField("shape") and (
            len(dims) != array.ndim
            or any(_fixed(d) is not None and _fixed(d) != n for d, n in zip(dims, array.shape))
        ):
            raise UserError(f"{origin}: input {name!r} has shape {list(array.shape)}, the model expects "
                            f"{_shape_text(dims)}")
        result[name] = array.astype(_numpy_type(info.type.tensor_type.elem_type), copy=False)
    return result


def generate(model: onnx.ModelProto, count: int = 1, shapes: Mapping[str, Sequence[int]] | None = None,
             seed: int = 0) -> list[Sample]:
    """``count`` generated samples for the model's inputs (see the module docstring)."""
    shapes = dict(shapes or {})
    inputs = graph_inputs(model)
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise UserError(f"--shape names {', '.join(unknown)}, not among the model inputs ({', '.join(inputs)})")
    highs = integer_ranges(model)
    named: dict[str, int] = {}
    rng = np.random.default_rng(seed)
    plans = {name: (_shape(info, shapes.get(name), named), _numpy_type(info.type.tensor_type.elem_type))
             for name, info in inputs.items()}
    return [{name: _draw(rng, name, shape, dtype, highs.get(name)) for name, (shape, dtype) in plans.items()}
            for _ in range(count)]


def graph_inputs(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """The model's real inputs (initializers listed as inputs excluded)."""
    weights = {t.name for t in model.graph.initializer}
    return {vi.name: vi for vi in model.graph.input if vi.name not in weights}


def integer_ranges(model: onnx.ModelProto) -> dict[str, int]:
    """For integer inputs that (through shape-only ops) index an initializer: its first dimension."""
    index = ModelIndex(model)
    highs: dict[str, int] = {}
    for name in graph_inputs(model):
        value = index.values.get((0, name))
        frontier, seen = [value] if value else [], set()
        while frontier:
            current = frontier.pop()
            for node_id, slot in current.uses:
                node = index.nodes[node_id]
                axis = _INDEXING.get((node.op_type, slot))
                data = index.values.get(node.inputs[0]) if axis is not None and node.inputs[0] else None
                if data is not None and data.shape and isinstance(data.shape[axis], int) and data.shape[axis] > 0:
                    highs[name] = min(highs.get(name, data.shape[axis]), data.shape[axis])
                elif node.op_type in _PASS_THROUGH and slot == 0 and node.outputs[0] not in seen:
                    seen.add(node.outputs[0])
                    frontier.append(index.values[node.outputs[0]])
    return highs


def _shape(info: onnx.ValueInfoProto, fixed: Sequence[int] | None, named: dict[str, int]) -> tuple[int, ...]:
    if fixed is not None:
        return tuple(fixed)
    tensor_type = info.type.tensor_type
    if not info.type.HasField("tensor_type"):
        raise UserError(f"input {info.name!r} is not a tensor; pass its data with --inputs")
    shape = []
    for d in tensor_type.shape.dim:
        if _fixed(d) is not None:
            shape.append(d.dim_value)
        elif d.dim_param:
            shape.append(named.setdefault(d.dim_param, NAMED_DIM))
        else:
            shape.append(UNNAMED_DIM)
    return tuple(shape)


def _draw(rng: np.random.Generator, name: str, shape: tuple[int, ...], dtype: np.dtype, high: int | None):
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if MASK_NAME.search(name) and dtype.kind in "biu":
        return np.ones(shape, dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(0, high or INTEGER_HIGH, shape).astype(dtype)
    raise UserError(f"cannot generate data for input {name!r} of type {dtype}; pass it with --inputs")


def _numpy_type(elem_type: int) -> np.dtype:
    if elem_type == TensorProto.BFLOAT16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        raise UserError(f"unsupported input element type {elem_type}") from None


def _fixed(dim) -> int | None:
    """A dimension's fixed extent; None for a name, nothing, or the -1 some exporters write for
    a dynamic dimension."""
    return dim.dim_value if dim.HasField("dim_value") and dim.dim_value >= 0 else None


def _shape_text(dims: Iterable) -> str:
    return "[" + ", ".join(str(_fixed(d)) if _fixed(d) is not None else (d.dim_param or "?")
                           for d in dims) + "]"
