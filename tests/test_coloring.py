"""Coloring rules, one per test: nodes are named after the color they must get."""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from amp_rewrite import ConvertOptions, UserError, analyze, check, convert
from amp_rewrite.ir.measurements import Thresholds, ValueStats
from amp_rewrite.ir.precision import Precision
from amp_rewrite.rewrite.passes import MeasureRanges
from amp_rewrite.runtime import ranges
from amp_rewrite.runtime.emulate import emulated
from amp_rewrite.workflows.analyze import range_check
from models import builders
from tests.helpers import cast_count, colors, model, rms_norm, rng, run

W = {"w": rng().standard_normal((4, 4)).astype(np.float32), "w2": rng(1).standard_normal((4, 4)).astype(np.float32)}


def schema_only(**kw):
    return dict(provider=None, range_check="off", **kw)


def test_allow_goes_low_deny_stays_fp32_and_infer_follows_neighbours():
    """Rule: allow ops are low; deny ops fp32; infer/clear ops between allow ops follow them."""
    m = model("""(float[2,4] x) => (float[2,4] y) {
        [allow1] a = MatMul(x, w)
        [inf1] b = Relu(a)
        [clr1] c = Transpose<perm=[0,1]>(b)
        [allow2] d = MatMul(c, w2)
        [deny1] y = Softmax(d)
    }""", W)
    out, report = convert(m, **schema_only())
    assert colors(out) == {"allow1": "low", "inf1": "low", "clr1": "low", "allow2": "low", "deny1": "fp32"}
    assert cast_count(out) == 2  # x -> fp16, d -> fp32
    x = rng(2).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(run(out, x=x)[0], run(m, x=x)[0], rtol=1e-2, atol=1e-3)
    assert {d.node: d.op_class for d in report.decisions} == {
        "allow1": "allow", "inf1": "infer", "clr1": "clear", "allow2": "allow", "deny1": "deny"}


def test_values_downstream_of_deny_stay_fp32_until_an_allow_op():
    """Rule: deny propagates forward through infer and clear ops, stopping at allow ops."""
    m = model("""(float[2,4] x) => (float[2,4] y) {
        [deny1] a = Exp(x)
        [inf1] b = Add(a, a)
        [clr1] c = Reshape(b, shape)
        [allow1] d = MatMul(c, w)
        [inf2] y = Relu(d)
    }""", {**W, "shape": np.array([2, 4], np.int64)})
    out, report = convert(m, **schema_only(keep_io_types=False))
    assert colors(out) == {"deny1": "fp32", "inf1": "fp32", "clr1": "fp32", "allow1": "low", "inf2": "low"}
    reasons = {d.node: d.reason for d in report.decisions}
    assert "downstream of deny node 'deny1'" in reasons["inf1"]


def test_infer_ops_alone_between_fp32_inputs_and_outputs_are_left_unchanged():
    """Rule: low precision is never chosen when it only adds casts; such a model is returned unchanged."""
    m = model("(float[2,4] x) => (float[2,4] y) { [inf1] a = Relu(x) \n [inf2] y = Add(a, x) }")
    out, report = convert(m, **schema_only())
    assert out.SerializeToString() == m.SerializeToString()
    assert report.low_nodes == 0 and report.casts_inserted == 0


def test_one_cast_per_tensor_and_type_shared_by_all_readers():
    """Rule: a value read in low precision by three nodes is cast once."""
    m = model("""(float[2,4] x) => (float[2,4] a, float[2,4] b, float[2,4] c) {
        [allow1] a = MatMul(x, w)
        [allow2] b = MatMul(x, w2)
        [allow3] c = MatMul(x, w)
    }""", W)
    out, _ = convert(m, **schema_only())
    casts_of_x = [n for n in out.graph.node if n.op_type == "Cast" and n.input[0] == "x"]
    assert len(casts_of_x) == 1
    assert [o.name for o in out.graph.output] == ["a", "b", "c"]
    assert all(o.type.tensor_type.elem_type == 1 for o in out.graph.output)


def test_no_cast_reads_a_cast_and_no_round_trips():
    """Rule: a value produced by a Cast is re-cast from that Cast's input, never chained."""
    m = model("""(int32[2,4] ids) => (float[2,4] y, float[2,4] z) {
        [clr1] f = Cast<to=1>(ids)
        [allow1] y = MatMul(f, w)
        [deny1] z = Exp(f)
    }""", W)
    out, _ = convert(m, **schema_only())
    producers = {o: n for n in out.graph.node for o in n.output}
    for node in out.graph.node:
        if node.op_type == "Cast" and node.input[0] in producers:
            assert producers[node.input[0]].op_type != "Cast", "a Cast reads a Cast"
    ids = np.arange(8, dtype=np.int32).reshape(2, 4)
    for got, want in zip(run(out, ids=ids), run(m, ids=ids)):
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_existing_cast_to_float_is_retyped_instead_of_cast_again():
    """Rule: Cast(to=FLOAT) from an int feeding only low nodes becomes Cast(to=FLOAT16)."""
    m = model("""(int64[2,4] ids) => (float[2,4] y) {
        [clr1] f = Cast<to=1>(ids)
        [allow1] y = MatMul(f, w)
    }""", W)
    out, report = convert(m, **schema_only())
    cast = next(n for n in out.graph.node if n.name == "clr1")
    assert cast.attribute[0].i == 10
    assert report.casts_inserted == 1  # only the graph output


def test_initializer_read_in_both_precisions_gets_one_copy_each():
    """Rule: constants convert offline; a copy per precision only when both are read."""
    m = model("""(float[2,4] x) => (float[2,4] y, float[2,4] z) {
        [allow1] y = MatMul(x, w)
        [kept1] z = MatMul(x, w)
    }""", W)
    out, report = convert(m, **schema_only(keep_fp32_nodes=["kept1"]))
    types = {t.name: t.data_type for t in out.graph.initializer}
    assert types["w"] == 1 and types["w_fp16"] == 10
    assert report.initializer_copies == 1


def test_initializer_only_read_low_is_converted_in_place():
    m = model("(float[2,4] x) => (float[2,4] y) { [allow1] y = MatMul(x, w) }", {"w": W["w"]})
    out, report = convert(m, **schema_only())
    assert [(t.name, t.data_type) for t in out.graph.initializer] == [("w", 10)]
    assert report.initializers_converted == 1 and report.initializer_copies == 0


