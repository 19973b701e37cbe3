"""Mutated model files for the byte fuzz (``tests/test_fuzz_models.py``): valid models' bytes with
bits flipped, bytes overwritten with boundary values, cut, duplicated or spliced from another model,
and external data locations rewritten as an attacker would (traversals, absolute paths, links).

Each mutation is a function of a random generator and bytes; ``mutant`` draws one to three of them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

INTERESTING = (0x00, 0x01, 0x7F, 0x80, 0xFF)
"""Bytes at the edges of protobuf's varints and of lengths."""

HOSTILE_LOCATIONS = ("../secret.txt", "/etc/passwd", "link.bin", "sub/../../secret.txt", "", "..", "C:\\secret.txt",
                     "a\x00b", "m.onnx.data/..")
"""What a location may be rewritten to (``link.bin`` is a symbolic link the fuzz lays beside the model)."""


def _flip(rng: np.random.Generator, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(int(rng.integers(1, 9))):
        out[int(rng.integers(len(out)))] ^= 1 << int(rng.integers(8))
    return bytes(out)


def _overwrite(rng: np.random.Generator, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(int(rng.integers(1, 5))):
        out[int(rng.integers(len(out)))] = INTERESTING[int(rng.integers(len(INTERESTING)))]
    return bytes(out)


def _cut(rng: np.random.Generator, data: bytes) -> bytes:
    return data[:int(rng.integers(len(data)))]


def _duplicate(rng: np.random.Generator, data: bytes) -> bytes:
    start = int(rng.integers(len(data)))
    end = min(len(data), start + int(rng.integers(1, 256)))
    at = int(rng.integers(len(data)))
    return data[:at] + data[start:end] + data[at:]


def _delete(rng: np.random.Generator, data: bytes) -> bytes:
    start = int(rng.integers(len(data)))
    return data[:start] + data[start + int(rng.integers(1, 64)):]


def _relocate(rng: np.random.Generator, model: onnx.ModelProto) -> bool:
    """An external tensor's location rewritten as an attacker would."""
    entries = [e for t in model.graph.initializer for e in t.external_data if e.key == "location"]
    if not entries:
        return False
    entries[int(rng.integers(len(entries)))].value = HOSTILE_LOCATIONS[int(rng.integers(len(HOSTILE_LOCATIONS)))]
    return True


Edit = Callable[[np.random.Generator, onnx.ModelProto], bool]


def _parsed(rng: np.random.Generator, data: bytes, edit: Edit) -> bytes:
    """``data`` parsed, edited by ``edit`` (False: nothing to edit) and written again; flipped where
    it does not parse."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:  # not parseable (an earlier mutation)
        return _flip(rng, data)
    return model.SerializeToString() if edit(rng, model) else _flip(rng, data)


def _claims(rng: np.random.Generator, model: onnx.ModelProto) -> bool:
    """An initializer's dims or element type changed: its data no longer what it claims."""
    if not model.graph.initializer:
        return False
    tensor = model.graph.initializer[int(rng.integers(len(model.graph.initializer)))]
    if rng.random() < 0.5 and tensor.dims:
        tensor.dims[int(rng.integers(len(tensor.dims)))] = int(rng.choice([0, 1, 3, -1, 1 << 20, 1 << 40]))
    else:
        tensor.data_type = int(rng.integers(0, 27))
    return True


def _nodes(rng: np.random.Generator, model: onnx.ModelProto) -> bool:
    """A node's op, an input's name or an integer attribute changed: a graph ONNX may not accept."""
    if not model.graph.node:
        return False
    node = model.graph.node[int(rng.integers(len(model.graph.node)))]
    choice = rng.random()
    if choice < 0.3:
        node.op_type = str(rng.choice(["Add", "MatMul", "Conv", "Softmax", "Reshape", "If", "Cast", "Unknown"]))
    elif choice < 0.6 and node.input:
        node.input[int(rng.integers(len(node.input)))] = str(rng.choice(["", "x", "missing", node.output[0]
                                                                         if node.output else "y"]))
    else:
        ints = [a for a in node.attribute if a.type == onnx.AttributeProto.INT]
        if not ints:
            return False
        ints[int(rng.integers(len(ints)))].i = int(rng.choice([-2, -1, 0, 1, 7, 1 << 31]))
    return True


MUTATIONS: tuple[Callable[[np.random.Generator, bytes], bytes], ...] = (
    _flip, _overwrite, _cut, _duplicate, _delete, lambda rng, data: _parsed(rng, data, _relocate),
    lambda rng, data: _parsed(rng, data, _claims), lambda rng, data: _parsed(rng, data, _nodes))


def mutant(rng: np.random.Generator, data: bytes, other: bytes) -> bytes:
    """``data`` with one to three mutations, or spliced with ``other`` (a head of one, a tail of the other)."""
    if rng.random() < 0.1:
        return data[:int(rng.integers(len(data)))] + other[int(rng.integers(len(other))):]
    for _ in range(int(rng.integers(1, 4))):
        data = MUTATIONS[int(rng.integers(len(MUTATIONS)))](rng, data) or data
    return data
