"""Running native code (ONNX Runtime) where a crash or a hang cannot take the caller down.

``isolated(work, what)`` runs ``work`` in a forked child process and returns what it
returns (``Started`` is the same, for work that runs while the caller goes on). A Python
exception in the child comes back as the same exception; a crash (a segfault in ONNX
Runtime, the out-of-memory killer) or a run past ``timeout`` becomes one
:class:`UserError` that says which step was running, taken from the last
``progress(text)`` the work reported. The child inherits the caller's memory, so
models and samples are not copied; only the result crosses back, pickled.

Where ``fork`` is not offered (Windows), the work runs in the calling process.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
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
FORKS = "fork" in multiprocessing.get_all_start_methods()
"""Whether work can run in a forked child (``Started`` needs it; ``isolated`` runs in-process without)."""


class NativeFailure(UserError):
    """ONNX Runtime crashed or hung in the child process."""


class Hung(NativeFailure):
    """The child process ran past its time limit."""


def isolated(work: Callable[[Progress], T], what: str, timeout: float | None = DEFAULT_TIMEOUT) -> T:
    """``work(progress)`` in a child process; ``what`` names the work in error messages."""
    if not FORKS:
        return work(lambda text: None)
    return Started(work, what, timeout).result()


class Started:
    """``work(progress)`` running in a forked child (``FORKS`` must hold); the caller collects
    the result with ``result()`` (``close()`` stops the child when the caller gives up before)."""

    def __init__(self, work: Callable[[Progress], T], what: str, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        context = multiprocessing.get_context("fork")
        self.what, self.timeout, self.step = what, timeout, "starting"
        self.receiver, child_sender = context.Pipe(duplex=False)
        self.child = context.Process(target=_child, args=(work, child_sender))
        gc.freeze()  # the child's collector leaves the inherited objects (and their pages) alone
        try:
            self.child.start()
        finally:
            gc.unfreeze()
        child_sender.close()

    def result(self) -> T:
        """What the work returned; its exception, crash or silence past ``timeout`` raised here
        (taking in its progress reports on the way)."""
        try:
            while True:
                if not self.receiver.poll(self.timeout):
                    raise Hung(f"{self.what} did not finish within {self.timeout:g} s (while {self.step}); "
                               f"stopped it")
                try:
                    kind, payload = self.receiver.recv()
                except EOFError:
                    self.child.join()
                    raise NativeFailure(f"{self.what} crashed ({_death(self.child.exitcode)}) while "
                                        f"{self.step}") from None
                if kind == _PROGRESS:
                    self.step = payload
                elif kind == _RAISED:
                    raise payload
                else:
                    return payload
        finally:
            self.close()

    def close(self) -> None:
        self.receiver.close()
        if self.child.is_alive():
            self.child.kill()
        self.child.join()


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


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). Freed memory otherwise stays resident for the process's next allocations:
    a process that now only waits would hold it for nothing."""
    libc = ctypes.CDLL(None) if os.name == "posix" else None
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