@pytest.mark.parametrize("values, why", [
    (np.full((4, 4), 1e5, np.float32), "beyond float16's 65504"),
    (np.full((4, 4), 1e-12, np.float32), "flush to zero"),
])
def test_initializers_that_do_not_fit_keep_their_readers_fp32(values, why):
    """Rule: values that overflow or vanish in float16 are kept, never clamped."""
    m = model("(float[2,4] x) => (float[2,4] y) { [allow1] y = MatMul(x, w) }", {"w": values})
    out, report = convert(m, **schema_only())
    assert colors(out) == {"allow1": "fp32"}
    assert why in report.decisions[0].reason
    assert out.graph.initializer[0].data_type == 1
    assert "w" in report.constants_kept_fp32


def test_constant_of_shape_fill_that_overflows_stays_fp32():
    m = model("""(float[2,4] x) => (float[2,4] y) {
        [clr1] mask = ConstantOfShape<value=float[1] {-1e9}>(shape)
        [inf1] s = Add(x, mask)
        [allow1] y = MatMul(s, w)
    }""", {"w": W["w"], "shape": np.array([2, 4], np.int64)})
    out, report = convert(m, **schema_only())
    reasons = {d.node: d.reason for d in report.decisions}
    assert "fill value" in reasons["clr1"]
    assert colors(out)["clr1"] == "fp32"


def test_a_divisor_constant_with_a_value_that_flushes_keeps_its_division_fp32():
    """Rule: one divisor of 9e-9 among normal ones carries no share of the constant's
    magnitude, but float16 flushes it to 0, and 0 / 0 is NaN where float32 gives 0 (a fuzz
    find). The Div reads the constant in float32, and what follows it stays float32 until
    the next allow op, as after any reader of an unfit constant."""
    m = model("""(float[1,2] x) => (float[1,2] y) {
        [allow1] r = MatMul(x, v)
        [inf1] q = Div(r, w)
        [inf2] s = Add(q, r)
        [allow2] y = MatMul(s, v)
    }""", {"w": np.array([9e-9, 0.25], np.float32), "v": np.eye(2, dtype=np.float32)})
    x = np.array([[0.0, 3.0]], np.float32)
    out, report = convert(m, inputs=[{"x": x}])
    reasons = {d.node: d.reason for d in report.decisions}
    assert colors(out) == {"allow1": "low", "inf1": "fp32", "inf2": "fp32", "allow2": "low"}
    assert reasons["inf1"] == ("reads initializer 'w' with values that flush to zero in float16, "
                               "where a zero gives inf or NaN")
    assert {t.name: t.data_type for t in out.graph.initializer}["w"] == onnx.TensorProto.FLOAT
    expected = run(m, x=x)[0]
    assert np.isfinite(expected).all()
    np.testing.assert_allclose(run(emulated(out), x=x)[0], expected, rtol=2e-3)


def test_resize_roi_and_scales_keep_their_types():
    """Rule: per-input rules from the schemas (Resize roi is T2, scales is fixed float)."""
    m = model("""(float[1,1,2,2] x) => (float[1,1,4,4] y) {
        [allow1] a = Conv(x, k)
        [inf1] y = Resize<mode="linear">(a, roi, scales)
    }""", {"k": np.ones((1, 1, 1, 1), np.float32), "roi": np.array([], np.float32),
           "scales": np.array([1, 1, 2, 2], np.float32)})
    out, _ = convert(m, **schema_only(keep_io_types=False))
    resize = next(n for n in out.graph.node if n.name == "inf1")
    types = {t.name: t.data_type for t in out.graph.initializer}
    assert types[resize.input[1]] == 1 and types[resize.input[2]] == 1
    assert colors(out)["inf1"] == "low"


def test_layer_norm_follows_neighbours_on_cuda_but_is_denied_without_a_provider():
    text = """(float[2,4] x) => (float[2,4] y) {
        [allow1] a = MatMul(x, w)
        [ln] b = LayerNormalization<axis=-1>(a, g, beta)
        [allow2] y = MatMul(b, w2)
    }"""
    m = model(text, {**W, "g": np.ones(4, np.float32), "beta": np.zeros(4, np.float32)})
    assert colors(convert(m, provider="CUDAExecutionProvider", range_check="off")[0])["ln"] == "low"
    assert colors(convert(m, **schema_only())[0])["ln"] == "fp32"


def test_provider_without_a_low_kernel_keeps_the_node_fp32():
    m = model("(float[2,4] x) => (float[2,4] y) { [allow1] y = MatMul(x, w) }", {"w": W["w"]})
    out, report = convert(m, provider="CPUExecutionProvider", range_check="off")
    assert colors(out) == {"allow1": "fp32"}
    assert "has no float16 kernel for MatMul" in report.decisions[0].reason


def test_cuda_kernel_table_decides_by_opset_and_type():
    m = model("(float[2,4] x) => (float[2,4] y) { [allow1] y = MatMul(x, w) }", {"w": W["w"]})
    assert colors(convert(m, provider="CUDAExecutionProvider", range_check="off")[0]) == {"allow1": "low"}
    m = model("""(float[2,4] x) => (float[2,4] y) {
        [allow1] a = MatMul(x, w)
        [inf1] b = Atan(a)
        [allow2] y = MatMul(b, w2)
    }""", W)
    out, report = convert(m, provider="CUDAExecutionProvider", range_check="off")
    assert colors(out) == {"allow1": "low", "inf1": "fp32", "allow2": "low"}
    assert "no float16 kernel for Atan at opset 17" in report.decisions[1].reason


def test_bfloat16_upgrades_a_model_below_opset_13_where_its_ops_allow_and_says_why_where_not():
    """ONNX ops accept bfloat16 from opset 13 (MatMul-9's schema has none): a model below it came
    back unchanged, "0 of 0 float nodes", with no reason. It is upgraded (onnx's version converter);
    where the converter cannot (an experimental op), a warning says why nothing runs in bfloat16."""
    old = model("(float[2,4] x) => (float[2,4] y) { [allow1] y = MatMul(x, w) }", {"w": W["w"]}, opset=9)
    before = old.SerializeToString()
    out, report = convert(old, provider="CUDAExecutionProvider", precision="bfloat16", range_check="off")
    assert old.SerializeToString() == before
    assert colors(out) == {"allow1": "low"} and out.opset_import[0].version == 13
    assert "upgraded the model from opset 9 to 13: ONNX ops accept bfloat16 from opset 13" in report.notes[-1]
    out, report = convert(old, provider=None, opset=15, range_check="off")
    assert out.opset_import[0].version == 15 and "(asked for)" in report.notes[-1]
    crop = model("(float[1,1,4,4] x) => (float[1,1,2,2] y) { c = Crop<border=[1,1,1,1]>(x) \n y = Relu(c) }", opset=9)
    out, report = convert(crop, provider=None, precision="bfloat16", range_check="off")
    assert report.low_nodes == 0 and out.opset_import[0].version == 9
    assert any(n.startswith("warning: ONNX ops accept bfloat16 from opset 13, and this model is at opset 9: nothing "
                            "can run in bfloat16 (cannot upgrade the model from opset 9 to 13") for n in report.notes)
    with pytest.raises(UserError, match="cannot upgrade the model from opset 9 to 13"):
        convert(crop, provider=None, opset=13)


