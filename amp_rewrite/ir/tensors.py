"""Reading tensor data (embedded or external) and judging whether it fits a precision."""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import AttributeProto, numpy_helper

from amp_rewrite.errors import UserError, printable
from amp_rewrite.ir import external
from amp_rewrite.ir.precision import Precision

SOURCE_TYPE_KEY = "amp_rewrite.source_type"
"""Marks an external tensor whose bytes are still float32, to be converted when saved."""


def external_location(tensor: onnx.TensorProto) -> dict[str, str] | None:
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    return {e.key: e.value for e in tensor.external_data}


def data_file(tensor: onnx.TensorProto) -> str | None:
    """The file an external tensor's data lies in (``external_location``'s "location", without
    the rest: asked of every tensor, where thousands are borrowed); None for an embedded one."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    return next((e.value for e in tensor.external_data if e.key == "location"), None)


def read_array(tensor: onnx.TensorProto, base_dir: str | os.PathLike | None) -> np.ndarray:
    """The tensor's values; external data is read with one positioned read, not mapped."""
    info = external_location(tensor)
    if info is None:
        if tensor.raw_data and tensor.data_type == onnx.TensorProto.FLOAT:  # the common case, without copies
            return np.frombuffer(tensor.raw_data, dtype=np.float32).reshape(tuple(tensor.dims))
        return numpy_helper.to_array(tensor)
    return stored_values(tensor, base_dir, tensor.data_type, info).reshape(tuple(tensor.dims))


def stored_values(tensor: onnx.TensorProto, base_dir: str | os.PathLike | None, data_type: int,
                  info: dict[str, str]) -> np.ndarray:
    """An external tensor's values (``info``: its ``external_location``) as its file stores
    them, in ``data_type`` (flat)."""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(data_type)
    return np.frombuffer(external_bytes(tensor, base_dir, info, math.prod(tensor.dims) * dtype.itemsize), dtype=dtype)


def external_bytes(tensor: onnx.TensorProto, base_dir: str | os.PathLike | None, info: dict[str, str],
                 size: int) -> bytes:
    """``size`` bytes of an external tensor's file from its offset, the file opened once
    ``external.resolve`` allowed it."""
    location = info.get("location", "")
    path = os.path.join(base_dir or ".", location)
    offset = int(info.get("offset") or 0)  # ``external.extent`` checked it when the model was loaded
    try:
        data = _DATA_FILES.read(path, offset, size, lambda: external.resolve(base_dir, location, tensor.name))
    except OSError as exc:
        raise UserError(f"cannot read external data of tensor {printable(tensor.name)!r}: {exc.strerror}: "
                        f"{path}") from None
    if len(data) != size:
        raise UserError(f"external data of tensor {printable(tensor.name)!r} is truncated: {path}")
    return data


def close_data_file(path: str | os.PathLike) -> None:
    """Close the descriptor kept for ``path``, if any: the next read opens the file as it is
    then. A model's load calls this for each file its external data lies in (a descriptor kept
    from an earlier read may be of a file since replaced), ``convert`` once it has written its
    output (a deleted input's space is freed)."""
    _DATA_FILES.forget(os.fspath(path))


class _DataFiles:
    """Open descriptors of external data files, read with positioned reads (which share no
    file offset, with other threads or a forked child), each with the last megabyte read
    ahead: a model's thousands of small external tensors, each read with an open, a seek and a
    close, would cost a system call or three each, where ``pread`` on one descriptor costs
    one, and fewer again where they lie in order. A few files are kept open,
    the least recently read closed first, each under its absolute path (readers name a file
    from the model's folder, which callers may spell relative)."""

    KEPT = 8
    AHEAD = 1 << 20

    def __init__(self) -> None:
        self._open: OrderedDict[str, _DataFile] = OrderedDict()
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def read(self, path: str, offset: int, size: int, allowed: Callable[[], str]) -> bytes:
        """``size`` bytes at ``offset`` of the file ``path``; ``allowed()`` (the path once checked,
        or an error) is asked whenever the file is opened: a kept descriptor is of a file that was."""
        if not hasattr(os, "pread"):  # no positioned reads (Windows): a file of its own
            with open(allowed(), "rb") as f:
                f.seek(offset)
                return f.read(size)
        path = os.path.abspath(path)
        with self._lock:  # held while reading: a descriptor is closed only when no read uses it
            kept = self._open.pop(path, None) or _DataFile(os.open(allowed(), os.O_RDONLY | _NO_FOLLOW))
            self._open[path] = kept
            while len(self._open) > self.KEPT:
                os.close(self._open.popitem(last=False)[1].fd)
            return kept.read(offset, size, self.AHEAD)

    def forget(self, path: str) -> None:
        with self._lock:
            kept = self._open.pop(os.path.abspath(path), None)
            if kept is not None:
                os.close(kept.fd)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # a thread of the parent may have held it at the fork


