"""What the hostile-input tests share: the command run in-process with every file it opens
recorded (an audit hook: "not read" observed, not inferred from the output), and the sentinel
file a traversal out of the model's folder would reach."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from amp_rewrite import cli

SENTINEL = b"SENTINEL-7f3a-not-for-models"

_opened: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


@contextlib.contextmanager
def recording_opens() -> Iterator[list[str]]:
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


class Run(NamedTuple):
    code: int
    out: str
    err: str
    opened: list[str]


def run(argv: list[str]) -> Run:
    """``amp-rewrite ARGV`` in this process: its exit code, what it printed, the files it opened."""
    out, err = io.StringIO(), io.StringIO()
    with recording_opens() as opened, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return Run(code, out.getvalue(), err.getvalue(), list(opened))


def lay_out(root: Path) -> None:
    """``root/secret.txt`` (the sentinel), ``root/models/`` for the model, ``root/out/`` for outputs."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "secret.txt").write_bytes(SENTINEL + b"\0" * 64)
    for folder in ("models", "out"):
        (root / folder).mkdir(exist_ok=True)


def outside(root: Path, opened: list[str]) -> list[str]:
    """The files a traversal would reach that were opened: the sentinel beside the model's folder,
    and /etc/passwd (the process opens other system files of its own, unasked)."""
    targets = {(root / "secret.txt").resolve(), Path("/etc/passwd").resolve()}
    return [p for p in opened if Path(p).resolve() in targets]
