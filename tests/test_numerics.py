"""Numerics you can trust: emulation, check, localization, calibration and validation.

The broken models here really break in float16 once every node runs low (the
``all-low`` policy other converters apply): a decomposed LayerNorm whose sum of
squares overflows, probabilities under 6e-8 fed to a Log, a BatchNorm variance
of 1e8, and a cancellation that float16 cannot resolve.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
import xml.etree.ElementTree as ET

import ml_dtypes
import numpy as np
import onnx
import pytest

import amp_rewrite
from amp_rewrite import check
from amp_rewrite.cli import main
from amp_rewrite.inputs import samples
from amp_rewrite.numerics.compare import values
from amp_rewrite.numerics.localize import MIN_GROWTH
from amp_rewrite.runtime import instrument
from amp_rewrite.runtime.emulate import emulated
from amp_rewrite.runtime.isolate import NativeFailure
from models import builders
from models.node_suite import float_cases
from tests.helpers import model, rms_norm, rng, run
from tests.node_suite import emulation_ulps

EMULATION_ULPS = 4
"""Emulated outputs agree with the reference evaluator's float16 run within this many
float16 ulps of the output's largest magnitude."""
EMULATION_EXCEPTIONS = {
    "test_gru_bidirectional": "the evaluator rounds the GRU's hidden state to float16 at every time step; "
                              "the emulation, like a fused GPU kernel, rounds only the outputs",
}


def _layer_norm_model() -> onnx.ModelProto:
    return builders.fragile_layer_norm()[0]


def _layer_norm_data() -> dict:
    return builders.fragile_layer_norm()[1]


def _all_low(m: onnx.ModelProto, **options) -> onnx.ModelProto:
    return amp_rewrite.convert(m, policy="all-low", range_check="off", **options)[0]


def _low_share(report: amp_rewrite.Report) -> float:
    return report.low_nodes / report.candidates


# --- emulation -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_emulation_agrees_with_the_reference_evaluator_on_node_cases() -> None:
    compared, failures, still_failing = 0, [], set()
    for case in float_cases():
        gap = emulation_ulps(case)
        if isinstance(gap, str):
            continue
        compared += 1
        if gap > EMULATION_ULPS:
            (still_failing.add if case.name in EMULATION_EXCEPTIONS else failures.append)(f"{case.name}: {gap}")
    assert compared > 700, "too few node cases ran with low-precision nodes"
    assert not failures, "emulation disagrees with the reference evaluator:\n" + "\n".join(failures)
    assert len(still_failing) == len(EMULATION_EXCEPTIONS), "an exception no longer applies"


@pytest.mark.parametrize("name", [n for n in builders.SAMPLES if n != "control_flow"])
def test_emulation_agrees_with_the_reference_evaluator_on_samples(name: str) -> None:
    mixed = amp_rewrite.convert(builders.SAMPLES[name]())[0]
    feeds = samples.generate(mixed)[0]
    got = instrument.run(instrument.session(emulated(mixed)), feeds)
    for info, want in zip(mixed.graph.output, run(mixed, **feeds)):
        scale = np.spacing(np.float16(np.abs(want).max())).astype(np.float64)
        assert np.abs(got[info.name].astype(np.float64) - want).max() <= EMULATION_ULPS * scale


def test_control_flow_emulation_matches_float32_where_the_evaluator_cannot_run_loops() -> None:
    """onnx's evaluator gets this Loop wrong on the float32 model itself, so the emulation
    is held to the float32 ONNX Runtime run within float16 tolerance instead."""
    original = builders.SAMPLES["control_flow"]()
    feeds = samples.generate(original)[0]
    fp32 = instrument.run(instrument.session(original), feeds)["y"]
    assert not np.allclose(run(original, **feeds)[0], fp32, rtol=1e-3), "the evaluator's Loop is fixed: compare"
    got = instrument.run(instrument.session(emulated(amp_rewrite.convert(original)[0])), feeds)["y"]
    assert np.linalg.norm(got - fp32) / np.linalg.norm(fp32) < 1e-2
    assert not np.array_equal(got, fp32), "nothing was rounded"