_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)
"""A link put in the checked file's place between the check and the open is refused, not followed."""


class _DataFile:
    """A descriptor and the bytes last read ahead from it (``start``: where they begin)."""

    __slots__ = ("fd", "start", "ahead")

    def __init__(self, fd: int) -> None:
        self.fd, self.start, self.ahead = fd, 0, b""

    def read(self, offset: int, size: int, ahead: int) -> bytes:
        if size >= ahead:
            return self._pread(offset, size)
        if not (self.start <= offset and offset + size <= self.start + len(self.ahead)):
            self.start, self.ahead = offset, self._pread(offset, ahead)
        return self.ahead[offset - self.start:offset - self.start + size]

    def _pread(self, offset: int, size: int) -> bytes:
        chunks = []
        while size > 0:  # one read returns at most about 2 GiB
            chunk = os.pread(self.fd, size, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
            size -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_DATA_FILES = _DataFiles()


def convert_embedded(tensor: onnx.TensorProto, precision: Precision) -> None:
    """Convert a float32 tensor held in the model to ``precision`` in place: its values become
    ``raw_data`` of the new type; its name, shape and other fields stay."""
    data = read_array(tensor, None).astype(precision.numpy_type)
    tensor.ClearField("float_data")
    tensor.data_type = precision.onnx_type
    tensor.raw_data = data.tobytes()


@dataclass(frozen=True)
class Fit:
    """Whether float32 values survive conversion to a low precision, and why not."""

    max_abs: float
    lost_share: float
    """The share of the L2 norm in nonzero values that flush to zero; where it is certainly below
    a tenth of the threshold, an upper bound (what flushes over the largest value): nonzero
    exactly when something flushes."""
    problem: str | None


def value_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes of a tensor's values, from its shape and element type (0 for strings), without
    reading its data (``raw_data`` is copied out on each read)."""
    return 0 if tensor.data_type == onnx.TensorProto.STRING else external.raw_size(tensor)


def judge_fit(array: np.ndarray, precision: Precision, underflow_share: float) -> Fit:
    """``judge_tensors`` for one array."""
    return _judge_flat(np.array(array, dtype=np.float32).reshape(-1), [array.size], precision, underflow_share)[0]


BOUND_MARGIN = 0.1
"""Where what flushes is below this share of the threshold against the largest value alone, the
exact norm (a float64 pass over the tensor) is not computed."""
BATCH_ELEMENTS = 1 << 20
"""Small tensors are judged together, in batches of about this many elements."""


def judge_tensors(tensors: Iterable[onnx.TensorProto], base_dir: str | os.PathLike | None, precision: Precision,
                  underflow_share: float) -> Iterator[Fit]:
    """Whether each float32 tensor fits ``precision``. Overflow: any finite |x| above the
    type's max. Underflow: the values that round to zero carry more than ``underflow_share``
    of the tensor's L2 norm (a lone epsilon of 1e-12 loses all of it; a few tiny weights
    among normal ones, nothing). Tensors are read lazily and judged in batches with
    segmented reductions: one numpy pass for thousands of small tensors, bounded memory
    for large ones."""
    chunks: list[np.ndarray] = []
    sizes: list[int] = []
    count = 0
    for tensor in tensors:
        data = float32_values(tensor, base_dir)
        chunks.append(data)
        sizes.append(data.size)
        count += sizes[-1]
        if count >= BATCH_ELEMENTS:
            yield from _judge_flat(_joined(chunks), sizes, precision, underflow_share)
            chunks, sizes, count = [], [], 0
    if chunks:
        yield from _judge_flat(_joined(chunks), sizes, precision, underflow_share)


def _joined(chunks: list[np.ndarray]) -> np.ndarray:
    """The chunks end to end: a large tensor alone is not copied (``_judge_flat`` copies it as it
    takes absolute values)."""
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)


def float32_values(tensor: onnx.TensorProto, base_dir: str | os.PathLike | None) -> np.ndarray:
    """A float32 tensor's values, flat (embedded raw data without the copies and reshape of ``read_array``)."""
    if tensor.data_type == onnx.TensorProto.FLOAT and tensor.data_location != onnx.TensorProto.EXTERNAL:
        raw = tensor.raw_data
        if raw:
            return np.frombuffer(raw, dtype=np.float32)
    return np.ravel(read_array(tensor, base_dir)).astype(np.float32, copy=False)


