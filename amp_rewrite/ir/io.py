"""Loading and saving models: clear errors, atomic writes, external data streamed tensor by tensor."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import google.protobuf.message
import numpy as np
import onnx
from google.protobuf import unknown_fields

from amp_rewrite.errors import UserError
from amp_rewrite.ir import contents, external
from amp_rewrite.ir.precision import Precision
from amp_rewrite.ir.sizes import iter_graphs
from amp_rewrite.ir.tensors import (
    SOURCE_TYPE_KEY,
    close_data_file,
    convert_embedded,
    data_file,
    external_bytes,
    external_location,
    float32_values,
    stored_values,
    value_bytes,
)

PROTOBUF_LIMIT = 2**31 - 1
EXTERNAL_THRESHOLD = 1024
"""Tensors of at least this many bytes go to the external data file."""
COPY_CHUNK = 64 << 20
WRITE_BUFFER = 1 << 20
"""The model file is written in many small pieces: buffer them."""


def load(path: str | os.PathLike, borrow: int = 0) -> onnx.ModelProto:
    """Read a model without its external data (tensors are read when needed). ``borrow``: a
    large file's float weights of at least this many bytes stay in it too (``_Lender``; 0:
    none), for a caller that writes the model with ``save(..., source=path)`` or runs it with
    ONNX Runtime."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"input file not found: {path}")
    if path.is_dir():
        raise UserError(f"input is a directory, not an ONNX file: {path}")
    try:
        model = None
        if path.stat().st_size >= STREAMED_LOAD_BYTES:
            try:
                model = _load_streamed(path, borrow)
            except ValueError:  # what the walk does not take (a group field, a cut file): protobuf's parser decides
                model = None
        if model is None:
            model = onnx.load(os.fspath(path), load_external_data=False)
    except (google.protobuf.message.DecodeError, ValueError, RuntimeError, UnicodeDecodeError) as exc:
        raise UserError(f"not a readable ONNX model: {path} ({type(exc).__name__})") from None
    if not model.HasField("graph") or not model.opset_import:
        raise UserError(f"not an ONNX model (no graph or opset): {path}")
    contents.check(model, path.parent)
    if borrow:
        close_data_file(path)
    return model


STREAMED_LOAD_BYTES = 64 << 20
"""Files of at least this size are parsed tensor by tensor (``_load_streamed``): ``onnx.load``
holds the file's bytes and the parsed model at once, twice the model, where a streamed load
holds the model and one tensor's bytes (and takes less time too; figures in benchmarks/RESULTS.md)."""


def _load_streamed(path: Path, borrow: int) -> onnx.ModelProto:
    """``onnx.load`` of ``path`` (without external data) holding the parsed model and one
    initializer's bytes at a time: the wire format is walked field by field, each of the graph's
    initializers parsed on its own (``borrow``: its raw data left in the file), and every other
    field merged as protobuf would."""
    model = onnx.ModelProto()
    lender = _Lender(path.name, borrow) if borrow else None
    with open(path, "rb", buffering=WRITE_BUFFER) as stream:
        reader = _WireReader(stream, path.stat().st_size)
        rest = bytearray()  # the model's fields but the graph
        while not reader.done():
            number, wire = reader.key()
            if number != _GRAPH or wire != 2:
                rest += reader.field(number, wire)
                continue
            length = reader.varint()
            end = reader.position + length
            graph = bytearray()  # the graph's fields but its initializers
            while reader.position < end:
                number, wire = reader.key()
                if number == _INITIALIZER and wire == 2:
                    length = reader.varint()
                    start = reader.position
                    data = reader.read(length)
                    if lender is None or not lender.lend(model.graph.initializer, data, start):
                        model.graph.initializer.add().ParseFromString(data)
                else:
                    graph += reader.field(number, wire)
            if reader.position != end:
                raise ValueError("a graph field's length does not match its contents")
            model.graph.MergeFromString(bytes(graph))
        model.MergeFromString(bytes(rest))
    return model


BORROWED_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                            onnx.TensorProto.DOUBLE})
"""Weights that a borrowing load leaves in the file: float ones, whose values the analysis
reads only to judge their range (integer ones are shape operands and indices, read as values)."""