def test_user_overrides_win_over_policy():
    m = model("""(float[2,4] x) => (float[2,4] y) {
        [allow1] a = MatMul(x, w)
        [allow_kept] b = MatMul(a, w2)
        [deny_forced] y = Softmax(b)
    }""", W)
    out, report = convert(m, **schema_only(keep_fp32_nodes=["allow_k.*"], force_low_ops=["Softmax"]))
    assert colors(out) == {"allow1": "low", "allow_kept": "fp32", "deny_forced": "low"}
    reasons = {d.node: d.reason for d in report.decisions}
    assert reasons["allow_kept"] == "user override --keep-fp32-node allow_k.*"
    assert reasons["deny_forced"] == "user override --force-low-op Softmax"


def test_unknown_ops_follow_the_chosen_mode():
    text = """(float[2,4] x) => (float[2,4] y) {
        [allow1] a = MatMul(x, w)
        [custom] y = Frobnicate(a)
    }"""
    m = model(text.replace("Frobnicate", "Relu"), {"w": W["w"]})
    m.graph.node[1].op_type, m.graph.node[1].domain = "Frobnicate", "com.example"
    m.opset_import.add(domain="com.example", version=1)
    out, report = convert(m, **schema_only())
    assert report.unknown_ops == {"com.example.Frobnicate": 1}
    assert cast_count(out) == 2  # around the MatMul; the custom op reads float32
    with pytest.raises(UserError, match="com.example.Frobnicate"):
        convert(m, **schema_only(unknown_ops="error"))
    assert any("Frobnicate" in n for n in convert(m, **schema_only(unknown_ops="warn"))[1].notes)


def test_range_check_keeps_overflowing_values_fp32_with_the_measured_figure():
    big = np.full((4, 4), 3000.0, np.float32)  # fits float16, but x @ w reaches ~1e4 * |x|
    m = model("""(float[2,4] x) => (float[2,4] y) {
        [allow1] a = MatMul(x, w)
        [allow2] y = MatMul(a, w2)
    }""", {"w": big, "w2": W["w2"]})
    out, report = convert(m, provider=None)
    reasons = {d.node: d.reason for d in report.decisions}
    assert "on generated inputs" in reasons["allow1"] and "beyond 4094" in reasons["allow1"]
    assert colors(out) == {"allow1": "fp32", "allow2": "fp32"}
    assert report.range_check.startswith("measured")