@pytest.mark.parametrize("precision, numpy_type", [("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)])
def test_emulation_rounds_overflows_and_flushes_as_the_low_type_stores(precision: str, numpy_type) -> None:
    m = model("(float[6] x) => (float[6] y) { [mul] h = Mul(x, k) [relu] y = Relu(h) }",
              {"k": np.array(3.0, np.float32)})
    mixed = _all_low(m, precision=precision)
    x = np.array([1e-8, 1.0001, 3.14159, 30000, -2, 7e37], np.float32)
    got = instrument.run(instrument.session(emulated(mixed)), {"x": x})["y"]
    with np.errstate(over="ignore"):
        stored = (x.astype(numpy_type).astype(np.float32) * 3).astype(numpy_type)
    expected = np.maximum(stored, 0).astype(np.float32)
    np.testing.assert_array_equal(got, expected)
    if precision == "float16":
        assert got[0] == 0 and np.isinf(got[3]), "float16 flush and overflow must show"


# --- check and localize ----------------------------------------------------------------------------------


def test_check_fails_an_overflowing_layer_norm_and_localizes_the_square() -> None:
    m = _layer_norm_model()
    result = check(m, _all_low(m), inputs=[_layer_norm_data()], localize_failures=True)
    assert not result and result.failed_outputs == ["y"]
    assert result.outputs[0].errors.rel_l2 > 0.5  # d / sqrt(inf): the output collapses to zero
    assert result.suspects[0].node == "square" and result.suspects[0].nonfinite
    assert "--keep-fp32-node square" in result.fix and result.unlocalized is None
    assert "emulated float16" in result.mode


def test_localize_blames_the_softmax_whose_probabilities_flushed_to_zero() -> None:
    m, data = builders.fragile_log_softmax()
    result = check(m, _all_low(m), inputs=[data], localize_failures=True)
    assert not result and result.failed_outputs == ["y"]
    assert result.suspects[0].node == "softmax", result.table()



def test_localize_finds_the_culprit_of_a_failure_smaller_than_its_noise_floor() -> None:
    """A regression fails elementwise on its outputs near zero with a relative L2 error under
    MIN_GROWTH (a scikit-learn PCA + Ridge pipeline: the centring cancels in float16): a node
    growing it by half of that is blamed, where a fixed floor blamed none."""
    m = model("""(float[64,12] x) => (float[64,1] y) {
        [centre] c = Sub(x, mean)
        [project] p = MatMul(c, t)
        [regress] y = MatMul(p, coef)
    }""", {"mean": np.full(12, 0.5, np.float32), "t": rng(1).normal(0, 1, (12, 6)).astype(np.float32),
           "coef": rng(2).normal(0, 1000, (6, 1)).astype(np.float32)})
    data = {"x": rng(3).uniform(0, 1, (64, 12)).astype(np.float32)}
    result = check(m, _all_low(m), inputs=[data], localize_failures=True)
    assert not result and result.outputs[0].errors.rel_l2 < MIN_GROWTH
    assert result.suspects[0].node == "centre" and result.fix == "--keep-fp32-node centre", result.table()


def _deep_rotations(depth: int = 32, width: int = 16) -> tuple[onnx.ModelProto, dict]:
    """``depth`` MatMuls by orthogonal matrices: each float16 rounding adds about the same small
    error, and none stands out."""
    r = rng(7)
    body = "\n".join(f"[rot{i}] h{i + 1} = MatMul(h{i}, q{i})" for i in range(depth))
    weights = {f"q{i}": np.linalg.qr(r.standard_normal((width, width)))[0].astype(np.float32) for i in range(depth)}
    m = model(f"(float[8,{width}] h0) => (float[8,{width}] h{depth}) {{ {body} }}", weights)
    return m, {"h0": r.standard_normal((8, width)).astype(np.float32)}


def test_a_failure_no_node_stands_out_in_is_explained_not_localized() -> None:
    """Error that builds up evenly over a deep model (the timm exports mobilenetv4_conv_small, dla34
    with random weights fail elementwise at rel L2 5e-4 to 1e-3 this way, and so does the ORT script's
    conversion): no suspect, no fix, and a line saying why and what judges such a model."""
    m, data = _deep_rotations()
    mixed = _all_low(m)
    tight = amp_rewrite.numerics.compare.Tolerance(rtol=1e-4, atol=1e-4)
    result = check(m, mixed, inputs=[data], tolerance=tight, localize_failures=True)
    assert not result and result.suspects == [] and result.fix is None, result.table()
    assert result.unlocalized.startswith("localization: no node grows the relative error by more than")
    assert "(the most: MatMul 'rot" in result.unlocalized and result.unlocalized in result.table()
    assert check(m, mixed, inputs=[data], tolerance=dataclasses.replace(tight, metric="rel-l2", rtol=1e-2))
    _, report = amp_rewrite.convert(m, policy="all-low", validate=[data], tolerance=tight)
    assert not report.validation.passed and report.validation.kept_fp32 == {}
    stopped = report.validation.stopped
    assert stopped.startswith("localization: no node grows") and "(the most: MatMul 'rot" in stopped
    assert stopped in report.validation.summary()


def test_check_passes_the_default_conversion_of_the_same_models() -> None:
    for m, data in ((_layer_norm_model(), _layer_norm_data()),):
        assert check(m, amp_rewrite.convert(m)[0], inputs=[data])


def test_batch_norm_variance_of_1e8_breaks_only_when_forced_low() -> None:
    r = rng(5)
    m = model("""(float[2,4,8,8] x) => (float[2,4,8,8] y) {
      [conv] c = Conv<pads=[1,1,1,1]>(x, w)
      [bn] y = BatchNormalization(c, scale, bias, mean, var)
    }""", {"w": r.standard_normal((4, 4, 3, 3)).astype(np.float32), "scale": np.full(4, 1e4, np.float32),
           "bias": np.zeros(4, np.float32), "mean": np.zeros(4, np.float32),
           "var": np.full(4, 1e8, np.float32)})
    default, report = amp_rewrite.convert(m)
    assert "var" in report.constants_kept_fp32
    assert check(m, default, random=2)
    forced = amp_rewrite.convert(m, force_low_nodes=["bn"])[0]
    result = check(m, forced, random=2, localize_failures=True)
    assert not result and result.failed_outputs == ["y"]
    assert result.suspects[0].node == "bn"


def test_check_reports_metrics_json_and_junit(tmp_path) -> None:
    m = _layer_norm_model()
    result = check(m, _all_low(m), inputs=[_layer_norm_data()], random=2)
    assert result.samples == 3 and result.runs == 9 and result.deployed == "compared"
    parsed = json.loads(result.to_json())
    assert parsed["passed"] is False and parsed["outputs"][0]["name"] == "y"
    suite = ET.fromstring(result.to_junit())
    assert suite.get("failures") == "1" and suite.find("testcase/failure") is not None
    assert "y" in result.table() and "FAIL" in result.table()


def test_check_judges_the_mixed_model_as_onnxruntime_deploys_it(tmp_path) -> None:
    """ONNX Runtime 1.31's default optimizations share the two float16 epsilons, then fuse each
    RMSNorm with epsilon 1e-5 instead of 1e-6: 18% off here, though the graph's own numerics
    (the emulation of the unoptimized graph) are within 1e-3. The peer's float16 output of
    Hugging Face's Llama, Qwen2 and Gemma exports deviates 1.1e-2 on CPU and CUDA this way.
    ONNX Runtime 1.32 fixed it: where the installed runtime has the bug no more, the same model
    passes as deployed."""
    m = model("(float[4,64] x) => (float[4,64] y) {" + rms_norm(0, "x", "y0") + "\n z = Mul(y0, k)"
              + rms_norm(1, "z", "y") + "\n}", {"w": np.ones(64, np.float32), "k": np.array(0.005, np.float32)})
    data = {"x": rng(2).normal(0, 0.005, (4, 64)).astype(np.float32)}
    low = _all_low(m, force_low_ops=["Add"])  # a float16 model as the peers write it (KeepRmsEpsilons spares ours)

    result = check(m, low, inputs=[data])
    deployed = instrument.run(instrument.session(low, optimize="all"), data)["y"]
    if np.linalg.norm(deployed - run(m, **data)[0]) < 0.1 * np.linalg.norm(run(m, **data)[0]):  # no bug here
        assert result and result.deployed == "compared" and result.runs == 3, result.table()
        return

    # 4 runs: float32, mixed, mixed as deployed, and float32 as deployed, against which it fails as well
    assert not result and result.deployed == "compared" and result.runs == 4
    assert result.outputs[0].run == "as deployed" and result.outputs[0].errors.rel_l2 > 0.1
    assert "fails only as deployed" in result.table()
    native = check(m, low, inputs=[data], emulate=False)  # the unoptimized graph run as it is, then as deployed
    assert not native and native.runs == 4 and native.outputs[0].run == "as deployed"
    emulated_only = check(m, low, inputs=[data], deployed=False)
    assert emulated_only and emulated_only.deployed == "off" and emulated_only.outputs[0].errors.rel_l2 < 1e-3
    default = check(m, amp_rewrite.convert(m, inputs=[data])[0], inputs=[data])
    assert default and default.deployed == "compared"
    onnx.save(m, tmp_path / "m.onnx")
    onnx.save(low, tmp_path / "low.onnx")
    np.savez(tmp_path / "d.npz", **data)
    command = ["check", str(tmp_path / "m.onnx"), str(tmp_path / "low.onnx"), "--inputs", str(tmp_path / "d.npz")]
    assert main(command) == 1 and main([*command, "--no-deployed"]) == 0
    _, report = amp_rewrite.convert(m, policy="all-low", range_check="off", force_low_ops=["Add"], validate=[data])
    validation = report.validation
    assert not validation.passed and validation.rounds == 1 and validation.deployed == "compared"
    assert validation.outputs[0].run == "as deployed" and "(as deployed)" in validation.summary()


@pytest.mark.parametrize("failure, passes", [
    (NativeFailure("onnxruntime (mixed model as deployed) crashed (signal SIGSEGV)"), True),
    (RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Invalid model."), False),
], ids=["crash", "refusal"])
def test_a_deployed_run_that_crashes_leaves_the_emulated_verdict_and_a_refusal_fails(monkeypatch, failure,
                                                                                      passes) -> None:
    """ONNX Runtime's CPU provider crashes on some float16 graphs that CUDA runs: the emulated
    verdict stands. A model ONNX Runtime refuses once its optimizations rewrote it cannot be
    deployed at those settings on any provider: every output fails."""
    from amp_rewrite.numerics import check as numerics

    original_run = numerics.run_model

    def failing(model, base_dir, provider, data, emulate=False, watch=(), thresholds=None, what="model",
                optimize="none"):
        if optimize != "none":
            raise failure
        return original_run(model, base_dir, provider, data, emulate, watch, thresholds, what, optimize)

    monkeypatch.setattr(numerics, "run_model", failing)
    m = _layer_norm_model()
    result = check(m, amp_rewrite.convert(m)[0], inputs=[_layer_norm_data()])
    assert bool(result) is passes and result.runs == 2
    if passes:
        assert result.deployed.startswith("did not run: onnxruntime (mixed model as deployed) crashed")
        assert "as deployed: did not run" in result.table()
    else:
        assert result.deployed.startswith("refused: ONNX Runtime at its default optimizations: [ONNXRuntimeError]")
        assert all(not o.passed and o.run == "as deployed" for o in result.outputs)


def test_tolerance_per_output_and_metric() -> None:
    m = model("(float[64] x) => (float[64] y) { [shift] a = Add(x, big) [unshift] y = Sub(a, big) }",
              {"big": np.array(1000, np.float32)})
    mixed = _all_low(m)
    assert not check(m, mixed)
    passed = check(m, mixed, tolerances={"y": amp_rewrite.Tolerance(rtol=1, atol=1)})
    assert passed and "; y: elementwise, rtol=1 atol=1" in passed.table()  # the table says what judged y
    assert not check(m, mixed, tolerance=amp_rewrite.Tolerance(rtol=0.05, metric="rel-l2"))
    assert check(m, mixed, tolerance=amp_rewrite.Tolerance(rtol=0.5, metric="rel-l2"))



def test_a_classifier_s_sequence_of_maps_is_compared_by_its_probabilities() -> None:
    """scikit-learn classifiers end in ZipMap: a list of {class: probability} dicts per row,
    compared as the [rows, classes] array of probabilities, not as objects that never match."""
    text = """<ir_version: 8, opset_import: ["" : 17, "ai.onnx.ml" : 3]>
        classifier (float[N,4] x) => (seq(map(int64, float)) probs) {
            logits = MatMul(x, w)
            p = Softmax(logits)
            probs = ai.onnx.ml.ZipMap<classlabels_int64s = [3, 5, 7]>(p)
        }"""

    def classifier(scale: float) -> onnx.ModelProto:
        m = onnx.parser.parse_model(text)
        m.graph.initializer.append(onnx.numpy_helper.from_array(rng().normal(0, scale, (4, 3)).astype(np.float32), "w"))
        return m

    m = classifier(1.0)
    data = {"x": rng(1).normal(size=(16, 4)).astype(np.float32)}
    result = check(m, _all_low(m), inputs=[data])
    assert result.passed
    errors = result.outputs[0].errors
    assert 0 < errors.max_abs < 1e-2 and errors.top1 == 1 and errors.mismatched == 0
    worse = check(m, classifier(3.0), inputs=[data])  # other weights: other probabilities
    assert not worse.passed and worse.outputs[0].errors.elementwise_violations > 0
    assert values([{7: 0.5, 3: 0.25}])[0].tolist() == [[0.25, 0.5]]

# --- calibrate and validate ------------------------------------------------------------------------------


def test_calibration_keeps_overflowing_values_fp32_and_most_nodes_low() -> None:
    m = _layer_norm_model()
    data = _layer_norm_data()
    mixed, report = amp_rewrite.convert(m, policy="all-low", calibrate=[data])
    assert any("'sq' reached" in d.reason for d in report.fp32_reasons)
    assert _low_share(report) > 0.5
    assert check(m, mixed, inputs=[data])


def test_calibration_keeps_values_that_flush_to_zero_fp32() -> None:
    m, data = builders.fragile_log_softmax()
    mixed, report = amp_rewrite.convert(m, policy="all-low", calibrate=[data])
    reasons = {d.node: d.reason for d in report.fp32_reasons}
    assert "flush to zero" in reasons["softmax"]
    assert _low_share(report) > 0.5
    assert check(m, mixed, inputs=[data])


def test_calibration_measures_values_inside_loop_bodies() -> None:
    m = model("""(float[4] x) => (float[4] y) {
      [loop] y = Loop(trips, cond, x) <body = loop_body (int64 i, bool c, float[4] s) => (bool c_out, float[4] s_out) {
        [grow] g = Mul(s, hundred)
        [shrink] s_out = Mul(g, tenth)
        [keep] c_out = Identity(c)
      }>
    }""", {"trips": np.array(2, np.int64), "cond": np.array(True), "hundred": np.array(100, np.float32),
           "tenth": np.array(0.01, np.float32)})
    data = {"x": np.full(4, 300, np.float32)}
    mixed, report = amp_rewrite.convert(m, policy="all-low", calibrate=[data])
    reasons = {d.node: d.reason for d in report.fp32_reasons}
    assert "'g' reached 3e+04" in reasons["grow"], reasons
    assert check(m, mixed, inputs=[data])


def test_validate_moves_the_blamed_nodes_to_fp32_in_a_few_runs() -> None:
    m, data = builders.cancellation()
    mixed, report = amp_rewrite.convert(m, policy="all-low", validate=[data])
    validation = report.validation
    assert validation.passed and validation.rounds == 3 and validation.runs == 5  # the last round as deployed too
    assert validation.deployed == "compared" and validation.sessions == 5
    assert set(validation.kept_fp32) == {"shift", "unshift"}
    assert check(m, mixed, inputs=[data])
    assert report.low_nodes == 1  # the MatMul
    assert json.loads(report.to_json()) == json.loads(json.dumps(dataclasses.asdict(report)))  # rows and validation


# --- inputs and the command line -------------------------------------------------------------------------


def test_generated_inputs_respect_types_named_dims_and_vocabularies() -> None:
    m = model("""(int64[batch,seq] ids, int64[batch,seq] attention_mask, float[batch,seq,8] extra)
                 => (float[batch,seq,8] y) {
      [embed] e = Gather(table, ids)
      [mask] mf = Cast<to=1>(attention_mask)
      [mk] m3 = Unsqueeze(mf, axis)
      [scale] s = Mul(e, m3)
      [sum] y = Add(s, extra)
    }""", {"table": np.zeros((50, 8), np.float32), "axis": np.array([-1], np.int64)})
    drawn = samples.generate(m, 3, shapes={"ids": (2, 5)}, seed=1)
    assert len(drawn) == 3
    for sample in drawn:
        assert sample["ids"].shape == (2, 5) and sample["ids"].max() < 50 and sample["ids"].max() >= 4
        assert sample["attention_mask"].shape == (2, 5)  # batch and seq, as the given shape of ids says
        assert (sample["attention_mask"] == 1).all() and sample["extra"].dtype == np.float32


def test_a_dimension_declared_minus_one_is_dynamic(tmp_path) -> None:
    """Some exporters write -1 for a dynamic dimension: a real sample of any extent is accepted
    there, and generated inputs give it an extent (an OCR model's [-1, 3, ?, ?] input)."""
    m = model("(float[2,3] x) => (float[2,3] y) { y = Relu(x) }")
    for i, extent in enumerate((-1, 3)):
        m.graph.input[0].type.tensor_type.shape.dim[i].dim_value = extent
    m.graph.output[0].type.tensor_type.shape.Clear()
    np.savez(tmp_path / "x.npz", x=np.ones((5, 3), np.float32))
    assert samples.load_npz(tmp_path / "x.npz", m)["x"].shape == (5, 3)
    assert samples.generate(m)[0]["x"].shape == (samples.UNNAMED_DIM, 3)
    np.savez(tmp_path / "bad.npz", x=np.ones((5, 4), np.float32))
    with pytest.raises(amp_rewrite.UserError, match=r"has shape \[5, 4\], the model expects \[\?, 3\]"):
        samples.load_npz(tmp_path / "bad.npz", m)


def test_cli_check_exit_codes_and_reports(tmp_path, capsys) -> None:
    m = _layer_norm_model()
    original, broken, good = tmp_path / "m.onnx", tmp_path / "broken.onnx", tmp_path / "good.onnx"
    onnx.save(m, original)
    onnx.save(_all_low(m), broken)
    np.savez(tmp_path / "d.npz", **_layer_norm_data())
    data = str(tmp_path / "d.npz")
    junit, report = tmp_path / "r.xml", tmp_path / "r.json"
    assert main(["check", str(original), str(broken), "--inputs", data, "--localize",
                 "--junit", str(junit), "--report", str(report)]) == 1
    assert ET.parse(junit).getroot().get("failures") == "1"
    assert json.loads(report.read_text())["suspects"][0]["node"] == "square"
    assert "--localize finds" not in capsys.readouterr().out
    assert main(["check", str(original), str(broken), "--inputs", data]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "--localize finds the nodes where the error grows"
    assert main(["convert", str(original), "-o", str(good), "--policy", "all-low", "--validate", data,
                 "--quiet"]) == 0
    assert main(["check", str(original), str(good), "--inputs", data]) == 0
    assert main(["check", str(original), str(good), "--inputs", str(tmp_path / "missing.npz")]) == 2
    assert main(["check", str(original), str(good), "--tol", "nope"]) == 2
    assert main(["check", str(original), str(good), "--metric", "nope"]) == 2


def test_check_of_a_model_onnxruntime_cannot_run_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    """ONNX Runtime's CPU provider has no bfloat16 Add: its refusal is the user's to hear of, not an internal error."""
    path = tmp_path / "bf16.onnx"
    onnx.save(model("""(float[2,3] x, float[2,3] y) => (float[2,3] z) {
        a = Cast<to=16>(x)  b = Cast<to=16>(y)  c = Add(a, b)  z = Cast<to=1>(c) }"""), path)
    capsys.readouterr()
    assert main(["check", str(path), str(path), "--random", "1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("amp-rewrite: error: onnxruntime cannot run the float32 model on "
                               "CPUExecutionProvider: ") and "Add(" in lines[0], lines


def test_check_runs_a_model_below_onnxruntime_s_opsets_upgraded(tmp_path, capsys) -> None:
    """ONNX Runtime has no Add-6: check runs both models upgraded to opset 7 (``instrument.runnable``)."""
    path = tmp_path / "old.onnx"
    onnx.save(model("(float[2,3] x, float[2,3] y) => (float[2,3] z) { z = Add(x, y) }", opset=6), path)
    assert main(["check", str(path), str(path), "--random", "1"]) == 0, capsys.readouterr().err


def test_wrong_input_data_is_a_user_error(tmp_path) -> None:
    m = _layer_norm_model()
    np.savez(tmp_path / "bad.npz", x=np.zeros((3, 3), np.float32))
    with pytest.raises(amp_rewrite.UserError, match="shape"):
        check(m, m, inputs=[str(tmp_path / "bad.npz")])
    with pytest.raises(amp_rewrite.UserError, match="not among the model inputs"):
        check(m, m, inputs=[{"x": np.zeros((8, 64), np.float32), "z": np.zeros(1)}])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert check(m, m, inputs=[{"x": np.zeros((8, 64), np.float32)}]), "a model equals itself"


def test_calibrate_and_validate_models_with_external_data(tmp_path) -> None:
    m, data = builders.fragile_layer_norm()
    source = tmp_path / "ln.onnx"
    builders.save_with_external_data(m, source)
    np.savez(tmp_path / "d.npz", **data)
    for flag in ("calibrate", "validate"):
        target = tmp_path / f"ln.{flag}.onnx"
        _, report = amp_rewrite.convert(str(source), str(target), policy="all-low", range_check="off",
                                        **{flag: [str(tmp_path / "d.npz")]})
        assert "calibration data" in report.range_check
        assert (tmp_path / f"ln.{flag}.onnx.data").exists()
        assert check(str(source), str(target), inputs=[str(tmp_path / "d.npz")])


def test_the_default_tolerance_follows_the_mixed_models_precision() -> None:
    """bfloat16 keeps 8 bits of mantissa against float16's 11: judged by float16's default
    tolerance, a faithful bfloat16 conversion failed (a ResNet-50 whose top-1 agreed). Its
    default is 8 times float16's; given figures win; the table says which applies. The CPU
    provider has no bfloat16 MatMul: the run as deployed did not run there, and the emulated
    verdict stands."""
    m = model("(float[8,64] x) => (float[8,64] y) { [mm] h = MatMul(x, w) \n y = Relu(h) }",
              {"w": rng(1).normal(0, 0.5, (64, 64)).astype(np.float32)})
    data = {"x": rng(2).normal(0, 1, (8, 64)).astype(np.float32)}
    low = amp_rewrite.convert(m, provider=None, precision="bfloat16")[0]
    result = check(m, low, inputs=[data])
    assert result, result.table()
    assert result.outputs[0].tolerance == amp_rewrite.Tolerance(8e-2, 8e-2)
    assert "tolerance: elementwise, rtol=0.08 atol=0.08 (rtol and atol: bfloat16's default)" in result.table()
    assert result.deployed.startswith("did not run: CPUExecutionProvider has no kernel") or \
        result.deployed == "compared"
    assert not check(m, low, inputs=[data], tolerance=amp_rewrite.Tolerance(1e-2, 1e-2))  # float16's figures
    half = check(m, amp_rewrite.convert(m, provider=None)[0], inputs=[data], tolerance=amp_rewrite.Tolerance(atol=0.5))
    assert half.outputs[0].tolerance == amp_rewrite.Tolerance(1e-2, 0.5)
    assert "rtol=0.01 atol=0.5 (rtol: float16's default)" in half.table()
