"""Running native code (ONNX Runtime) where a crash or a hang cannot take the caller down.

``isolated(work, what)`` runs ``work`` in a child process and returns what it returns
(``Started`` is the same, for work that runs while the caller goes on). A Python
exception in the child comes back as the same exception; a crash (a segfault in ONNX
Runtime, the out-of-memory killer), a run past ``timeout`` or past the child's memory budget
(``memory_budget``) becomes one :class:`UserError` that says which step was running, taken
from the last ``progress(text)`` the work reported.

Two kinds of child. By default the work runs in a child forked for it, which inherits the
caller's memory: models and samples are not copied, only the result crosses back, pickled.
A forked child's result, when larger than a pipe holds, crosses in a file the caller made
before the fork (``_SPILLED``): through the pipe, the child would wait for the caller to read
it, holding its memory (the ONNX Runtime session, its copies of the caller's pages) while the
caller goes on converting. Small work that pickles (``portable``) goes instead, from the process's second isolated work
on, to its worker, a child forked once that runs one piece after another (``_Worker``): a fork
costs in proportion to the caller's address space (and as much again to take the child down),
which a process that converts many small models would pay in every conversion, many times over
the work.

Children are forked with ``os.fork`` (``_Forked``), not as ``multiprocessing`` processes:
those refuse to start in a daemonic process, which every ``multiprocessing.Pool`` worker is,
and a pipeline that converts many models through a pool called the API there. Where no
child can be forked (no ``fork`` on the platform, as on Windows, or the system refused one),
the work runs in the calling process (``in_process``): a crash then ends the caller, and
``IsolationWarning`` says so, once a process.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import gc
import importlib
import multiprocessing
import os
import pickle
import resource
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Generic, TypeVar

from amp_rewrite.errors import UserError
from amp_rewrite.ir.memory import release_free_memory

T = TypeVar("T")
Progress = Callable[[str], None]

DEFAULT_TIMEOUT = 900.0
"""Seconds a piece of isolated work may run before it is taken for a hang (read when the work starts)."""
MEMORY_SHARE = 0.75
"""The share of the machine's physical memory a child may allocate beyond what it inherits from
its caller (``memory_budget``): work on an untrusted model (a Loop of 10**13 iterations, a shape
that a mutated model makes huge) ends in ``OutOfMemory`` rather than in the system's
out-of-memory killer, which may pick another process."""
WORKER_IDLE = 60.0
"""Seconds the worker waits for work before it exits; the caller sends none to a worker idle
for half of that (so none to one that is exiting)."""
STALL_SECONDS = 60.0
"""Seconds a child may use no CPU at all before it is taken for deadlocked (``Stalled``): work
uses CPU, in ONNX Runtime's threads too, and reading weights from disk costs some."""
STALL_CHECK = 1.0
"""Seconds between two looks at a waited-for child's CPU time."""
_OK, _RAISED, _PROGRESS, _SPILLED = "ok", "raised", "progress", "spilled"
SPILL_BYTES = 32 << 10
"""Results past this size (pickled) leave a forked child in its spill file: a pipe buffers 64 KiB."""
FORKS = hasattr(os, "fork")
"""Whether work can run in a forked child (``Started`` runs it in-process without, as ``isolated`` does)."""
CHILD_IMPORTS = ("onnxruntime", "numpy.random")
"""What the work imports (ONNX Runtime; numpy's generators, for generated inputs): imported by the
caller before its second child (``Started._count``). What a child imports dies with it: a process
that converts many small models would pay these imports in every conversion's child."""


class NativeFailure(UserError):
    """ONNX Runtime crashed or hung in the child process."""


class OutOfMemory(NativeFailure):
    """The child process allocated past its memory budget (``memory_budget``)."""


class Hung(NativeFailure):
    """The child process ran past its time limit."""


class Stalled(Hung):
    """The child process stopped using CPU before it finished: deadlocked, as a forked child is
    where a lock that another thread of the caller held at the fork stays held. Rare (where ONNX
    Runtime creates a session, and not again when the same work is replayed): another child may
    not be."""


class IsolationWarning(UserWarning):
    """Work meant for a child process ran in the calling process (``in_process``)."""