def _judge_flat(flat: np.ndarray, sizes: list[int], precision: Precision, underflow_share: float) -> list[Fit]:
    """Judge the tensors of ``sizes`` elements laid end to end in ``flat`` (overwritten where it
    is writable)."""
    if not flat.size:
        return [Fit(0.0, 0.0, None) for _ in sizes]
    flat = np.abs(flat, out=flat if flat.flags.writeable else None)
    starts = np.concatenate([[0], np.cumsum([n for n in sizes if n])[:-1]])
    ends = np.append(starts[1:], len(flat))
    maxima = np.maximum.reduceat(flat, starts)
    if not np.isfinite(maxima).all():  # a NaN or inf in some tensor: stays so in any float type; judge the rest
        flat[~np.isfinite(flat)] = 0
        maxima = np.maximum.reduceat(flat, starts)
    lost = np.zeros(len(starts))
    tiny = np.flatnonzero((flat < precision.flush_below) & (flat > 0))
    segments, firsts = np.unique(np.searchsorted(starts, tiny, side="right") - 1, return_index=True)
    for segment, first, last in zip(segments.tolist(), firsts.tolist(), [*firsts[1:].tolist(), len(tiny)]):
        flushed = float(np.square(flat[tiny[first:last]], dtype=np.float64).sum())
        largest = float(maxima[segment])
        if flushed <= (underflow_share * BOUND_MARGIN * largest) ** 2:
            # the norm is at least the largest value: the share is far below the threshold, and only
            # its being nonzero counts (a random weight matrix has a few values near zero)
            lost[segment] = np.sqrt(flushed) / largest
            continue
        squares = np.square(flat[starts[segment]:ends[segment]], dtype=np.float64)  # the exact norm
        lost[segment] = np.sqrt(flushed / max(np.add.reduceat(squares, [0])[0], np.finfo(np.float64).tiny))
    judged = iter(zip(maxima.astype(np.float64).tolist(), lost.tolist()))
    fits = []
    limit = precision.max
    for size in sizes:
        max_abs, share = next(judged) if size else (0.0, 0.0)
        problem = None
        if max_abs > limit:
            problem = f"values up to {max_abs:.3g}, beyond {precision.value}'s {limit:.6g}"
        elif share > underflow_share:
            problem = f"{share:.0%} of its magnitude in values that flush to zero in {precision.value}"
        fits.append(Fit(max_abs, share, problem))
    return fits


def constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The tensor of a Constant node (``value``, ``value_float(s)`` or ``value_int(s)``), or None."""
    for attr in node.attribute:
        if attr.name == "value" and attr.type == AttributeProto.TENSOR:
            return attr.t
        if attr.name in ("value_float", "value_floats"):
            values = [attr.f] if attr.name == "value_float" else list(attr.floats)
            shape = () if attr.name == "value_float" else (len(values),)
            return numpy_helper.from_array(np.array(values, np.float32).reshape(shape))
        if attr.name in ("value_int", "value_ints"):
            return numpy_helper.from_array(np.array(attr.i if attr.name == "value_int" else list(attr.ints), np.int64))
    return None


def initializer_to_input(graph: onnx.GraphProto, tensor: onnx.TensorProto, elem_type: int) -> None:
    """Make the initializer ``tensor`` a graph input of ``elem_type`` and its shape (dropping the
    input that lists it in IR < 4 models, where every initializer is also an input)."""
    graph.initializer.remove(tensor)
    for info in [i for i in graph.input if i.name == tensor.name]:
        graph.input.remove(info)
    graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, elem_type, list(tensor.dims)))