class _Lender:
    """Borrowing (``load(path, borrow=BYTES)``): a float initializer of at least ``BYTES``
    (``convert``: ``EXTERNAL_THRESHOLD``) whose raw data is its serialized form's last field is held as
    external data in the model file itself (``location`` its name, ``offset`` where the raw
    data starts): the model in memory lacks the weights' bytes, which are read when needed
    and written back into the model by ``save(..., source)``."""

    def __init__(self, location: str, least: int) -> None:
        self.location = _entry_field("location", location)
        self.least = max(least, 1)

    def lend(self, initializers, data: bytes, start: int) -> bool:
        """Add the tensor whose serialized form is ``data``, found at ``start`` in the file, to
        ``initializers`` borrowed; False (nothing added) where it is not to be borrowed."""
        if len(data) < self.least:
            return False
        tensor = onnx.TensorProto.FromString(data)
        if tensor.data_type not in BORROWED_TYPES or not tensor.HasField("raw_data"):
            return False
        size = value_bytes(tensor)
        prefix = _RAW_DATA_KEY + _varint(size)
        head = len(data) - size - len(prefix)
        if size < self.least or head < 0 or data[head:head + len(prefix)] != prefix:
            return False
        borrowed = initializers.add()
        try:  # parsed whole, the fields before end at ``head`` (where the raw data's field starts)
            borrowed.ParseFromString(data[:head])
        except google.protobuf.message.DecodeError:
            del initializers[-1]
            return False
        borrowed.MergeFromString(self.location + _entry_field("offset", str(start + head + len(prefix)))
                                 + _entry_field("length", str(size)) + _DATA_LOCATION_EXTERNAL)
        return True


def _entry_field(key: str, value: str) -> bytes:
    """A TensorProto's ``external_data`` field holding the entry ``key: value``, as protobuf writes it."""
    return length_delimited(_EXTERNAL_DATA, length_delimited(1, key.encode()) + length_delimited(2, value.encode()))


class _WireReader:
    """Protobuf's wire format read from a stream, field by field."""

    def __init__(self, stream, size: int) -> None:
        self.stream, self.size, self.position = stream, size, 0

    def done(self) -> bool:
        return self.position >= self.size

    def read(self, count: int) -> bytes:
        data = self.stream.read(count)
        if len(data) != count:
            raise ValueError("the file ends inside a field")
        self.position += count
        return data

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.read(1)[0]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("a varint longer than ten bytes")

    def key(self) -> tuple[int, int]:
        """The next field's number and wire type."""
        key = self.varint()
        return key >> 3, key & 7

    def field(self, number: int, wire: int) -> bytes:
        """The rest of the field whose key was just read, with its key, as protobuf writes it."""
        key = _varint(number << 3 | wire)
        if wire == 0:
            return key + _varint(self.varint())
        if wire in (1, 5):
            return key + self.read(8 if wire == 1 else 4)
        if wire == 2:
            length = self.varint()
            return key + _varint(length) + self.read(length)
        raise ValueError(f"wire type {wire} (a group, or not protobuf)")


def read_model(model, verb: str = "read", borrow: int = 0) -> tuple[onnx.ModelProto, str | None, str]:
    """``(proto, base_dir, kind)`` for a path, an ``onnx.ModelProto`` (copied: the caller's is never
    modified) or an ``onnx_ir.Model``; ``kind`` is "path", "proto" or "ir". A path's external data
    stays on disk (read from ``base_dir`` when needed), and its weights with ``borrow`` (``load``);
    an in-memory model's must be loaded."""
    if isinstance(model, (str, os.PathLike)):
        return load(model, borrow), os.path.dirname(os.path.abspath(model)), "path"
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        if any(data_file(t) for t in initializers(proto)):
            raise UserError("the ModelProto refers to external data that is not loaded: "
                            "pass the model's path, or load it with onnx.load(path)")
        return proto, None, "proto"
    if type(model).__module__.startswith("onnx_ir"):
        import onnx_ir as ir

        proto = ir.serde.serialize_model(model)
        embed_external(proto, _ir_base_dir(model))
        return proto, None, "ir"
    raise UserError(f"cannot {verb} a {type(model).__name__}: pass a path, an onnx.ModelProto or an onnx_ir.Model")


