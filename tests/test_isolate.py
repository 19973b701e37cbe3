"""ONNX Runtime runs in a child process: a crash or a hang there is one clear error, never the
end of ``convert`` or ``check``."""

from __future__ import annotations

import functools
import os
import signal
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from amp_rewrite import UserError, convert
from amp_rewrite.runtime import instrument, isolate, ranges, stages
from amp_rewrite.runtime.isolate import Hung, NativeFailure, Started, isolated
from tests.helpers import colors, model


def _segfault(progress):
    progress("doing something fragile")
    os.kill(os.getpid(), signal.SIGSEGV)


def test_a_crash_in_the_child_is_one_error_naming_the_signal_and_the_step() -> None:
    with pytest.raises(NativeFailure, match=r"^demo crashed \(signal SIGSEGV\) while doing something fragile$"):
        isolated(_segfault, "demo")


def test_a_hang_is_stopped_after_the_timeout() -> None:
    started = time.perf_counter()
    with pytest.raises(NativeFailure, match="did not finish within 0.5 s"):
        isolated(lambda progress: time.sleep(30), "demo", timeout=0.5)
    assert time.perf_counter() - started < 10


def test_a_child_allocating_past_its_memory_budget_is_one_error_and_the_next_child_runs(monkeypatch) -> None:
    """The budget is what the child may allocate beyond its caller's data: 64 MiB here, and an
    array of 2 GiB asked for (numpy's MemoryError in the child, OutOfMemory here)."""
    monkeypatch.setattr(isolate, "memory_budget", lambda: 64 << 20)
    with pytest.raises(isolate.OutOfMemory, match=r"^demo ran out of memory while filling "):
        isolated(lambda progress: progress("filling") or float(np.ones(1 << 28).sum()), "demo")
    assert isolated(lambda progress: float(np.ones(1 << 20).sum()), "demo") == 1 << 20


def test_results_and_exceptions_come_back_as_they_are() -> None:
    assert isolated(lambda progress: {"a": np.arange(3)}, "demo")["a"].tolist() == [0, 1, 2]
    with pytest.raises(UserError, match="bad input"):
        isolated(lambda progress: (_ for _ in ()).throw(UserError("bad input")), "demo")



def _waits_seen(asked: int, progress) -> list[bool]:
    """Whether the caller waits: asked at once (then a byte to ``asked``), and again until it does (10 s at most)."""
    seen = [isolate.caller_waits()]
    os.write(asked, b"x")
    deadline = time.monotonic() + 10
    while not isolate.caller_waits() and time.monotonic() < deadline:
        time.sleep(0.01)
    return [*seen, isolate.caller_waits()]


def test_a_child_learns_when_its_caller_only_waits() -> None:
    """The range check's child shares the cores with the caller's analysis until the caller
    asks for the result; its later stages may then use them all. No child: never."""
    read, write = os.pipe()
    try:
        started = Started(functools.partial(_waits_seen, write), "demo")
        assert os.read(read, 1) == b"x"  # the caller works on while the child asks
        assert started.result() == [False, True]
    finally:
        os.close(read)
        os.close(write)
    assert not isolate.caller_waits()

def test_a_large_result_lets_the_child_exit_before_the_caller_reads_it() -> None:
    """Through the pipe alone, a result larger than its buffer would keep the child (and the
    memory it holds) waiting until the caller collects it."""
    started = Started(lambda progress: np.arange(1 << 20), "demo")  # 8 MiB pickled
    deadline = time.monotonic() + 60
    while started.process.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not started.process.is_alive()
    assert started.result().tolist() == list(range(1 << 20))
    assert started.spill.closed


def test_a_large_result_comes_through_the_pipe_where_no_spill_file_can_be_made(monkeypatch) -> None:
    monkeypatch.setattr(isolate, "_spill_file", lambda: None)
    started = Started(lambda progress: np.arange(1 << 18), "demo")
    assert started.spill is None and started.result().tolist() == list(range(1 << 18))


