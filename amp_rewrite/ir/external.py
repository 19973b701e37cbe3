"""Where a tensor's external data may be read from: only a regular file inside the folder of the
model that names it, at an extent its file holds and its type and shape need.

A model file is untrusted input: its ``location`` strings are the attacker's choice. A location
joined to the model's folder unchecked reads any file the process can (``../../etc/passwd``,
``/etc/passwd``, or ``w.bin`` linked to it), and the conversion writes its bytes beside the output
(the class of CVE-2024-27318/27319, which onnx's and ONNX Runtime's own loaders refuse). Every read
of external data asks ``resolve`` for its path and ``extent`` for its byte range first; a refusal
is an ``UnsafeExternalData`` naming the tensor and the location, before a byte is read.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import PurePosixPath, PureWindowsPath

import onnx

from amp_rewrite.errors import UserError, printable


class UnsafeExternalData(UserError):
    """A tensor's external data that amp-rewrite will not read (outside the model's folder, a
    link, a missing file, or an extent its file or its type and shape do not allow)."""

    def __init__(self, tensor: str, location: str, problem: str) -> None:
        super().__init__(f"external data of tensor {printable(tensor)!r} at {printable(location)!r} {problem}")
        self.tensor, self.location = tensor, location


def resolve(base_dir: str | os.PathLike | None, location: str, tensor: str) -> str:
    """The path of ``location`` in ``base_dir`` (the folder of the model that names it; None: the
    current folder), once it is known to be relative, inside that folder after following every link,
    itself no link, and a regular file."""
    if not location or "\0" in location:
        raise UnsafeExternalData(tensor, location, "is not a file name")
    if PurePosixPath(location).is_absolute() or PureWindowsPath(location).anchor:
        raise UnsafeExternalData(tensor, location, "is an absolute path: external data must lie in the model's folder")
    if os.path.normpath(location).split(os.sep)[0] == os.pardir:
        raise UnsafeExternalData(tensor, location, "points outside the model's folder")
    folder = os.path.realpath(os.fspath(base_dir) if base_dir else os.curdir)
    path = os.path.join(folder, location)
    if os.path.islink(path):
        raise UnsafeExternalData(tensor, location, "is a symbolic link: external data must be a file in the "
                                                   "model's folder")
    if os.path.commonpath([os.path.realpath(path), folder]) != folder:
        raise UnsafeExternalData(tensor, location, "points outside the model's folder (through a linked folder)")
    if not os.path.isfile(path):
        raise UnsafeExternalData(tensor, location, f"is missing: no file {path}")
    return path


PER_BYTE = {getattr(onnx.TensorProto, name): per
            for name, per in (("INT4", 2), ("UINT4", 2), ("FLOAT4E2M1", 2), ("INT2", 4), ("UINT2", 4))
            if hasattr(onnx.TensorProto, name)}
"""Types stored several values to a byte (raw data, and each element of ``int32_data``)."""


def raw_size(tensor: onnx.TensorProto) -> int:
    """The bytes a tensor's values take as raw data, from its type and shape alone (KeyError for a
    type without a fixed size: strings, or a code ONNX does not define)."""
    count = math.prod(tensor.dims)
    per = PER_BYTE.get(tensor.data_type)
    return -(-count // per) if per else count * _itemsize(tensor.data_type)


@functools.cache
def _itemsize(data_type: int) -> int:
    if data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        raise KeyError(data_type)
    return onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize


def extent(tensor: onnx.TensorProto, info: dict[str, str], file_size: int) -> tuple[int, int]:
    """``(offset, length)`` of the tensor's bytes in its file (``info``: its external data entries),
    once the declared offset and length are whole numbers, the length is what the tensor's type
    and shape need, and the file holds them."""
    location = info.get("location", "")
    if any(d < 0 for d in tensor.dims):
        raise UnsafeExternalData(tensor.name, location, f"belongs to a tensor of negative dims {list(tensor.dims)}")
    try:
        needed = raw_size(tensor)
    except (KeyError, ValueError):
        raise UnsafeExternalData(tensor.name, location, f"belongs to a tensor of element type {tensor.data_type}, "
                                                        "which external data cannot hold") from None
    offset, length = (_whole(tensor.name, location, info, key) for key in ("offset", "length"))
    if length is not None and length != needed:
        raise UnsafeExternalData(tensor.name, location, f"declares {length} bytes where its type and shape "
                                                        f"{list(tensor.dims)} need {needed}")
    start = offset or 0
    if start + needed > file_size:
        raise UnsafeExternalData(tensor.name, location, f"needs bytes {start} to {start + needed}, past the end of "
                                                        f"its file ({file_size} bytes): truncated, or a shape that "
                                                        f"claims more than the data holds")
    return start, needed


def _whole(tensor: str, location: str, info: dict[str, str], key: str) -> int | None:
    text = info.get(key)
    if text is None or text == "":
        return None
    if not text.isascii() or not text.isdigit():
        raise UnsafeExternalData(tensor, location, f"declares {key} {printable(text)!r}, not a whole number of bytes")
    return int(text)
