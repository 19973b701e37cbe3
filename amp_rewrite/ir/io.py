"""Loading and saving models: clear errors, atomic writes, external data streamed tensor by tensor."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import google.protobuf.message
import numpy as np
import onnx
import onnx.external_data_helper

from amp_rewrite.errors import UserError
from amp_rewrite.ir.precision import Precision
from amp_rewrite.ir.sizes import iter_graphs
from amp_rewrite.ir.tensors import SOURCE_TYPE_KEY, external_location

PROTOBUF_LIMIT = 2**31 - 1
EXTERNAL_THRESHOLD = 1024
"""Tensors of at least this many bytes go to the external data file."""
COPY_CHUNK = 64 << 20


def load(path: str | os.PathLike) -> onnx.ModelProto:
    """Read a model without its external data (tensors are read when needed)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"input file not found: {path}")
    if path.is_dir():
        raise UserError(f"input is a directory, not an ONNX file: {path}")
    try:
        model = onnx.load(os.fspath(path), load_external_data=False)
    except (google.protobuf.message.DecodeError, ValueError, RuntimeError, UnicodeDecodeError) as exc:
        raise UserError(f"not a readable ONNX model: {path} ({type(exc).__name__})") from None
    if not model.HasField("graph") or not model.opset_import:
        raise UserError(f"not an ONNX model (no graph or opset): {path}")
    _check_external_files(model, path.parent)
    return model


def read_model(model, verb: str = "read") -> tuple[onnx.ModelProto, str | None, str]:
    """``(proto, base_dir, kind)`` for a path, an ``onnx.ModelProto`` (copied: the caller's is never
    modified) or an ``onnx_ir.Model``; ``kind`` is "path", "proto" or "ir". A path's external data
    stays on disk (read from ``base_dir`` when needed); an in-memory model's must be loaded."""
    if isinstance(model, (str, os.PathLike)):
        return load(model), os.path.dirname(os.path.abspath(model)), "path"
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        if any(external_location(t) for t in initializers(proto)):
            raise UserError("the ModelProto refers to external data that is not loaded: "
                            "pass the model's path, or load it with onnx.load(path)")
        return proto, None, "proto"
    if type(model).__module__.startswith("onnx_ir"):
        import onnx_ir as ir

        proto = ir.serde.serialize_model(model)
        base_dir = _ir_base_dir(model)
        if base_dir is not None:
            onnx.external_data_helper.load_external_data_for_model(proto, base_dir)
        return proto, None, "ir"
    raise UserError(f"cannot {verb} a {type(model).__name__}: pass a path, an onnx.ModelProto or an onnx_ir.Model")


def _ir_base_dir(model) -> str | None:
    for graph in model.graphs():
        for value in graph.initializers.values():
            base = getattr(value.const_value, "base_dir", None)
            if base:
                return os.fspath(base)
    return None


def _check_external_files(model: onnx.ModelProto, base_dir: Path) -> None:
    for tensor in initializers(model):
        info = external_location(tensor)
        if info is None:
            continue
        data = base_dir / info.get("location", "")
        if not data.is_file():
            raise UserError(f"external data file missing for tensor {tensor.name!r}: {data}")
        end = int(info.get("offset", 0)) + int(info.get("length", 0) or 0)
        if end > data.stat().st_size:
            raise UserError(f"external data file is truncated (tensor {tensor.name!r} ends at byte {end}): {data}")


def initializers(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    for graph in iter_graphs(model.graph):
        yield from graph.initializer


def check_output_path(source: str | os.PathLike | None, output: str | os.PathLike) -> Path:
    output = Path(output)
    if source is not None and output.resolve() == Path(source).resolve():
        raise UserError(f"output path is the input path; the input is never overwritten: {output}")
    folder = output.parent if str(output.parent) else Path(".")
    if not folder.is_dir():
        raise UserError(f"output folder does not exist: {folder}")
    if not os.access(folder, os.W_OK):
        raise UserError(f"output folder is not writable: {folder}")
    if output.is_dir():
        raise UserError(f"output path is a directory: {output}")
    return output


def save(model: onnx.ModelProto, output: str | os.PathLike, base_dir: str | os.PathLike | None) -> None:
    """Write ``model`` atomically; external tensors (and any model over 2 GB) go to ``OUT.data``.

    Tensors marked by InsertCasts are converted while they are copied, one at a
    time, so memory holds one tensor, not the model.
    """
    output = Path(output)
    external = any(external_location(t) for t in initializers(model))
    temps: list[str] = []
    try:
        if external or model.ByteSize() > PROTOBUF_LIMIT:
            data_name = output.name + ".data"
            data_temp = _temp_beside(output.parent / data_name)
            temps.append(data_temp)
            with open(data_temp, "wb") as sink:
                for tensor in initializers(model):
                    _externalize(tensor, sink, data_name, base_dir)
        model_temp = _temp_beside(output)
        temps.append(model_temp)
        with open(model_temp, "wb") as sink:
            sink.write(model.SerializeToString())
        if len(temps) == 2:
            os.replace(temps[0], output.parent / data_name)
        os.replace(model_temp, output)
        temps.clear()
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror}") from None
    finally:
        for temp in temps:
            if os.path.exists(temp):
                os.unlink(temp)


def _temp_beside(path: Path) -> str:
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    os.close(handle)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(name, 0o666 & ~umask)  # the permissions a plain open() would give
    return name


def _externalize(tensor: onnx.TensorProto, sink, location: str, base_dir) -> None:
    info = external_location(tensor)
    offset = sink.tell()
    if info is None:
        if len(tensor.raw_data) < EXTERNAL_THRESHOLD:
            return
        sink.write(tensor.raw_data)
        tensor.ClearField("raw_data")
    else:
        source = os.path.join(base_dir or ".", info["location"])
        with open(source, "rb") as f:
            f.seek(int(info.get("offset", 0)))
            if SOURCE_TYPE_KEY in info:
                _write_converted(tensor, f, int(info[SOURCE_TYPE_KEY]), sink)
            else:
                _copy(f, int(info.get("length") or _nbytes(tensor)), sink)
        del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(sink.tell() - offset))):
        tensor.external_data.add(key=key, value=value)


def _write_converted(tensor: onnx.TensorProto, source, source_type: int, sink) -> None:
    dtype = onnx.helper.tensor_dtype_to_np_dtype(source_type)
    array = np.fromfile(source, dtype=dtype, count=int(np.prod(tensor.dims, dtype=np.int64)))
    target = next(p for p in Precision if p.onnx_type == tensor.data_type)
    sink.write(array.astype(target.numpy_type).tobytes())


def _nbytes(tensor: onnx.TensorProto) -> int:
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def _copy(source, length: int, sink) -> None:
    while length > 0:
        chunk = source.read(min(COPY_CHUNK, length))
        if not chunk:
            break
        sink.write(chunk)
        length -= len(chunk)


def save_text(path: Path, text: str) -> None:
    """Write a text file atomically."""
    temp = _temp_beside(path)
    try:
        with open(temp, "w") as sink:
            sink.write(text)
        os.replace(temp, path)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
