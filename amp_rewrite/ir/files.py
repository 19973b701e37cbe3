"""Small files written atomically (reports, arrays, a training step's pieces): under a temporary
name beside the destination, which they take only once whole; several together (``together``)
take theirs only once all are whole."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx

from amp_rewrite.errors import UserError, printable
from amp_rewrite.ir.io import Written, temp_beside, writing


def save_text(path: Path, text: str) -> None:
    """Write a text file atomically."""
    with _beside(path, _text_writer(text)) as written:
        written.commit()


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write arrays keyed by tensor names as an ``.npz`` atomically (``arrays_writer``)."""
    with _beside(path, arrays_writer(arrays)) as written:
        written.commit()


def arrays_writer(arrays: Mapping[str, np.ndarray]) -> Callable[[BinaryIO], object]:
    """What writes ``arrays`` as an ``.npz``. A name is a key of the archive, never a path: zip
    stores any name as given, but a NUL would cut it short (two tensors could share a key), so such
    a name is refused, before anything is written."""
    cut = next((name for name in arrays if "\0" in name), None)
    if cut is not None:
        raise UserError(f"tensor {printable(cut)!r} has a NUL character in its name, which an .npz key cannot hold")
    # numpy's stub reads the arrays' names as its allow_pickle flag too: hence the ignore
    return lambda sink: np.savez(sink, **arrays)  # type: ignore[arg-type]


def _text_writer(text: str) -> Callable[[BinaryIO], object]:
    return lambda sink: sink.write(text.encode())


class Together:
    """Files written under temporary names beside theirs (``together``), which all take their names
    once every one is written: a failure on any leaves none of them behind."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self.pending: list[Written] = []

    def model(self, model: onnx.ModelProto, output: str | os.PathLike) -> None:
        self.pending.append(self.stack.enter_context(writing(model, output, None)))

    def text(self, path: Path, text: str) -> None:
        self.pending.append(self.stack.enter_context(_beside(path, _text_writer(text))))

    def arrays(self, path: Path, arrays: Mapping[str, np.ndarray]) -> None:
        self.pending.append(self.stack.enter_context(_beside(path, arrays_writer(arrays))))


@contextlib.contextmanager
def together() -> Iterator[Together]:
    """A ``Together`` whose files take their names when the block ends without an error."""
    with contextlib.ExitStack() as stack:
        files = Together(stack)
        yield files
        for written in files.pending:
            written.commit()


@contextlib.contextmanager
def _beside(path: Path, write: Callable[[BinaryIO], object]) -> Iterator[Written]:
    """``write`` into a file beside ``path`` (a ``Written``, which the block commits or not);
    nothing is left where it is not committed."""
    temp = temp_beside(path)
    try:
        with open(temp, "wb") as sink:
            write(sink)
            size = sink.tell()
        yield Written([(temp, path)], size)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