def _tanh_gelu(scale: float) -> onnx.ModelProto:
    """GPT-2's tanh GELU as exporters write it (a Pow of 3), between two MatMuls; the first
    MatMul's weights scaled by ``scale``."""
    r = rng(0)
    return model("""(float[4,64] x) => (float[4,64] y) {
      [fc] h = MatMul(x, w)
      [cube] c = Pow(h, three)
      [coef] kc = Mul(c, k)
      [inner] s = Add(h, kc)
      [scale] t = Mul(s, sq)
      [tanh] th = Tanh(t)
      [one] o = Add(th, one)
      [half] hh = Mul(h, half)
      [gate] g = Mul(hh, o)
      [proj] y = MatMul(g, w2)
    }""", {"w": (scale * r.standard_normal((64, 64)) / 8).astype(np.float32),
           "w2": (r.standard_normal((64, 64)) / 8).astype(np.float32), "three": np.array(3.0, np.float32),
           "k": np.array(0.044715, np.float32), "sq": np.array(0.7978845608, np.float32),
           "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)})


def test_a_power_runs_low_where_the_range_check_measures_it_within_range():
    """A Pow is deny for its range alone: measured within range, a tanh GELU runs low whole
    (no float32 island, no casts: ONNX Runtime can fuse it into FastGelu on CUDA); measured
    beyond it, the Pow and its readers stay float32; with nothing measured, deny as before."""
    m = _tanh_gelu(1.0)
    data = {"x": rng(1).standard_normal((4, 64)).astype(np.float32)}
    out, report = convert(m, inputs=[data])
    assert set(colors(out).values()) == {"low"} and cast_count(out) == 2
    decisions = {d.node: d for d in report.decisions}
    assert decisions["cube"].op_class == "infer" and decisions["cube"].precision == "low"
    want, got = run(m, **data)[0], run(out, **data)[0]  # the reference evaluator computes in float16
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3

    off = convert(m, range_check="off")[0]
    assert {n for n, c in colors(off).items() if c == "fp32"} == {"cube", "coef", "inner", "scale", "tanh", "one",
                                                                  "half", "gate"}
    big = convert(_tanh_gelu(40.0), inputs=[data])[1]
    kept = {d.node: d.reason for d in big.decisions if d.precision == "fp32"}
    assert "cube" in kept and "beyond 4094" in kept["cube"], kept


def test_a_power_the_range_check_could_not_measure_stays_deny(monkeypatch):
    def cannot_run(*args, **kwargs):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(ranges, "_measure_every_value", cannot_run)
    monkeypatch.setattr(ranges, "measure", cannot_run)
    out, report = convert(_tanh_gelu(1.0))
    assert report.range_check.startswith("NOT RUN")
    decisions = {d.node: d for d in report.decisions}
    assert decisions["cube"].precision == "fp32" and "the range check measured nothing" in decisions["cube"].reason
    assert colors(out)["tanh"] == "fp32" and "downstream of deny node" in decisions["tanh"].reason


def _two_rms_norms(eps: float) -> onnx.ModelProto:
    return model("(float[4,64] x) => (float[4,64] y) {" + rms_norm(0, "x", "y0", eps) + "\n [between] z = Mul(y0, k)"
                 + rms_norm(1, "z", "y", eps) + "\n}", {"w": np.ones(64, np.float32), "k": np.array(0.005, np.float32)})


def test_a_power_that_a_deny_op_reads_stays_deny():
    """An RMSNorm's square feeds the ReduceMean of its variance: measured or not, it stays
    float32 (an overflow on unseen data would collapse the statistic)."""
    out, report = convert(_two_rms_norms(1e-6))
    reasons = {d.node: d.reason for d in report.decisions}
    assert colors(out)["square0"] == "fp32" and "read by deny ReduceMean 'mean0'" in reasons["square0"]


@pytest.mark.parametrize("eps, kept", [(1e-6, True), (1e-5, False)])
def test_a_written_out_rms_norm_adds_its_epsilon_in_float32_where_onnxruntime_would_lose_it(eps, kept):
    """All low (as the peers convert), ONNX Runtime 1.31 fuses these RMSNorms with epsilon 1e-5
    (it shares their equal epsilons first): 18% off with the model's 1e-6. The epsilon's Add
    stays float32 unless the epsilon is that one; the rest of the norm runs low."""
    m = _two_rms_norms(eps)
    data = {"x": rng(2).normal(0, 0.005, (4, 64)).astype(np.float32)}
    out, report = convert(m, policy="all-low", range_check="off")
    found = colors(out)
    assert (found["eps_add0"] == "fp32") is kept and (found["eps_add1"] == "fp32") is kept
    assert found["square0"] == found["mean0"] == found["scale1"] == "low"
    if kept:
        reasons = {d.node: d.reason for d in report.decisions}
        assert "written-out RMSNorm" in reasons["eps_add0"]
    result = check(m, out, inputs=[data])
    assert result and result.deployed == "compared", result.table()


def test_a_mean_centred_square_is_a_layer_norm_whose_epsilon_runs_low():
    m, _ = builders.fragile_layer_norm()  # its square a Mul(d, d) of the centred d
    eps = next(t for t in m.graph.initializer if t.name == "eps")
    eps.CopyFrom(numpy_helper.from_array(np.array(1e-6, np.float32), "eps"))
    assert colors(convert(m, policy="all-low", range_check="off")[0])["eps"] == "low"


@pytest.mark.parametrize("scaling", sorted(builders.RMS_SCALINGS))
def test_an_rms_norms_scaling_ends_the_float32_region_of_its_statistics(scaling):
    """The statistics of a written-out RMSNorm are float32 (its mean square is deny); its scaling
    reads them and is float32 too, but x / rms(x) is at most sqrt(16) = 4 whatever x holds, so
    the weight and the residual stream run low: the stream reaches the norm through one Cast,
    read by the square and the scaling alone (the pattern ONNX Runtime fuses, on CUDA, into
    one SimplifiedLayerNormalization computing in float32)."""
    m = builders.rms_decoder(scaling)
    out, report = convert(m, range_check="off")
    found = colors(out)
    for i in (0, 1):
        assert found[f"mean{i}"] == found[f"sqrt{i}"] == found[f"scale{i}"] == "fp32"
        assert found[f"weight{i}"] == found[f"residual{i}"] == found[f"proj{i}"] == "low"
        (cast,) = [n for n in out.graph.node if n.op_type == "Cast" and n.input[0] == f"x{i}"]
        readers = {n.name for n in out.graph.node if cast.output[0] in n.input}
        assert readers == {f"square{i}", f"scale{i}"}
    reasons = {d.node: d.reason for d in report.decisions}
    assert "downstream of deny node" in reasons["scale0"]
    assert "fewest cast bytes" in reasons["weight0"]
    data = {"inp": rng(4).normal(0, 1, (2, 8, 16)).astype(np.float32)}
    np.testing.assert_allclose(run(out, **data)[0], run(m, **data)[0], rtol=2e-2, atol=2e-2)
    assert check(m, out, inputs=[data])


def _layer_norm_decoder() -> onnx.ModelProto:
    """Two pre-norm residual blocks, ``x{i+1} = x{i} + MatMul(layer_norm(x{i}), m{i})``, as
    exporters before opset 17 write GPT-2's, fed by a MatMul."""
    text = "(float[2,8,16] inp) => (float[2,8,16] y) {\n [embed] x0 = MatMul(inp, m9)"
    for i in range(2):
        text += f"""
          two{i} = Constant<value = float {{2.0}}>()
          eps{i} = Constant<value = float {{1e-5}}>()
          [mean{i}] u{i} = ReduceMean<axes=[-1]>(x{i})
          [centre{i}] d{i} = Sub(x{i}, u{i})
          [square{i}] p{i} = Pow(d{i}, two{i})
          [var{i}] v{i} = ReduceMean<axes=[-1]>(p{i})
          [eps_add{i}] a{i} = Add(v{i}, eps{i})
          [sqrt{i}] s{i} = Sqrt(a{i})
          [scale{i}] n{i} = Div(d{i}, s{i})
          [weight{i}] g{i} = Mul(n{i}, w)
          [bias{i}] o{i} = Add(g{i}, b)
          [proj{i}] h{i} = MatMul(o{i}, m{i})
          [residual{i}] x{i + 1} = Add(x{i}, h{i})"""
    text += "\n [out] y = Identity(x2)\n}"
    weights = {f"m{i}": rng(i).normal(0, 0.3, (16, 16)).astype(np.float32) for i in (0, 1, 9)}
    return model(text, {**weights, "w": rng(3).normal(1, 0.1, 16).astype(np.float32),
                        "b": rng(5).normal(0, 0.1, 16).astype(np.float32)})


@pytest.mark.parametrize("provider", ["CUDAExecutionProvider", None])
def test_a_layer_norms_scaling_ends_the_float32_region_where_layer_normalization_runs_low(provider):
    """A written-out LayerNorm's scaling d / rms(d) of the centred d is bounded as an RMSNorm's
    is. Where the provider runs LayerNormalization low (CUDA, whose kernel computes a float16
    input's statistics in float32), the chain of float32 ends there: weight, bias and residual
    stream run low, the stream reaches the statistics through one Cast and the scaling leaves
    through another (both fused by ONNX Runtime into one float16 LayerNormalization). Where
    LayerNormalization is deny (no provider: the op lists alone), the norm stays a float32 island."""
    m = _layer_norm_decoder()
    out, report = convert(m, provider=provider, range_check="off")
    found = colors(out)
    low = provider == "CUDAExecutionProvider"
    for i in (0, 1):
        assert found[f"mean{i}"] == found[f"centre{i}"] == found[f"scale{i}"] == "fp32"
        assert found[f"proj{i}"] == found[f"residual{i}"] == "low"
        assert found[f"weight{i}"] == found[f"bias{i}"] == ("low" if low else "fp32")
    reasons = {d.node: d.reason for d in report.decisions}
    assert "downstream of deny node" in reasons["scale0"]
    assert ("fewest cast bytes" if low else "downstream of deny node") in reasons["weight0"]
    assert cast_count(out) == 2 + 2 * 2  # the input and output, into and out of each norm (fused where low)
    data = {"inp": rng(4).normal(0, 1, (2, 8, 16)).astype(np.float32)}
    np.testing.assert_allclose(run(out, **data)[0], run(m, **data)[0], rtol=2e-2, atol=2e-2)
    assert check(m, out, inputs=[data])



def _pooled_layer_norm() -> onnx.ModelProto:
    """Keras's LayerNormalization as tf2onnx exports it: the ReduceMeans over the last axis of
    [batch, sequence, hidden] written as GlobalAveragePool, and x * (w / rms) + (b - mean * w / rms)
    for the scaling; beside it a CNN-style head pooling a Relu."""
    return model("""(float[2,8,16] inp) => (float[2,8,16] y, float[2,8,1] z) {
        [embed] x = MatMul(inp, m9)
        [mean] u = GlobalAveragePool(x)
        [centre] d = Sub(x, u)
        [square] p = Mul(d, d)
        [var] v = GlobalAveragePool(p)
        [eps_add] a = Add(v, eps)
        [sqrt] s = Sqrt(a)
        [inverse] r = Reciprocal(s)
        [gain] k = Mul(r, w)
        [scale] n = Mul(x, k)
        [mean_scale] q = Mul(u, k)
        [shift] c = Sub(b, q)
        [affine] o = Add(n, c)
        [proj] y = MatMul(o, m0)
        [act] e = Relu(y)
        [head] z = GlobalAveragePool(e)
    }""", {"m9": rng(0).normal(0, 0.3, (16, 16)).astype(np.float32),
           "m0": rng(1).normal(0, 0.3, (16, 16)).astype(np.float32),
           "w": rng(3).normal(1, 0.1, 16).astype(np.float32), "b": rng(5).normal(0, 0.1, 16).astype(np.float32),
           "eps": np.array(1e-3, np.float32)})


def test_a_global_average_pool_that_is_a_norms_statistic_is_deny_as_its_reduce_mean_is():
    """tf2onnx writes a LayerNorm's means as GlobalAveragePool: there they are deny, as the
    ReduceMeans of the same norm exported from PyTorch are, and the norm runs float32 up to the
    next MatMul. A float16 square overflows where |x - mean| > 256, on data the range check's
    generated inputs never reach; a pooling head stays infer."""
    m = _pooled_layer_norm()
    out, report = convert(m)
    found, classes = colors(out), {d.node: d.op_class for d in report.decisions}
    assert classes["mean"] == classes["var"] == "deny" and classes["head"] == "infer"
    assert all(found[n] == "fp32" for n in ("mean", "centre", "square", "var", "sqrt", "scale", "affine"))
    assert found["embed"] == found["proj"] == "low"
    reasons = {d.node: d.reason for d in report.decisions}
    assert "a written-out norm's mean square" in reasons["var"] and "a written-out norm's mean" in reasons["mean"]
    large = {"inp": rng(4).normal(0, 300, (2, 8, 16)).astype(np.float32)}  # |x - mean| up to ~1000
    result = check(m, out, inputs=[large])
    assert result, result.table()


def test_a_value_scaled_by_another_values_rms_stays_in_the_float32_region():
    """Only x / rms(x) is bounded: k * x scaled by x's RMS is not normalized, and the values
    it reaches stay float32 until the next allow op."""
    m = builders.rms_decoder("mul-div-one")
    for i in (0, 1):  # the scaling reads z{i} = k * x{i} instead of x{i}
        scale = next(n for n in m.graph.node if n.name == f"scale{i}")
        scale.input[0] = f"z{i}"
        m.graph.node.insert(list(m.graph.node).index(scale),
                            onnx.helper.make_node("Mul", ["k", f"x{i}"], [f"z{i}"], name=f"other{i}"))
    found = colors(convert(m, range_check="off")[0])
    assert found["scale0"] == found["weight0"] == found["scale1"] == found["weight1"] == "fp32"


def test_a_models_own_cast_to_float_converts_on_its_own():
    """A Cast to float32 of the model's reads its input as it is made: from a low producer
    into a float32 reader it is the cast, and where it runs low (retyped to float16) it
    rounds its float32 input itself; no Cast is inserted before or after it."""
    low_to_fp32 = model("""(float[2,4] x) => (float[2,4] y) {
        [allow1] a = MatMul(x, w)
        [own] f = Cast<to=1>(a)
        [deny1] y = Softmax(f)
    }""", W)
    fp32_to_low = model("""(float[2,4] x) => (float[2,4] y) {
        [own] f = Cast<to=1>(x)
        [allow1] y = MatMul(f, w)
    }""", W)
    x = rng(2).standard_normal((2, 4)).astype(np.float32)
    for m, to, source in ((low_to_fp32, onnx.TensorProto.FLOAT, "a"), (fp32_to_low, onnx.TensorProto.FLOAT16, "x")):
        out, report = convert(m, **schema_only())
        assert colors(out)["allow1"] == "low"
        assert report.casts_inserted == 1  # to or from the float32 graph input or output, elsewhere
        cast = next(n for n in out.graph.node if n.name == "own")
        assert cast.attribute[0].i == to and cast.input[0] == source
        np.testing.assert_allclose(run(out, x=x)[0], run(m, x=x)[0], rtol=1e-2, atol=1e-3)


def test_the_range_check_measures_every_value_beside_the_analysis(monkeypatch):
    """The measurement starts before the analysis, in a child process, and is not run again."""
    m = model("(float[2,4] x) => (float[2,4] y) { [allow1] y = MatMul(x, w) }",
              {"w": np.full((4, 4), 3000.0, np.float32)})

    def measured_again(*args):
        raise AssertionError("measured after the analysis")

    monkeypatch.setattr(ranges, "measure", measured_again)
    out, report = convert(m, provider=None)
    assert colors(out) == {"allow1": "fp32"} and report.range_check.startswith("measured 1 values")
    for options in (ConvertOptions(range_check="off").validated(), ConvertOptions(precision="bfloat16").validated()):
        with range_check(m, options, None) as (_, every):
            assert every is None


def _matmul_and_other(tmp_path, big: bool, custom: bool):
    """A MatMul (whose product overflows float16 when ``big``) beside a Relu, or beside a
    custom op ONNX Runtime lacks."""
    m = model("""(float[2,4] x) => (float[2,4] y, float[2,4] z) {
        [allow1] y = MatMul(x, w)
        [custom] z = Relu(x)
    }""", {"w": np.full((4, 4), 3000.0 if big else 1.0, np.float32)})
    if custom:
        m.graph.node[1].op_type, m.graph.node[1].domain = "Frobnicate", "com.example"
        m.opset_import.add(domain="com.example", version=1)
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    return m, path


@pytest.mark.parametrize("big, custom", [(False, False), (True, False), (True, True)],
                         ids=["fits", "overflows", "not-every-value-runs"])
def test_a_saved_conversion_goes_on_while_the_range_check_measures_with_the_same_outcome(tmp_path, big, custom,
                                                                                       monkeypatch):
    """Written while the measurement runs, the output stands where the measurement changes
    nothing; where it keeps a node float32 (or must measure the watched values alone), the
    model is converted again with it: the outcome is the in-memory conversion's, and the
    report's stages count the wait for the measurement and both conversions."""
    m, path = _matmul_and_other(tmp_path, big, custom)
    in_memory, expected = convert(m, provider=None)
    settle = MeasureRanges.settle

    def slow_settle(analysis, found):
        time.sleep(WAIT)
        return settle(analysis, found)

    monkeypatch.setattr(MeasureRanges, "settle", staticmethod(slow_settle))
    _, report = convert(path, tmp_path / "out.onnx", provider=None)
    saved = onnx.load(tmp_path / "out.onnx")
    assert report.range_check == expected.range_check and report.range_check.startswith("measured")
    assert report.decisions == expected.decisions and report.notes == expected.notes
    assert colors(saved) == colors(in_memory) == {"allow1": "fp32" if big else "low", "custom": "fp32"}
    assert report.stages["range check"] >= WAIT and sum(report.stages.values()) <= report.seconds
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out.onnx"]


WAIT = 0.2


def test_a_range_check_that_cannot_run_leaves_no_output_when_it_must_run(tmp_path):
    m = model("""(float[2,4] x) => (float[2,4] y) <float[2,4] z> {
        [custom] z = Relu(x)
        [allow1] y = MatMul(z, w)
    }""", {"w": W["w"]})
    m.graph.node[0].op_type, m.graph.node[0].domain = "Frobnicate", "com.example"
    m.opset_import.add(domain="com.example", version=1)
    onnx.save(m, tmp_path / "m.onnx")
    with pytest.raises(UserError, match="range check: onnxruntime could not run the model"):
        convert(tmp_path / "m.onnx", tmp_path / "out.onnx", provider=None, range_check="on")
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]


def test_inputs_the_range_check_cannot_generate_leave_it_not_run_not_the_conversion_failed():
    m = model("""(bfloat16[2,4] x) => (float[2,4] y) {
        c = Cast<to=1>(x)
        [allow1] y = MatMul(c, w)
    }""", {"w": W["w"]})
    out, report = convert(m, provider=None)
    assert report.range_check.startswith("NOT RUN") and "cannot generate data for input 'x'" in report.range_check
    assert colors(out)["allow1"] == "low"


def test_measured_beside_the_analysis_a_reshape_of_a_computed_value_stands_for_it():
    """Its statistics are those of the value it reshapes, which is measured; a reshaped input is
    measured itself."""
    m = model("""(float[2,4] x) => (float[4,2] y, float[8] z) {
        a = Relu(x)
        y = Reshape(a, s1)
        z = Reshape(x, s2)
    }""", {"s1": np.array([4, 2], np.int64), "s2": np.array([8], np.int64)})
    assert ranges._computed_top_level(m) == {"a": (0, "a"), "z": (0, "z")}


def test_where_not_every_value_runs_the_range_check_measures_the_watched_ones_alone():
    """A node that no watched value needs (a custom op ONNX Runtime lacks) fails the measurement
    of every value; the watched values are then measured on their own."""
    m = model("""(float[2,4] x) => (float[2,4] y, float[2,4] z) {
        [allow1] y = MatMul(x, w)
        [custom] z = Relu(x)
    }""", {"w": np.full((4, 4), 3000.0, np.float32)})
    m.graph.node[1].op_type, m.graph.node[1].domain = "Frobnicate", "com.example"
    m.opset_import.add(domain="com.example", version=1)
    out, report = convert(m, provider=None)
    assert report.range_check.startswith("measured 1 values") and colors(out) == {"allow1": "fp32", "custom": "fp32"}
    assert "beyond 4094" in {d.node: d.reason for d in report.decisions}["allow1"]


def test_a_value_that_flushes_to_zero_before_a_log_is_computed_in_float32():
    """Rule: Softmax probabilities below float16's smallest subnormal become 0 in float16, and
    Log(0) = -inf; the range check keeps such a value float32 even on generated inputs."""
    m = model("""(float[1,4] x) => (float[1,4] y) {
        [allow1] h = MatMul(x, w)
        [sm1] s = Softmax(h)
        [log1] y = Log(s)
    }""", {"w": np.eye(4, dtype=np.float32) * 20})
    x = np.array([[1.0, -0.5, 0.2, 0.0]], np.float32)
    out, report = convert(m, inputs=[{"x": x}])
    reasons = {d.node: d.reason for d in report.decisions}
    assert "flush to zero" in reasons["sm1"] and "Log 'log1'" in reasons["sm1"]
    assert colors(out)["sm1"] == "fp32"
    expected = run(m, x=x)[0]
    assert np.isfinite(expected).all() and np.isfinite(run(emulated(out), x=x)[0]).all()


def test_a_subnormal_value_before_a_log_is_computed_in_float32():
    """Rule: a value float16 holds only as a subnormal (here 3e-8 to 5e-8: one significant bit)
    keeps its producer float32 before a Log, though none of it flushes in the float32 run;
    in float16 every such element is 5.96e-8, and rounding upstream flushes it to zero
    (a fuzz-found -inf)."""
    m = model("""(float[1,6] x) => (float[1,6] y) {
        [allow1] h = MatMul(x, w)
        [sig1] s = Sigmoid(h)
        [log1] y = Log(s)
    }""", {"w": np.eye(6, dtype=np.float32)})
    x = np.array([[-16.9, -17.0, -17.2, -17.3, -14.0, -11.0]], np.float32)
    out, report = convert(m, inputs=[{"x": x}])
    reasons = {d.node: d.reason for d in report.decisions}
    assert "6 nonzero elements on the given inputs are subnormal" in reasons["sig1"]  # all of them, measured exactly
    assert "Log 'log1'" in reasons["sig1"]
    assert colors(out) == {"allow1": "low", "sig1": "fp32", "log1": "fp32"}
    np.testing.assert_allclose(run(emulated(out), x=x)[0], run(m, x=x)[0], rtol=2e-3)


def test_the_range_check_sees_a_sigmoid_that_float16_flushes_though_onnxruntime_gives_zero():
    """Rule: Sigmoid(-57) is 1.4e-25 in float32, which float16 flushes to zero, and Log(0) is
    -inf. ONNX Runtime's CPU Sigmoid gives exactly 0 there (it is exact only to 2^-25), so a
    range check through it saw no subnormal and left the Sigmoid float16 (a fuzz find); it
    measures Sigmoid as exp(-softplus(-x)), and the Sigmoid stays float32."""
    m = model("""(float[1,2] x) => (float[1,2] y) {
        [allow1] h = MatMul(x, w)
        [sig1] s = Sigmoid(h)
        [log1] y = Log(s)
    }""", {"w": np.eye(2, dtype=np.float32) * -240})
    x = np.array([[0.2382, -0.01]], np.float32)
    assert ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0][0, 0] == -np.inf  # its Sigmoid: 0
    out, report = convert(m, inputs=[{"x": x}])
    reasons = {d.node: d.reason for d in report.decisions}
    assert colors(out) == {"allow1": "low", "sig1": "fp32", "log1": "fp32"}
    assert "1 nonzero elements on the given inputs are subnormal" in reasons["sig1"]
    expected = run(m, x=x)[0]  # the reference evaluator's Sigmoid is exact
    assert np.isfinite(expected).all()
    np.testing.assert_allclose(run(emulated(out), x=x)[0], expected, rtol=2e-3)


