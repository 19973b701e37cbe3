"""The API wherever users call it: in ``multiprocessing.Pool`` workers (daemonic processes,
forked or spawned), ``ProcessPoolExecutor`` workers and threads the conversion is the one the
main process makes, and a native crash in the range check is still one clear line there. Where
no child process can be had, the work runs in the caller, and says so."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import signal
import threading

import numpy as np
import onnx
import pytest

from amp_rewrite import convert
from amp_rewrite.runtime import isolate, stages
from tests.helpers import colors, model

pytestmark = pytest.mark.xdist_group("processes")


def _overflowing() -> bytes:
    """A MatMul whose output (3000 x 4 x |x|) the range check measures beyond float16."""
    return model("(float[2,4] x) => (float[2,4] y) { [allow1] y = MatMul(x, w) }",
                 {"w": np.full((4, 4), 3000.0, np.float32)}).SerializeToString()


def _convert(data: bytes, crash: bool = False) -> tuple[bytes, str]:
    """What a worker does: convert, with the range check's ONNX Runtime run segfaulting where ``crash``."""
    if crash:  # the worker (``isolate._Worker``) forked by an earlier conversion would not crash
        stages.measure = lambda *args: os.kill(os.getpid(), signal.SIGSEGV)
        isolate._Worker._idle = None
    out, report = convert(onnx.ModelProto.FromString(data), provider=None)
    return out.SerializeToString(), report.range_check


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_pool_worker_converts_as_the_main_process_does(method) -> None:
    data = _overflowing()
    here, line = _convert(data)
    assert line == "measured 1 values on generated inputs; 1 do not fit float16"
    with multiprocessing.get_context(method).Pool(2) as pool:
        assert pool.starmap(_convert, [(data,), (data,)]) == [(here, line)] * 2
        crashed = pool.apply(_convert, (data, True))[1]
    assert crashed.startswith("NOT RUN: onnxruntime could not run the model on generated inputs")
    assert "crashed (signal SIGSEGV)" in crashed


def test_a_process_pool_executor_worker_converts_as_the_main_process_does() -> None:
    data = _overflowing()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        assert pool.submit(_convert, data).result() == _convert(data)
        assert "crashed (signal SIGSEGV)" in pool.submit(_convert, data, True).result()[1]


def test_threads_convert_at_once_as_one_does() -> None:
    data = _overflowing()
    results: list = [None] * 3

    def run(i: int) -> None:
        results[i] = _convert(data)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [_convert(data)] * 3


@pytest.mark.parametrize("refused", ["no fork", "fork refused"])
def test_where_no_child_can_be_had_the_range_check_runs_here_and_says_so(refused, monkeypatch) -> None:
    if refused == "no fork":
        monkeypatch.setattr(isolate, "FORKS", False)
    else:
        def fork():
            raise BlockingIOError(11, "Resource temporarily unavailable")

        monkeypatch.setattr(isolate.os, "fork", fork)
        monkeypatch.setattr(isolate._Worker, "_idle", None)
    monkeypatch.setattr(isolate, "_refused", None)
    pid = os.getpid()
    with pytest.warns(isolate.IsolationWarning, match="runs in this process"):
        assert isolate.isolated(lambda progress: os.getpid(), "demo") == pid
    with pytest.warns(isolate.IsolationWarning):
        out, report = convert(onnx.ModelProto.FromString(_overflowing()), provider=None)
    assert report.range_check == "measured 1 values on generated inputs; 1 do not fit float16"
    assert colors(out)["allow1"] == "fp32"
    why = "this platform cannot fork" if refused == "no fork" else "the system refused a child process"
    assert any(note.startswith("note: the range check ran in this process") and why in note
               for note in report.notes), report.notes