def _ir_base_dir(model) -> str | None:
    for graph in model.graphs():
        for value in graph.initializers.values():
            base = getattr(value.const_value, "base_dir", None)
            if base:
                return os.fspath(base)
    return None


def embed_external(model: onnx.ModelProto, base_dir: str | os.PathLike | None) -> None:
    """Read every external tensor's bytes into ``model`` (from ``base_dir``, the folder of the model
    file that names them), each checked as ``load`` checks it: the model then holds its weights."""
    contents.check(model, Path(base_dir or os.curdir))
    for tensor in initializers(model):
        info = external_location(tensor)
        if info is not None:
            tensor.raw_data = external_bytes(tensor, base_dir, info, external.raw_size(tensor))
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT


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


def save(model: onnx.ModelProto, output: str | os.PathLike, base_dir: str | os.PathLike | None,
         deferred: Mapping[str, Precision] | None = None, source: str | os.PathLike | None = None) -> int:
    """Write ``model`` atomically (nothing appears at ``output`` unless all of it was written)
    and return the bytes written: ``writing``, committed."""
    with writing(model, output, base_dir, deferred, source) as written:
        written.commit()
    return written.size


class Written:
    """A model written beside its destination under temporary names: ``commit`` gives the files
    their names; a ``writing`` block left without it leaves nothing behind."""

    def __init__(self, renames: list[tuple[str, Path]], size: int) -> None:
        self.renames, self.size = renames, size

    def commit(self) -> None:
        for temp, final in self.renames:
            os.replace(temp, final)
        self.renames = []


@contextlib.contextmanager
def writing(model: onnx.ModelProto, output: str | os.PathLike, base_dir: str | os.PathLike | None,
            deferred: Mapping[str, Precision] | None = None,
            source: str | os.PathLike | None = None) -> Iterator[Written]:
    """``model`` written under temporary names beside ``output`` (a ``Written``, which the block
    commits or not); external tensors (and any model over 2 GB) go to ``OUT.data``.

    The model is written piece by piece, never as one serialized string, and the tensors
    that InsertCasts marked (external ones, and the top-level initializers named in
    ``deferred``) are converted one at a time as they are written: memory holds the model
    and one tensor. A model written whole is left unchanged; one that goes to ``OUT.data``
    is left pointing there, its tensors converted. ``source``: the file that ``load(source,
    borrow=...)`` read (in ``base_dir``), whose borrowed tensors are written back into the model.
    """
    output = Path(output)
    deferred = deferred or {}
    lent = Path(source).name if source is not None else None
    spilled = any(data_file(t) not in (None, lent) for t in initializers(model))
    temps: list[str] = []
    try:
        pieces = None if spilled else _pieces(model, deferred, base_dir, lent)
        size = 0
        renames = []
        if pieces is None or pieces.size > PROTOBUF_LIMIT:
            data = output.parent / (output.name + ".data")
            temps.append(temp_beside(data))
            renames.append((temps[-1], data))
            with open(temps[-1], "wb") as sink:
                _externalize_all(model, sink, data.name, base_dir, deferred)
                size = sink.tell()
            pieces = _Pieces()
            pieces.add(model.SerializeToString())
        temps.append(temp_beside(output))
        renames.append((temps[-1], output))
        with open(temps[-1], "wb", buffering=WRITE_BUFFER) as sink:
            pieces.write(sink)
            if sink.tell() != pieces.size:  # the length prefixes written ahead would not match
                raise RuntimeError(f"wrote {sink.tell()} bytes of a model counted as {pieces.size}")
            size += sink.tell()
        yield Written(renames, size)
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror}") from None
    finally:
        for temp in temps:
            if os.path.exists(temp):
                os.unlink(temp)


class _Pieces:
    """A message's serialized form as a list of pieces: bytes, and the tensors that are
    serialized (or converted) only as they are written; ``size`` is known before writing."""

    def __init__(self) -> None:
        self.items: list[bytes | bytearray | onnx.TensorProto | _Converted | _Pieces] = []
        self.size = 0

    def add(self, data: bytes | bytearray) -> None:
        self.items.append(data)
        self.size += len(data)

    def add_field(self, number: int, item: onnx.TensorProto | _Converted | _Pieces, size: int) -> None:
        """A length-delimited field: its key and length, then ``item`` of ``size`` bytes."""
        self.add(_varint(number << 3 | 2) + _varint(size))
        self.items.append(item)
        self.size += size

    def write(self, sink) -> None:
        for item in self.items:
            if isinstance(item, (bytes, bytearray)):
                sink.write(item)
            elif isinstance(item, onnx.TensorProto):
                sink.write(item.SerializeToString())
            else:
                item.write(sink)