class _CpuWatch:
    """Whether a process has gone ``STALL_SECONDS`` without using CPU, from its /proc entry (where
    there is none, it never has)."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.used, self.since = self._cpu_seconds(), time.monotonic()

    def stalled(self) -> bool:
        used = self._cpu_seconds()
        if used is None or self.used is None or used > self.used:
            self.used, self.since = used, time.monotonic()
            return False
        return time.monotonic() - self.since >= STALL_SECONDS

    def _cpu_seconds(self) -> float | None:
        try:  # the fields after the command's closing parenthesis, from the state on: utime and stime
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def isolated(work: Callable[[Progress], T], what: str, timeout: float | None = None) -> T:
    """``work(progress)`` in a child process; ``what`` names the work in error messages; ``timeout``
    in seconds, ``DEFAULT_TIMEOUT`` where None."""
    return Started(work, what, timeout).result()


def memory_budget() -> int | None:
    """Bytes a child may allocate beyond what it inherits: ``MEMORY_SHARE`` of physical memory
    (None where the system does not say how much there is)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * MEMORY_SHARE)
    except (ValueError, OSError, AttributeError):
        return None


def _bound_memory(budget: int | None) -> None:
    """In a child: its data (heap and private writable mappings, ``RLIMIT_DATA``) limited to what it
    inherited plus ``budget``; an allocation past it fails (``MemoryError`` in Python, a failed
    allocation in ONNX Runtime) rather than growing until the system kills a process."""
    if budget is None or not hasattr(resource, "RLIMIT_DATA"):
        return
    try:
        status = Path("/proc/self/status").read_text()
        inherited = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmData:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return  # no /proc: the child runs unbounded, as before
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = inherited + budget
    for bound in (soft, hard):
        if bound != resource.RLIM_INFINITY:
            limit = min(limit, bound)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


_refused: str | None = None
"""Why this process could not fork its last child, if it could not."""


def in_process() -> str | None:
    """Why isolated work runs in this process (no platform fork, or the system refused the last
    child), or None where it runs in a child: a crash in it then ends this process."""
    return None if FORKS and _refused is None else _refused or "this platform cannot fork a child process"


def _run_here(work: Callable[[Progress], T], what: str, step: Callable[[str], None]) -> T:
    warnings.warn(f"{what} runs in this process ({in_process()}): a crash in ONNX Runtime ends it",
                  IsolationWarning, stacklevel=3)
    return work(step)


_caller_waiting = None
"""In a child forked by ``Started``: the event its caller sets once it waits for the result."""


def caller_waits() -> bool:
    """Whether this process is a child of ``Started`` whose caller now only waits for it: the
    child may then use every core (until then it shares them with the caller's work)."""
    return _caller_waiting is not None and _caller_waiting.is_set()