def test_onnxruntime_crashing_on_a_float16_transpose_matmul_leaves_the_caller_alive() -> None:
    """ORT 1.31.1's CPU provider segfaults creating an optimized session for this model."""
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]), helper.make_node("MatMul", ["t", "w"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        [onnx.numpy_helper.from_array(np.ones((4, 5), np.float16), "w")])
    fragile = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    def work(progress):
        progress("creating the session")
        return instrument.run(instrument.session(fragile, optimize="basic"), {"x": np.ones((2, 3, 4), np.float16)})

    try:
        assert isolated(work, "onnxruntime")["y"].shape == (3, 2, 5)  # a fixed onnxruntime
    except NativeFailure as failure:
        assert "crashed (signal SIGSEGV) while creating the session" in str(failure)


@pytest.mark.parametrize("child", ["worker", "forked"])
def test_convert_survives_a_range_check_that_crashes(child, monkeypatch) -> None:
    m = model("(float[2,4] x) => (float[2,4] y) { [allow1] y = MatMul(x, w) }",
              {"w": np.full((4, 4), 3000.0, np.float32)})
    monkeypatch.setattr(stages, "measure", lambda *args: _segfault(lambda text: None))
    monkeypatch.setattr(isolate._Worker, "_idle", None)  # a worker forked before the patch would not crash
    monkeypatch.setattr(isolate.Started, "_count", 1)  # not the process's first child, which is one of its own
    if child == "forked":
        monkeypatch.setattr(ranges, "PORTABLE_NODES", 0)
    out, report = convert(m, provider=None)
    assert report.range_check.startswith("NOT RUN: onnxruntime could not run the model on generated inputs")
    assert "crashed (signal SIGSEGV)" in report.range_check
    assert any(n.startswith("warning: NO RANGE WAS MEASURED") and "'y'" in n for n in report.notes)
    onnx.checker.check_model(out, full_check=True)
    with pytest.raises(UserError, match="range check: onnxruntime could not run the model"):
        convert(m, provider=None, range_check="on")


def _echo(value, delay: float, progress) -> tuple:
    time.sleep(delay)
    return value, os.getpid()


def _portable(work, *args, timeout: float = 60.0) -> Started:
    return Started(functools.partial(work, *args), "demo", timeout, portable=True)


def _worker_pid() -> int:
    """The worker's process id (a process's first isolated work runs in a child of its own)."""
    _portable(_echo, None, 0).result()
    return _portable(_echo, None, 0).result()[1]


def test_portable_work_runs_in_one_worker_one_piece_after_another() -> None:
    worker = _worker_pid()
    first = _portable(_echo, "a", 0).result()
    second = _portable(_echo, "b", 0).result()
    assert first == ("a", worker) and second == ("b", worker) and worker != os.getpid()


def test_a_crash_or_a_hang_in_the_worker_is_one_error_and_the_next_work_gets_a_new_worker() -> None:
    before = _worker_pid()
    with pytest.raises(NativeFailure, match=r"^demo crashed \(signal SIGSEGV\) while doing something fragile$"):
        _portable(_segfault).result()
    value, after = _portable(_echo, "b", 0).result()
    assert value == "b" and after != before
    with pytest.raises(Hung, match="did not finish within 0.5 s"):
        _portable(_echo, "c", 30, timeout=0.5).result()
    value, last = _portable(_echo, "d", 0).result()
    assert value == "d" and last != after


def test_work_given_up_on_never_answers_for_the_next() -> None:
    worker = _worker_pid()
    _portable(_echo, "finished after it was given up", 0.1).close()
    time.sleep(1.0)  # its result is in: the worker takes the next work once it has read past it
    assert _portable(_echo, "b", 0).result() == ("b", worker)
    _portable(_echo, "still running when the next work comes", 30).close()
    value, other = _portable(_echo, "c", 0).result()  # a new worker: the old one is busy
    assert value == "c" and other != worker


def test_work_that_does_not_pickle_runs_in_a_child_of_its_own() -> None:
    assert Started(lambda progress: os.getpid(), "demo", portable=True).result() != os.getpid()


def test_a_child_that_uses_no_cpu_is_stopped_as_deadlocked(monkeypatch) -> None:
    """A child that stops using CPU (a lock inherited held from the forking caller: ONNX Runtime
    creating a session once hung so, for the 900 s time limit) is stopped after STALL_SECONDS;
    one that works past that is not."""
    monkeypatch.setattr(isolate, "STALL_SECONDS", 1.0)
    monkeypatch.setattr(isolate, "STALL_CHECK", 0.1)
    started = time.perf_counter()
    with pytest.raises(isolate.Stalled, match=r"^demo used no CPU for 1 s \(while waiting\), deadlocked; stopped it$"):
        isolated(lambda progress: (progress("waiting"), time.sleep(30)), "demo")
    assert time.perf_counter() - started < 10

    def busy(progress):
        until = time.perf_counter() + 2.5
        while time.perf_counter() < until:
            pass
        return "done"

    assert isolated(busy, "demo") == "done"


def test_a_range_check_that_deadlocks_is_measured_again(monkeypatch, tmp_path) -> None:
    """The measurement started beside the analysis stalls: the values are measured again in a
    new child, and the check runs."""
    monkeypatch.setattr(isolate, "STALL_SECONDS", 1.0)
    monkeypatch.setattr(isolate, "STALL_CHECK", 0.1)
    measure = stages.measure
    stalled = tmp_path / "stalled"  # the children are forked: a file says whether one stalled already

    def first_stalls(*args):
        if not stalled.exists():
            stalled.touch()
            time.sleep(30)
        return measure(*args)

    monkeypatch.setattr(stages, "measure", first_stalls)
    monkeypatch.setattr(ranges, "PORTABLE_NODES", 0)  # each measurement in a child of its own
    m = model("(float[2,4] x) => (float[2,4] y) { [allow1] y = MatMul(x, w) }",
              {"w": np.full((4, 4), 3000.0, np.float32)})
    out, report = convert(m, provider=None)
    assert report.range_check.startswith("measured"), report.range_check
    assert colors(out)["allow1"] == "fp32"  # 3000 x 4 x |x| is beyond 65504 / 16


@pytest.mark.parametrize("raw, said", [
    ("[ONNXRuntimeError] : 1 : FAIL : /onnxruntime_src/onnxruntime/core/graph/model.cc:256 onnxruntime::Model::Model("
     "onnx::ModelProto&&, const onnxruntime::PathString&, const onnxruntime::ModelOptions&) Unsupported model IR "
     "version: 14, max supported IR version: 13",
     "[ONNXRuntimeError] : 1 : FAIL : Unsupported model IR version: 14, max supported IR version: 13"),
    ("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Reshape node. Name:'r' Status "
     "Message: /onnxruntime_src/onnxruntime/core/providers/cpu/tensor/reshape_helper.h:91 onnxruntime::ReshapeHelper"
     "::ReshapeHelper(const onnxruntime::TensorShape&, onnxruntime::TensorShapeVector&, bool) input_shape_size == "
     "requested_shape_size was false.\nsecond line",
     "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Reshape node. Name:'r' Status "
     "Message: input_shape_size == requested_shape_size was false."),
    ("no signature here (a parenthesis)", "no signature here (a parenthesis)"),
])
def test_onnxruntimes_errors_are_read_past_its_source_locations_and_signatures(raw, said) -> None:
    """The reason came after 200 characters of file name and C++ signature, and was cut off."""
    assert instrument.first_line(RuntimeError(raw)) == said
