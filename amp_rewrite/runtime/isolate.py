"""Running native code (ONNX Runtime) where a crash or a hang cannot take the caller down.

``isolated(work, what)`` runs ``work`` in a forked child process and returns what it
returns. A Python exception in the child comes back as the same exception; a crash
(a segfault in ONNX Runtime, the out-of-memory killer) or a run past ``timeout``
becomes one :class:`UserError` that says which step was running, taken from the last
``progress(text)`` the work reported. The child inherits the caller's memory, so
models and samples are not copied; only the result crosses back, pickled.

Where ``fork`` is not offered (Windows), the work runs in the calling process.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal
from collections.abc import Callable
from typing import TypeVar

from amp_rewrite.errors import UserError

T = TypeVar("T")
Progress = Callable[[str], None]

DEFAULT_TIMEOUT = 900.0
"""Seconds a piece of isolated work may run before it is taken for a hang."""
_OK, _RAISED, _PROGRESS = "ok", "raised", "progress"


class NativeFailure(UserError):
    """ONNX Runtime crashed or hung in the child process."""


def isolated(work: Callable[[Progress], T], what: str, timeout: float | None = DEFAULT_TIMEOUT) -> T:
    """``work(progress)`` in a child process; ``what`` names the work in error messages."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return work(lambda text: None)
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(work, sender), daemon=True)
    child.start()
    sender.close()
    step = "starting"
    try:
        while True:
            if not receiver.poll(timeout):
                raise NativeFailure(f"{what} did not finish within {timeout:g} s (while {step}); stopped it")
            try:
                kind, payload = receiver.recv()
            except EOFError:
                child.join()
                raise NativeFailure(f"{what} crashed ({_death(child.exitcode)}) while {step}") from None
            if kind == _PROGRESS:
                step = payload
            elif kind == _RAISED:
                raise payload
            else:
                return payload
    finally:
        receiver.close()
        if child.is_alive():
            child.kill()
        child.join()


def _child(work: Callable[[Progress], T], sender) -> None:
    faulthandler.disable()  # the parent reports a crash in one line; no stack dump from here
    try:
        result = (_OK, work(lambda text: sender.send((_PROGRESS, text))))
    except BaseException as exc:  # everything goes back to the parent, which re-raises it
        result = (_RAISED, exc)
    try:
        sender.send(result)
    except Exception as exc:  # the exception itself did not pickle
        sender.send((_RAISED, RuntimeError(f"{type(result[1]).__name__}: {result[1]} ({exc})")))
    sender.close()
    os._exit(0)  # no atexit handlers or finalizers of the parent's state in the child


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"