class Started(Generic[T]):
    """``work(progress)`` running in a child: forked for it, or, where ``portable`` (the work
    pickles, and small), the process's worker. The caller collects the result with ``result()``
    (``close()`` when it gives up before). Where no child can be forked, ``result()`` runs the
    work in the calling process (``in_process``)."""

    _count = 0
    """Children started in this process so far: the first (a command line's only one) imports
    for itself, beside its caller, and runs in a child of its own; only a process that isolates
    work again pays for the imports up front (``CHILD_IMPORTS``) and for a worker."""

    def __init__(self, work: Callable[[Progress], T], what: str, timeout: float | None = None,
                 portable: bool = False) -> None:
        again = Started._count > 0
        Started._count += 1
        if again:
            _import_child_modules()
        self.what, self.step, self.done = what, "starting", False
        self.timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        self.spill = self.waiting = self.local = self.worker = None
        if in_process():
            self.local = work
            return
        if portable and again:
            with contextlib.suppress(OSError):  # no worker could be forked: nor can a child, below
                self.worker = _Worker.take()
        if self.worker is not None:
            self.connection, self.process = self.worker.connection, self.worker.process
            try:
                self.connection.send(work)
                return
            except Exception:  # it did not pickle, or the worker is gone: a child of its own runs it
                self.worker.stop()
                self.worker = None
        context = multiprocessing.get_context("fork")
        self.connection, child_sender = context.Pipe(duplex=False)
        self.spill = _spill_file()
        self.waiting = context.Event()
        self.process = _Forked(_child, (work, child_sender, self.spill, self.waiting))
        try:
            _fork(self.process)
        except OSError:  # in_process() says why
            self.local = work
            self.connection.close()
            if self.spill is not None:
                self.spill.close()
        child_sender.close()

    def result(self) -> T:
        """What the work returned; its exception, crash, silence past ``timeout`` or stall
        (``Stalled``) raised here (taking in its progress reports on the way)."""
        if self.local is not None:
            work, self.local, self.done = self.local, None, True
            return _run_here(work, self.what, functools.partial(setattr, self, "step"))
        if self.waiting is not None:
            self.waiting.set()
        try:
            while True:
                self._wait()
                try:
                    kind, payload = self.connection.recv()
                except EOFError:
                    self.process.join()
                    raise NativeFailure(f"{self.what} crashed ({_death(self.process.exitcode)}) while "
                                        f"{self.step}") from None
                if kind == _PROGRESS:
                    self.step = payload
                    continue
                if kind == _SPILLED:
                    assert self.spill is not None  # a child spills only to its file
                    self.spill.seek(0)
                    kind, payload = pickle.load(self.spill)
                self._finish()
                if kind == _RAISED and isinstance(payload, MemoryError):
                    raise OutOfMemory(f"{self.what} ran out of memory while {self.step} (a child may allocate "
                                      f"{(memory_budget() or 0) >> 20:,} MiB beyond its caller's)") from None
                if kind == _RAISED:
                    raise payload
                return payload
        finally:
            if not self.done:  # a crash, a hang, or the caller interrupted
                self._stop()

    def _wait(self) -> None:
        """Until the child sends something: ``timeout`` seconds at most, and while it uses CPU."""
        deadline = time.monotonic() + self.timeout
        watch = _CpuWatch(self.process.pid)
        while not self.connection.poll(max(0.0, min(STALL_CHECK, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise Hung(f"{self.what} did not finish within {self.timeout:g} s (while {self.step}); stopped it")
            if watch.stalled():
                raise Stalled(f"{self.what} used no CPU for {STALL_SECONDS:g} s (while {self.step}), deadlocked; "
                              f"stopped it")

    def close(self) -> None:
        """Stop the work if its result is still to come. A forked child is killed; the worker
        is left to finish it and takes the next work once its result has gone by."""
        if self.local is not None:  # never started
            self.local, self.done = None, True
        if self.done:
            return
        if self.worker is None:
            self._stop()
            return
        self.worker.abandoned += 1
        self._finish()

    def _finish(self) -> None:
        """The child is done with this work: the worker takes the next; a forked child exits on
        its own, not waited for (taking its copy of a large caller down cost more than the work:
        multiprocessing reaps it at the next start or at exit)."""
        self.done = True
        if self.worker is not None:
            self.worker.give_back()
        else:
            self.connection.close()
            if self.spill is not None:
                self.spill.close()

    def _stop(self) -> None:
        self.done = True
        if self.worker is not None:
            self.worker.stop()
        else:
            _end(self.process, self.connection, self.spill)


class _Worker:
    """A child forked once that runs portable work, one piece after another, until its caller
    exits or it has waited ``WORKER_IDLE`` seconds for work. One idle worker is kept per
    process (``take`` makes another when it is busy: threads converting at once)."""

    _idle: _Worker | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.connection, worker_end = multiprocessing.get_context("fork").Pipe()
        self.process = _Forked(_serve, (worker_end, self.connection))
        try:
            _fork(self.process)
        finally:
            worker_end.close()
        self.owner, self.since, self.abandoned = os.getpid(), time.monotonic(), 0

    @classmethod
    def take(cls) -> _Worker:
        """The idle worker when it can take work now, else a new one."""
        with cls._lock:
            worker, cls._idle = cls._idle, None
        if worker is not None and worker.owner == os.getpid():  # a forked caller's copy is its parent's
            if worker._ready():
                return worker
            worker.stop()
        return cls()

    def give_back(self) -> None:
        self.since = time.monotonic()
        with _Worker._lock:
            if _Worker._idle is None:
                _Worker._idle = self
                return
        self.stop()

    def stop(self) -> None:
        _end(self.process, self.connection)

    def _ready(self) -> bool:
        """Alive, not near its idle exit, and past the results of the work given up on."""
        if time.monotonic() - self.since > WORKER_IDLE / 2 or not self.process.is_alive():
            return False
        try:
            while self.abandoned and self.connection.poll(0):
                kind, _ = self.connection.recv()
                self.abandoned -= kind != _PROGRESS
        except Exception:  # the worker died, or what it sent does not unpickle here
            return False
        return not self.abandoned


def _spill_file():
    """An unnamed temporary file for a forked child's result (None where none can be made: the
    result then comes through the pipe alone)."""
    try:
        return tempfile.TemporaryFile()  # noqa: SIM115 (closed by Started._finish or _stop)
    except OSError:
        return None


def _end(process, connection, spill=None) -> None:
    """Kill a child and close its pipe (and spill file), in that order: a child still writing
    would complain."""
    if process.is_alive():
        process.kill()
    connection.close()
    if spill is not None:
        spill.close()


class _Forked:
    """A child process running ``target(*args)``, forked with ``os.fork``: the calls of
    ``multiprocessing.Process`` that isolation uses, without its refusal to start in a daemonic
    process (a ``multiprocessing.Pool`` worker). Ended children are reaped at the next fork (a
    child that exits is not waited for) or by ``is_alive`` and ``join``."""

    _unreaped: set[_Forked] = set()

    def __init__(self, target: Callable[..., None], args: tuple) -> None:
        self.target, self.args = target, args
        self.pid: int | None = None
        self.exitcode: int | None = None

    def start(self) -> None:
        for child in list(_Forked._unreaped):
            child.is_alive()
        budget = memory_budget()
        pid = os.fork()
        if pid == 0:  # the child: it runs the target and exits, whatever happens
            _Forked._unreaped = set()
            try:
                _bound_memory(budget)
                self.target(*self.args)
            finally:
                os._exit(1)
        self.pid = pid
        _Forked._unreaped.add(self)

    def is_alive(self) -> bool:
        return not self._ended(os.WNOHANG)

    def join(self) -> None:
        self._ended(0)

    def kill(self) -> None:
        if self.is_alive():
            assert self.pid is not None  # started: is_alive waited for it
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _ended(self, flags: int) -> bool:
        if self.exitcode is None:
            assert self.pid is not None, "the child is not started"

            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped by someone else (a SIGCHLD handler set to ignore)
                pid, status = self.pid, 0
            if pid == 0:
                return False
            self.exitcode = os.waitstatus_to_exitcode(status)
            _Forked._unreaped.discard(self)
        return True


def _fork(process: _Forked) -> None:
    """Start ``process``; where the system refuses (out of processes or memory), ``in_process``
    says so from then on and the OSError is raised."""
    global _refused
    gc.freeze()  # the child's collector leaves the inherited objects (and their pages) alone
    try:
        process.start()
    except OSError as exc:
        _refused = f"the system refused a child process: {exc.strerror or exc}"
        raise
    finally:
        gc.unfreeze()


def _import_child_modules() -> None:
    for module in CHILD_IMPORTS:
        with contextlib.suppress(ImportError):  # the child meets it too, where the work says what is missing
            importlib.import_module(module)


def _child(work: Callable[[Progress], T], sender, spill, waiting) -> None:
    global _caller_waiting
    _caller_waiting = waiting
    faulthandler.disable()  # the parent reports a crash in one line; no stack dump from here
    _run(work, sender, spill)
    sender.close()
    os._exit(0)  # no atexit handlers or finalizers of the parent's state in the child


def _serve(connection, caller_end) -> None:
    """The worker's loop: work in, progress and result out, until the caller is gone or idle."""
    caller_end.close()
    faulthandler.disable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle; it stops the worker
    while connection.poll(WORKER_IDLE):
        try:
            work = connection.recv()
        except EOFError:
            break
        _run(work, connection)
        del work  # the model it holds goes now, not when the next work comes
        release_free_memory()
    os._exit(0)


def _run(work: Callable[[Progress], T], sender, spill=None) -> None:
    """Run ``work`` and send back its result; a large one goes to ``spill`` (a forked child's
    file) and the pipe carries only ``_SPILLED``, so that the child can exit at once."""
    result: tuple[str, object]
    try:
        result = (_OK, work(lambda text: sender.send((_PROGRESS, text))))
    except BaseException as exc:  # everything goes back to the parent, which re-raises it
        result = (_RAISED, exc)
    try:
        pickled = ForkingPickler.dumps(result)
        if spill is not None and len(pickled) > SPILL_BYTES:
            with contextlib.suppress(OSError):  # a full disk: through the pipe, then
                spill.write(pickled)
                spill.flush()
                pickled = ForkingPickler.dumps((_SPILLED, None))
        sender.send_bytes(pickled)
    except OSError:  # the caller gave up on the work and closed its end: there is nobody to tell
        pass
    except Exception as exc:  # the result did not pickle
        sender.send((_RAISED, RuntimeError(f"{type(result[1]).__name__}: {result[1]} ({exc})")))


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"