class _Converted:
    """A tensor written with its values in the model: a float32 one in ``precision`` (the
    top-level initializers that InsertCasts deferred), or a borrowed one (``load(borrow=...)``)
    read back from its file, in the type that InsertCasts gave it. Its fields before
    ``raw_data``, the values as ``raw_data``, then its fields after: the bytes that
    ``tensors.convert_embedded`` followed by serialization would give, without changing the
    model."""

    __slots__ = ("tensor", "base_dir", "info", "source_type", "target", "count", "head", "tail", "size")

    def __init__(self, tensor: onnx.TensorProto, precision: Precision | None, base_dir=None) -> None:
        self.tensor, self.base_dir = tensor, base_dir
        self.info = info = external_location(tensor)
        self.source_type = int(info.get(SOURCE_TYPE_KEY, tensor.data_type)) if info else onnx.TensorProto.FLOAT
        head = onnx.TensorProto()
        head.CopyFrom(tensor)
        for name in ("raw_data", "float_data", *(("external_data", "data_location") if info else ())):
            head.ClearField(name)
        if precision is not None:
            head.data_type = precision.onnx_type
        self.target = onnx.helper.tensor_dtype_to_np_dtype(head.data_type)
        self.tail = b""
        fields = head.ListFields()
        if fields[-1][0].number > _RAW_DATA:  # fields come by number: most tensors have none after raw_data
            tail = onnx.TensorProto()
            for field, _ in fields:
                if field.number > _RAW_DATA:
                    _copy_field(head, tail, field)
                    head.ClearField(field.name)
            self.tail = tail.SerializeToString()
        self.count = math.prod(head.dims)
        nbytes = self.count * self.target.itemsize
        self.head = head.SerializeToString() + _RAW_DATA_KEY + _varint(nbytes)
        self.size = len(self.head) + nbytes + len(self.tail)

    def write(self, sink) -> None:
        if self.info:
            data = stored_values(self.tensor, self.base_dir, self.source_type, self.info)
        else:
            data = float32_values(self.tensor, None)
        if data.size != self.count:
            raise UserError(f"tensor {self.tensor.name!r} holds {data.size} values, not the {self.count} of its shape")
        sink.write(self.head)
        sink.write(data.astype(self.target, copy=False).reshape(-1).view(np.uint8))
        sink.write(self.tail)


_GRAPH = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_INITIALIZER = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
_RAW_DATA = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number
_RAW_DATA_KEY = bytes([_RAW_DATA << 3 | 2])
_EXTERNAL_DATA = onnx.TensorProto.DESCRIPTOR.fields_by_name["external_data"].number
_DATA_LOCATION_EXTERNAL = bytes([onnx.TensorProto.DESCRIPTOR.fields_by_name["data_location"].number << 3,
                                 onnx.TensorProto.EXTERNAL])


def _pieces(model: onnx.ModelProto, deferred: Mapping[str, Precision], base_dir, lent: str | None) -> _Pieces:
    """The model's serialized form, field by field in field-number order (as protobuf writes
    it), with the graph's initializers left as tensors (those deferred, or borrowed from the
    file ``lent``, written as ``_Converted``)."""
    graph = model.graph
    if unknown_fields.UnknownFieldSet(model) or unknown_fields.UnknownFieldSet(graph):
        for tensor in graph.initializer:  # fields this protobuf does not know: let it write them all
            if tensor.name in deferred:
                convert_embedded(tensor, deferred[tensor.name])
        whole = _Pieces()
        whole.add(model.SerializeToString())
        return whole
    body = _Pieces()
    for field, value in graph.ListFields():
        if field.number == _INITIALIZER:
            for tensor in value:
                precision = deferred.get(tensor.name)
                if precision is None and not (lent and tensor.data_location == onnx.TensorProto.EXTERNAL):
                    body.add_field(field.number, tensor, tensor.ByteSize())
                else:
                    item = _Converted(tensor, precision, base_dir)
                    body.add_field(field.number, item, item.size)
        else:
            body.add(_field_bytes(graph, field))
    pieces = _Pieces()
    for field, _ in model.ListFields():
        if field.number == _GRAPH:
            pieces.add_field(field.number, body, body.size)
        else:
            pieces.add(_field_bytes(model, field))
    return pieces