@pytest.mark.parametrize("policy", ["default", "all-low"])
def test_bitcast_keeps_its_float32_input_under_every_policy(policy: str) -> None:
    """BitCast's output is the input's bits: a float16 input would change the output's meaning
    and break the op's same-bit-width rule (a model ONNX Runtime refuses)."""
    m = model("""(float[2,4] x) => (int32[2,4] y) {
        [allow1] a = MatMul(x, w)
        [bits1] y = BitCast<to = 6>(a)
    }""", {"w": W["w"]}, opset=26)
    out, _ = convert(m, provider=None, policy=policy, range_check="off")
    onnx.shape_inference.infer_shapes(out, strict_mode=True)  # raises on a float16 BitCast input
    x = rng(4).standard_normal((2, 4)).astype(np.float32)
    matmul = run(m, x=x)[0].view(np.float32)
    np.testing.assert_allclose(run(out, x=x)[0].view(np.float32), matmul, rtol=3e-3, atol=3e-3)


@pytest.mark.parametrize(("reduction", "low"), [("none", True), ("add", False), ("max", False)])
def test_scatternd_whose_cpu_kernel_refuses_a_reduction_in_float16_stays_float32(reduction: str, low: bool) -> None:
    """ONNX Runtime's CPU ScatterND registers float16 but refuses it at run time for any
    reduction; the converted model (float16 inputs and outputs) must run there."""
    m = model(f"""(float[4,4] x, float[1,4] u) => (float[4,4] y) {{
        [scatter1] y = ScatterND<reduction = "{reduction}">(x, idx, u)
    }}""", {"idx": np.array([[1]], np.int64)}, opset=18)
    out, report = convert(m, provider="CPUExecutionProvider", range_check="off", keep_io_types=False)
    assert (colors(out)["scatter1"] == "low") == low
    if not low:
        reason = {d.node: d.reason for d in report.decisions}["scatter1"]
        assert f"kernel refuses reduction={reduction!r}" in reason
    feeds = {"x": rng(5).standard_normal((4, 4)).astype(np.float32),
             "u": rng(6).standard_normal((1, 4)).astype(np.float32)}
    got = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {name: array.astype(np.float16) for name, array in feeds.items()})[0]
    np.testing.assert_allclose(got.astype(np.float32), run(m, **feeds)[0], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(("provider", "reduction", "precision", "refused"), [
    ("CUDAExecutionProvider", "add", "bfloat16", True),
    ("CUDAExecutionProvider", "min", "bfloat16", True),
    ("CUDAExecutionProvider", "none", "bfloat16", False),
    ("CUDAExecutionProvider", "add", "float16", False),
])
def test_scatternd_reductions_that_a_provider_refuses_in_a_low_type_stay_float32(provider, reduction, precision,
                                                                                  refused) -> None:
    """The CUDA kernel refuses a reduction in bfloat16 at run time (kernel_check on an H100; the CPU
    one refuses float16, above): the node stays float32 there, and runs low otherwise."""
    m = model(f"""(float[4,4] x, float[1,4] u) => (float[4,4] y) {{
        [scatter1] y = ScatterND<reduction = "{reduction}">(x, idx, u)
    }}""", {"idx": np.array([[1]], np.int64)}, opset=18)
    out, report = convert(m, provider=provider, precision=precision, range_check="off", keep_io_types=False)
    assert colors(out)["scatter1"] == ("fp32" if refused else "low")
    if refused:
        assert f"kernel refuses reduction={reduction!r}" in {d.node: d.reason for d in report.decisions}["scatter1"]


def test_bfloat16_target_uses_bfloat16_types():
    m = model("(float[2,4] x) => (float[2,4] y) { [allow1] a = MatMul(x, w) \n [inf1] y = Relu(a) }",
              {"w": W["w"]})
    out, report = convert(m, provider=None, precision="bfloat16")
    assert out.graph.initializer[0].data_type == 16
    assert report.range_check.startswith("skipped: bfloat16")
    x = rng(3).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(run(out, x=x)[0], run(m, x=x)[0], rtol=3e-2, atol=3e-2)


def test_every_decision_has_a_reason_and_analyze_edits_nothing():
    m = model("(float[2,4] x) => (float[2,4] y) { [allow1] a = MatMul(x, w) \n [deny1] y = Exp(a) }",
              {"w": W["w"]})
    before = m.SerializeToString()
    analysis = analyze(m, ConvertOptions(provider=None, range_check="off"))
    assert m.SerializeToString() == before
    assert all(d.reason for d in analysis.coloring.decisions.values())


def test_huge_mask_constant_keeps_the_masked_scores_fp32_without_a_range_check():
    """Rule: a node reading a constant float16 cannot hold (HF-style mask = (1 - m) * -3.4e38)
    roots deny propagation, so fully masked rows stay finite: no -inf reaches the softmax."""
    m = model("""(float[2,4] x, int64[2,4] keep) => (float[2,4] y) {
        [allow1] scores = MatMul(x, w)
        [clr1] keepf = Cast<to=1>(keep)
        [inf1] inverted = Sub(one, keepf)
        [unfit1] bias = Mul(inverted, lowest)
        [inf2] masked = Add(scores, bias)
        [inf3] probs = Softmax(masked)
        [allow2] y = MatMul(probs, w2)
    }""", {**W, "one": np.array(1.0, np.float32), "lowest": np.array(np.finfo(np.float32).min, np.float32)})
    out, report = convert(m, provider="CUDAExecutionProvider", range_check="off")
    assert colors(out) == {"allow1": "low", "inf1": "fp32", "unfit1": "fp32", "inf2": "fp32",
                           "inf3": "fp32", "allow2": "low"}
    x = rng(5).standard_normal((2, 4)).astype(np.float32)
    keep = np.array([[1, 1, 0, 0], [0, 0, 0, 0]], np.int64)  # the second row is fully masked
    got, want = run(out, x=x, keep=keep)[0], run(m, x=x, keep=keep)[0]
    assert np.isfinite(got).all() and np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_a_minus_inf_mask_constant_runs_low_since_float16_holds_it_exactly():
    """Rule: the range check judges the finite elements: a causal mask's fill of -inf (PyTorch's
    ``masked_fill(mask, float("-inf"))``) is -inf in float16 too, so the Where reading it, and
    the scores around it, run float16 (a constant of -3.4e38 does not fit, as above). Measured in
    the graph too, for a value of a subgraph."""
    m = model("""(float[2,4] x, bool[2,4] keep) => (float[2,4] y) {
        [allow1] scores = MatMul(x, w)
        [const] minus_inf = Constant<value = float {0.0}>()
        [fill] masked = Where(keep, scores, minus_inf)
        [soft] probs = Softmax(masked)
        [allow2] y = MatMul(probs, w2)
    }""", W)
    m.graph.node[1].attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(-np.inf, np.float32)))
    keep = np.array([[1, 1, 0, 0], [1, 0, 0, 0]], bool)
    out, report = convert(m, inputs=[{"x": rng(5).standard_normal((2, 4)).astype(np.float32), "keep": keep}])
    assert report.range_check.startswith("measured")
    assert colors(out) == {"allow1": "low", "const": "low", "fill": "low", "soft": "low", "allow2": "low"}
    x = rng(6).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(run(emulated(out), x=x, keep=keep)[0], run(m, x=x, keep=keep)[0], rtol=2e-2, atol=2e-2)
    stats = ValueStats.of(np.full(3, -np.inf, np.float32), Thresholds.of(Precision.FLOAT16))
    assert stats.max_abs == 0.0 and stats.nonzero == 0


