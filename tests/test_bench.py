"""``amp-rewrite bench``: timing with I/O binding, the profile's breakdown, reasons and the verdict.

They run on the CPU provider, which has almost no float16 kernels: a model converted for CUDA
shows the fallbacks, and the verdict is "does not pay" with that reason. Timings are never
asserted against a figure; only their consistency is."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from helpers import model
from test_cli import amp

import amp_rewrite
from amp_rewrite.errors import UserError
from amp_rewrite.runtime.timing import NodeTime, Timed, node_times, time_models
from amp_rewrite.workflows.bench import ModelBench, bench, model_node, off_tensor_cores, verdict
from models import builders

TEXT = "(float[4,16] x) => (float[4,16] y) { [mm] h = MatMul(x, w)  [act] r = Relu(h)  [sm] y = Softmax(r) }"
FAST = dict(warmup=1, runs=5, profile_runs=2)


def _model() -> onnx.ModelProto:
    return model(TEXT, {"w": np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32)})


def _event(name: str, op: str, dur: int, types: list[str], shapes: list[list[int]] | None = None) -> dict:
    shapes = shapes or [[4, 16]] * len(types)
    return {"cat": "Node", "name": f"{name}_kernel_time", "dur": dur,
            "args": {"op_name": op, "input_type_shape": [{t: s} for t, s in zip(types, shapes)],
                     "provider": "CPUExecutionProvider" if op == "Shape" else "CUDAExecutionProvider"}}


def test_node_times_average_per_run_leave_out_warm_runs_and_sort_kinds() -> None:
    events = [
        _event("mm", "MatMul", 1000, ["float16", "float16"]),  # the first run: left out
        {"cat": "Session", "name": "model_run", "dur": 99999},
        _event("mm", "MatMul", 300, ["float16", "float16"]),
        _event("mm", "MatMul", 500, ["float16", "float16"]),
        _event("InsertedPrecisionFreeCast_x", "Cast", 40, ["float16"]),
        _event("c", "Cast", 20, ["float"]),
        _event("copy", "MemcpyToHost", 10, ["float"]),
        _event("ln", "LayerNormalization", 200, ["float", "float"]),
        _event("shape", "Shape", 5, ["int64"]),
        {"cat": "Node", "name": "mm_fence_before", "dur": 7, "args": {}},
    ]
    by_name = {n.name: n for n in node_times(events, skip=1)}
    assert by_name["mm"].ms == pytest.approx(0.4) and by_name["mm"].kind == "float16"
    assert by_name["mm"].input_shapes == [[4, 16], [4, 16]]
    assert set(by_name) == {"mm"}  # the nodes seen once ran only in the left-out run
    again = {n.name: n for n in node_times(events)}
    assert again["mm"].ms == pytest.approx(0.6)
    assert (again["mm"].provider, again["shape"].provider) == ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert {n: t.kind for n, t in again.items()} == {
        "mm": "float16", "InsertedPrecisionFreeCast_x": "inserted cast", "c": "cast", "copy": "copy",
        "ln": "float32", "shape": "other"}


@pytest.mark.parametrize("op, weight, expected", [
    ("MatMul", [768, 3072], None),
    ("MatMul", [768, 3070], [768, 3070]),
    ("MatMul", [12, 64], [12, 64]),
    ("Gemm", [1000, 2048], None),
    ("Conv", [64, 3, 7, 7], [64, 3]),
    ("Conv", [64, 32, 3, 3], None),
    ("Relu", [3, 5], None),
])
def test_matrix_products_and_convolutions_off_tensor_cores(op, weight, expected) -> None:
    node = NodeTime("n", op, "float16", 1.0, [[1, 8], weight])
    assert off_tensor_cores(node, lambda n, i: n.input_shapes[i]) == expected


def test_a_profiled_name_maps_to_the_model_node_it_stands_for() -> None:
    nodes, producers = {"conv_node", "mm"}, {"relu_1": "relu_node_1", "y": "mm"}
    assert model_node("mm", nodes, producers) == "mm"
    assert model_node("InsertedPrecisionFreeCast_relu_1_nchwc", nodes, producers) == "relu_node_1"
    assert model_node("mm/MatMulAddFusion", nodes, producers) == "mm"
    assert model_node("mm/MatMulScaleFusion/", nodes, producers) == "mm"
    assert model_node("Sub_13", nodes, producers) is None


def _row(speedup: float, off: list | None = None) -> ModelBench:
    row = ModelBench("mixed", 1.0, 0.9, 1.1, 1000.0, speedup, None, {})
    row.off_tensor_cores = off or []
    return row


def test_the_verdict_names_the_cause_that_costs_the_most_time() -> None:
    low = [NodeTime("mm", "MatMul", "float16", 1.0, [])]
    assert verdict(_row(1.8), low, [], set(), "CUDAExecutionProvider", "float16").startswith(
        "pays: 1.80x float32's speed on CUDAExecutionProvider; 100% of the profiled time is in float16 kernels")
    noisy = _row(1.8)
    noisy.p90_ms = 2.0  # float32's median is 1.8 ms: more than a tenth of the mixed runs were slower
    assert verdict(noisy, low, [], set(), "P", "float16").startswith(
        "inconclusive: 1.80x float32's speed on P, but a tenth of the runs or more were no faster than float32's "
        "median (2 ms against 1.8 ms)")
    casts = [*low, NodeTime("c1", "Cast", "cast", 3.0, []), NodeTime("ln", "LayerNormalization", "float32", 0.5, [])]
    text = verdict(_row(0.9), casts, [NodeTime("mm", "MatMul", "float32", 1.5, [])], set(), "P", "float16")
    assert text.startswith("does not pay: 0.90x") and "the model's 1 casts take 3 ms per run (67%)" in text
    fallback = [*low, NodeTime("sm", "Softmax", "float32", 5.0, []),
                NodeTime("InsertedPrecisionFreeCast_h", "Cast", "inserted cast", 1.0, [])]
    row = _row(0.5)
    row.fallbacks = {"Softmax": 1}
    text = verdict(row, fallback, [], {"sm"}, "CPUExecutionProvider", "float16")
    assert "CPUExecutionProvider has no float16 kernel for Softmax" in text and "inserted 1 casts" in text
    slow = verdict(_row(0.8), [NodeTime("mm", "MatMul", "float16", 4.0, [])],
                   [NodeTime("mm", "MatMul", "float32", 1.0, [])], set(), "P", "float16")
    assert "float16 kernels are no faster than its float32 ones here (4 ms per run against 1 ms" in slow
    nothing = verdict(_row(1.0), [NodeTime("mm", "MatMul", "float32", 4.0, [])], [], set(), "P", "float16")
    assert nothing.endswith("main reason: nothing ran in float16: the model has no float16 node that P runs")
    off = [NodeTime("mm", "MatMul", "float16", 4.0, [])]
    text = verdict(_row(1.0, [type("O", (), {"node": "mm"})()]), off, [NodeTime("mm", "MatMul", "float32", 4.5, [])],
                   set(), "P", "float16")
    assert "1 matrix products or convolutions have weight dimensions that are not multiples of 8" in text


def test_time_models_interleaves_runs_binds_io_and_profiles_each_node_in_the_precision_it_ran() -> None:
    mixed, _ = amp_rewrite.convert(_model(), provider="CUDAExecutionProvider")
    broken = onnx.ModelProto()
    broken.CopyFrom(mixed)
    broken.graph.node[1].op_type = "NoSuchOp"
    sample = [{"x": np.ones((4, 16), np.float32)}]
    fp32, refused, low = time_models([Timed("fp32", _model(), None, sample), Timed("broken", broken, None, sample),
                                      Timed("mixed", mixed, None, sample)], "CPUExecutionProvider", 2, 7, 3)
    assert "NoSuchOp" in refused
    for timing in (fp32, low):
        assert len(timing.latencies_ms) == 7 and all(t > 0 for t in timing.latencies_ms)
        assert timing.percentile(10) <= timing.percentile(50) <= timing.percentile(90)
        assert timing.runs_per_second == pytest.approx(7000 / sum(timing.latencies_ms))
        assert "I/O binding" in timing.binding and timing.device_memory_bytes is None
        assert not timing.host_side_profile and all(n.ms >= 0 for n in timing.nodes)
    by_name = {n.name: n for n in low.nodes}
    # float16 in the model; the CPU provider has no float16 MatMul, so ONNX Runtime ran it in float32
    assert (by_name["mm"].op_type, by_name["mm"].kind, by_name["mm"].input_shapes[0]) == ("MatMul", "float32", [4, 16])


def test_bench_converts_for_the_provider_and_explains_what_stays_float32() -> None:
    result = bench(_model(), provider="CPUExecutionProvider", **FAST)
    assert [m.label for m in result.models] == ["float32", "amp-rewrite"]
    base, mixed = result.models
    assert base.speedup == 1.0 and mixed.speedup == pytest.approx(base.median_ms / mixed.median_ms)
    assert all(m.p10_ms <= m.median_ms <= m.p90_ms for m in result.models)
    assert "of 3 float nodes in float16" in result.conversion
    reasons = {n.node: n.reason for n in mixed.float32_nodes}
    assert "CPUExecutionProvider has no float16 kernel for MatMul" in reasons["mm"]
    assert not mixed.fallbacks  # converted for the CPU: nothing it runs in float32 was left in float16
    assert result.verdict.startswith("amp-rewrite: ")
    assert sum(o.ms for o in mixed.by_op) == pytest.approx(sum(mixed.time_by_kind.values()))


def test_bench_times_generated_inputs_the_float32_model_runs_on() -> None:
    """A feature pyramid refuses 8x8 images (and 1, 2, 4); bench took only the first set of
    extents and refused Ultralytics' YOLO exports; it goes on to the total stride, as the range
    check and ``check`` do, and a model that runs on none is still one error."""
    result = bench(builders.feature_pyramid(), provider="CPUExecutionProvider", **FAST)
    assert [m.label for m in result.models] == ["float32", "amp-rewrite"] and result.samples == 1
    with pytest.raises(UserError, match="cannot run the float32 model: .*Concat"):
        bench(builders.feature_pyramid(), provider="CPUExecutionProvider", shapes={"x0": (1, 3, 8, 8)}, **FAST)


def test_bench_of_given_models_shows_the_cpu_fallbacks_and_amp_rewrites_view(tmp_path) -> None:
    original = tmp_path / "m.onnx"
    onnx.save(_model(), original)
    for provider, name in (("CUDAExecutionProvider", "cuda.onnx"), ("CPUExecutionProvider", "cpu.onnx")):
        onnx.save(amp_rewrite.convert(_model(), provider=provider)[0], tmp_path / name)
    result = bench(str(original), [str(tmp_path / "cuda.onnx"), str(tmp_path / "cpu.onnx")],
                   provider="CPUExecutionProvider", **FAST)
    cuda, cpu = result.models[1:]
    assert (cuda.label, cpu.label, result.conversion) == ("cuda.onnx", "cpu.onnx", "")
    assert cuda.fallbacks.get("MatMul") == 1 and not cpu.fallbacks
    reasons = {n.node: n.reason for n in cuda.float32_nodes}
    assert "float16 in the model, but CPUExecutionProvider has no float16 kernel for it: it ran in float32" \
        in reasons["mm"]
    assert {n.node: n.reason for n in cpu.float32_nodes}["mm"] == (
        "amp-rewrite would keep it float32: allow: CPUExecutionProvider has no float16 kernel for MatMul at opset 17")
    assert cuda.verdict.startswith(("pays: ", "inconclusive: ") if cuda.speedup >= 1.1 else "does not pay: ")


def test_cli_bench_prints_the_table_and_writes_the_report(tmp_path) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(_model(), source)
    done = amp("bench", str(source), "--provider", "CPUExecutionProvider", "--runs", "4", "--warmup", "1",
               "--profile-runs", "2", "--random", "2", "--report", str(tmp_path / "r.json"))
    assert done.returncode == 0, done.stderr
    assert "amp-rewrite bench on CPUExecutionProvider: 2 samples, 1 warm-up and 4 timed runs" in done.stdout
    assert "\nverdict: amp-rewrite: " in done.stdout and "slowest float32 nodes:" in done.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["samples"] == 2 and [m["label"] for m in report["models"]] == ["float32", "amp-rewrite"]
    assert report["models"][1]["float32_nodes"][0]["reason"]


@pytest.mark.parametrize("args, message", [
    (["--runs", "0"], "runs must be at least 1, got 0"),
    (["--random", "0"], "--random must be at least 1"),
    (["--provider", "NoSuchExecutionProvider"], "NoSuchExecutionProvider is not available"),
    (["--shape", "nope:1x2"], "--shape names nope"),
    (["MISSING"], "input file not found"),
])
def test_cli_bench_bad_input_is_one_line_and_exit_2(args, message, tmp_path) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(_model(), source)
    missing = [str(tmp_path / "missing.onnx")] if args == ["MISSING"] else []
    done = amp("bench", str(source), *missing, "--runs", "2", "--profile-runs", "0", *args[len(missing):])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr


def test_bench_rejects_negative_counts() -> None:
    with pytest.raises(UserError, match="warmup must be at least 0"):
        bench(_model(), provider="CPUExecutionProvider", warmup=-1)