def length_delimited(number: int, data: bytes) -> bytes:
    """Field ``number`` holding ``data`` (a message's or a string's bytes), as protobuf writes
    it: a parser of the message that holds the field reads it so, in any order among the others."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _field_bytes(message, field) -> bytes | bytearray:
    """One field of ``message`` as protobuf serializes it (repeated messages item by item, into
    one buffer: cheaper than copying them, and no second copy of the nodes' bytes)."""
    if _is_repeated(field) and field.message_type is not None:
        key = _varint(field.number << 3 | 2)
        out = bytearray()
        for item in getattr(message, field.name):
            data = item.SerializeToString()
            out += key
            out += _varint(len(data))
            out += data
        return out
    shell = type(message)()
    _copy_field(message, shell, field)
    return shell.SerializeToString()


def _copy_field(source, target, field) -> None:
    value = getattr(source, field.name)
    if _is_repeated(field):
        getattr(target, field.name).extend(value)
    elif field.message_type is not None:
        getattr(target, field.name).CopyFrom(value)
    else:
        setattr(target, field.name, value)


def _is_repeated(field) -> bool:
    return field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED


def _varint(n: int) -> bytes:
    """Protobuf's base-128 encoding of a non-negative integer, low groups first."""
    if n < 0x80:
        return _SMALL_VARINTS[n]
    if n < 0x4000:  # the lengths of most nodes and tensors
        return bytes((n & 0x7F | 0x80, n >> 7))
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_VARINTS = [bytes([n]) for n in range(0x80)]


def temp_beside(path: Path) -> str:
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    os.close(handle)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(name, 0o666 & ~umask)  # the permissions a plain open() would give
    return name


def _externalize_all(model: onnx.ModelProto, sink, location: str, base_dir, deferred: Mapping[str, Precision]) -> None:
    graphs = iter_graphs(model.graph)
    for tensor in next(graphs).initializer:
        _externalize(tensor, sink, location, base_dir, deferred.get(tensor.name))
    for graph in graphs:  # subgraphs: ``deferred`` names top-level initializers only
        for tensor in graph.initializer:
            _externalize(tensor, sink, location, base_dir, None)


def _externalize(tensor: onnx.TensorProto, sink, location: str, base_dir, precision: Precision | None) -> None:
    """Move the tensor's data to ``sink`` (converted to ``precision`` when given, or when InsertCasts
    marked it); an embedded tensor under ``EXTERNAL_THRESHOLD`` bytes stays (converted) in the model."""
    info = external_location(tensor)
    offset = sink.tell()
    if info is None:
        if precision is not None:
            convert_embedded(tensor, precision)
        if len(tensor.raw_data) < EXTERNAL_THRESHOLD:
            return
        sink.write(tensor.raw_data)
        tensor.ClearField("raw_data")
    else:
        if SOURCE_TYPE_KEY in info:
            _write_converted(tensor, base_dir, int(info[SOURCE_TYPE_KEY]), info, sink)
        else:
            with open(external.resolve(base_dir, info.get("location", ""), tensor.name), "rb") as f:
                f.seek(int(info.get("offset") or 0))  # ``external.extent`` checked both when the model was loaded
                _copy(f, int(info.get("length") or value_bytes(tensor)), sink)
        del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(sink.tell() - offset))):
        tensor.external_data.add(key=key, value=value)


def _write_converted(tensor: onnx.TensorProto, base_dir, source_type: int, info: dict[str, str], sink) -> None:
    target = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    sink.write(stored_values(tensor, base_dir, source_type, info).astype(target).tobytes())


def _copy(source, length: int, sink) -> None:
    while length > 0:
        chunk = source.read(min(COPY_CHUNK, length))
        if not chunk:
            break
        sink.write(chunk)
        length -= len(chunk)