def test_values_truncated_to_integers_are_computed_in_fp32():
    """Rule: the node computing a value that a Cast turns into an integer (through Floor and data
    movement) stays fp32, even under the all-low policy: float16 would move 20.98 to 21."""
    m = model("""(float[2,4] x) => (float[2,4] y, int64[2,4] ids) {
        [allow1] a = MatMul(x, w)
        [scale_fp32] s = Mul(a, k)
        [floor_fp32] f = Floor(s)
        [move_fp32] r = Reshape(f, shape)
        [cast_fp32] ids = Cast<to=7>(r)
        [allow2] y = MatMul(a, w2)
    }""", {**W, "k": np.array(1.0, np.float32), "shape": np.array([2, 4], np.int64)})
    out, report = convert(m, **schema_only(policy="all-low"))
    got = colors(out)
    assert {k: got[k] for k in ("scale_fp32", "floor_fp32", "move_fp32")} == {
        "scale_fp32": "fp32", "floor_fp32": "fp32", "move_fp32": "fp32"}
    assert got["allow1"] == "low" and got["allow2"] == "low"
    reasons = {d.node: d.reason for d in report.decisions}
    assert "truncated to an integer by Cast 'cast_fp32'" in reasons["scale_fp32"]
    x = np.full((2, 4), 1.0, np.float32)
    w = np.full((4, 4), 20.98 / 4, np.float32)  # a = 20.98 exactly enough in float32; float16 says 21.0
    m2 = model("""(float[2,4] x) => (int64[2,4] ids) {
        [allow1] a = MatMul(x, w)
        [cast_fp32] ids = Cast<to=7>(a)
    }""", {"w": w})
    out2, _ = convert(m2, **schema_only(policy="all-low"))
    assert run(out2, x=x)[0].tolist() == run(m2, x=x)[0].tolist() == [[20] * 4] * 2


def test_sin_and_cos_of_large_angles_stay_fp32():
    """Rule: Sin and Cos are deny: float16 rounds an angle x by up to |x|*2^-11, so a diffusion
    timestep embedding, sin/cos(t * freqs) with t up to 1000, would be off by up to 0.25; the Mul
    making the angles stays fp32 with them (one Cast, after the Concat), and the MatMul is low."""
    half = 8
    freqs = np.exp(-np.log(10000.0) * np.arange(half) / half).astype(np.float32)[None]
    m = model("""(float[4] t) => (float[4,4] y) {
        [clr_fp32] a = Unsqueeze(t, one)
        [angles_fp32] b = Mul(a, freqs)
        [sin_fp32] s = Sin(b)
        [cos_fp32] c = Cos(b)
        [cat_fp32] e = Concat<axis=1>(s, c)
        [allow] y = MatMul(e, w)
    }""", {"one": np.array([1], np.int64), "freqs": freqs,
           "w": rng(3).standard_normal((2 * half, 4)).astype(np.float32)})
    out, report = convert(m, provider=None)
    assert colors(out) == {"clr_fp32": "fp32", "angles_fp32": "fp32", "sin_fp32": "fp32", "cos_fp32": "fp32",
                           "cat_fp32": "fp32", "allow": "low"}
    assert "periodic function" in {d.node: d.reason for d in report.decisions}["sin_fp32"]
    t = np.array([3.0, 250.0, 617.0, 999.0], np.float32)
    want = run(m, t=t)[0]
    got = run(out, t=t)[0]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3
