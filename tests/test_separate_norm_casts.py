"""SeparateNormCasts: a converted decomposed LayerNorm loads in ONNX Runtime at its default
optimizations, whose LayerNormFusion takes a leading Cast, and Casts after the scaling and the
weight, into a LayerNormalization of mixed types (found on an H100 by benchmarks/gpu_fuzz.py,
and the same on the CPU provider)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from amp_rewrite import convert
from amp_rewrite.inputs import samples
from amp_rewrite.runtime import instrument
from models.builders import transformer
from tests.helpers import cast_count, colors, model, optimized, rng

NORM = """mean = ReduceMean <axes = [-1]> (h)
          d = Sub (h, mean)
          p = Pow (d, two)
          v = ReduceMean <axes = [-1]> (p)
          ve = Add (v, eps)
          s = Sqrt (ve)
          n = Div (d, s)
          [weight] ng = Mul (n, gamma)
          [bias] y = Add (ng, beta)"""
WEIGHTS = {"w": rng(0).standard_normal((8, 8)).astype(np.float32), "two": np.float32(2.0),
           "eps": np.float32(1e-5), "gamma": np.ones(8, np.float32), "beta": np.zeros(8, np.float32)}


def _optimized_ops(converted: onnx.ModelProto, tmp_path) -> list[tuple[str, list[int]]]:
    """(op type, its inputs' element types) of each node of the model ONNX Runtime runs."""
    graph = onnx.shape_inference.infer_shapes(optimized(converted, tmp_path)).graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.input, *graph.output)}
    types.update((t.name, t.data_type) for t in graph.initializer)
    return [(n.op_type, [types.get(i) for i in n.input]) for n in graph.node]


def _unfused_readers(converted: onnx.ModelProto) -> list[str]:
    """The ops that read a Reshape's output, for each Reshape that SeparateNormCasts added."""
    made = {n.output[0] for n in converted.graph.node if n.op_type == "Reshape" and n.output[0].endswith("_unfused")}
    return sorted(n.op_type for n in converted.graph.node if made & set(n.input))


def _loads_at_default_optimizations_and_matches(m: onnx.ModelProto, converted: onnx.ModelProto, feeds) -> None:
    got = instrument.session(converted, optimize="all").run(None, feeds)
    want = instrument.session(m).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float32), w, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("opset", [17, 18])
def test_a_float32_layernorm_after_a_float16_matmul_loads_at_default_optimizations(opset: int) -> None:
    norm = NORM if opset < 18 else NORM.replace("<axes = [-1]> (h)", "(h, last)").replace("<axes = [-1]> (p)",
                                                                                        "(p, last)")
    m = model(f"""(float[2,8] x) => (float[2,8] y) {{ h = MatMul (x, w)
                                                      {norm} }}""",
              {**WEIGHTS, "last": np.array([-1], np.int64)}, opset=opset)
    converted, report = convert(m, provider=None)  # no LayerNormalization low: the norm is float32
    assert _unfused_readers(converted) == ["ReduceMean", "Sub"]
    assert any("LayerNormFusion" in note for note in report.notes)
    assert convert(converted, provider=None)[0] == converted  # converting again changes nothing
    _loads_at_default_optimizations_and_matches(m, converted, {"x": rng(1).standard_normal((2, 8)).astype(np.float32)})


def test_an_integer_mask_cast_that_float16_readers_leave_to_the_layernorm_loads() -> None:
    """The model's Cast of an int64 mask feeds a float32 LayerNorm and a float16 MatMul; the
    MatMul now reads its own Cast of the mask, which leaves the model's Cast to the LayerNorm."""
    m = model(f"""(int64[2,8] mask) => (float[2,8] y, float[2,8] z) {{ h = Cast <to = 1> (mask)
                                                                    z = MatMul (h, w)
                                                                    {NORM} }}""", WEIGHTS)
    converted, _ = convert(m, provider=None)
    assert _unfused_readers(converted) == ["ReduceMean", "Sub"]
    _loads_at_default_optimizations_and_matches(m, converted, {"mask": rng(2).integers(0, 2, (2, 8))})


def test_a_cast_that_other_nodes_read_too_is_left_alone() -> None:
    """ONNX Runtime fuses no Cast that another node reads (here a float32 Softmax): nothing added."""
    m = model(f"""(float[2,8] x) => (float[2,8] y, float[2,8] t) {{ h = MatMul (x, w)
                                                                 t = Softmax (h)
                                                                 {NORM} }}""", WEIGHTS)
    converted, report = convert(m, provider=None)
    assert _unfused_readers(converted) == []
    assert not any("LayerNormFusion" in note for note in report.notes)
    _loads_at_default_optimizations_and_matches(m, converted, {"x": rng(1).standard_normal((2, 8)).astype(np.float32)})


@pytest.mark.parametrize("provider", ["CUDAExecutionProvider", None])
def test_the_sample_transformer_with_decomposed_layernorms_loads_at_default_optimizations(provider, tmp_path) -> None:
    """The bundled encoder with its LayerNorms written out (as older exporters write them). For
    CUDA, whose LayerNormalization runs float16, each norm's scaling ends its float32 region:
    the residual stream, weights and biases are float16: each norm reads one Cast of the stream
    and its weight one Cast of its scaling, which ONNX Runtime fuses with the norm (on the CPU
    provider, which has no float16 kernel for some of the ops around, not always in float16).
    Without a provider the norms are float32 islands; the first reads the float16 input's
    Cast, which ONNX Runtime refused to fuse before."""
    m = transformer(blocks=2, with_mask=True, fused_layer_norm=False)
    converted, report = convert(m, provider=provider)
    norms = [types for op, types in _optimized_ops(converted, tmp_path)
             if op in ("LayerNormalization", "SkipLayerNormalization")]  # the latter with the residual Add
    assert len(norms) == 4  # two per block
    if provider:
        assert not any("LayerNormFusion" in note for note in report.notes)
        # float32: each norm's statistics and scaling (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div)
        assert list(colors(converted).values()).count("fp32") == 7 * 4
        readers = [sorted(r.op_type for r in converted.graph.node if c.output[0] in r.input)
                   for c in converted.graph.node if c.op_type == "Cast"]
        assert readers.count(["ReduceMean", "Sub"]) == readers.count(["Mul"]) == 4
        assert cast_count(converted) == 2 + 4 * 2 + 1  # the inputs, into and out of each norm, the output
    else:
        assert any("LayerNormFusion" in note for note in report.notes)
        assert all(set(types) == {TensorProto.FLOAT} for types in norms)
    feeds = samples.generate(m, seed=0)[0]
    _loads_at_default_optimizations_and_matches(m, converted, feeds)


@pytest.mark.parametrize("stream", ["low", "fp32"])
@pytest.mark.parametrize("affine", ["low", "fp32"])
def test_a_layernorm_fuses_where_its_input_weight_and_bias_share_a_type_and_else_not_at_all(stream, affine,
                                                                                              tmp_path) -> None:
    """For CUDA, the scaling of a written-out LayerNorm ends its float32 region, so its input,
    weight and bias may each be float16 or float32 (here forced). ONNX Runtime fuses the norm
    with the Casts around it, into a LayerNormalization of its input's type: where the weight
    and bias have another, SeparateNormCasts keeps it from fusing, and the model loads."""
    m = model(f"""(float[2,8] x) => (float[2,8] y) {{ [producer] h = MatMul (x, w)
                                                      {NORM} }}""", WEIGHTS)
    forced = {"low": [], "fp32": []}
    forced[stream].append("producer")
    forced[affine] += ["weight", "bias"]
    converted, _ = convert(m, keep_fp32_nodes=forced["fp32"], force_low_nodes=forced["low"], range_check="off")
    found = colors(converted)
    assert (found["producer"], found["weight"], found["bias"]) == (stream, affine, affine)
    norms = [types for op, types in _optimized_ops(converted, tmp_path) if op == "LayerNormalization"]
    if stream == affine:
        assert norms == [[TensorProto.FLOAT16 if stream == "low" else TensorProto.FLOAT] * 3]
        assert _unfused_readers(converted) == []
    elif stream == "low":  # the norm reads the stream's Cast through the Reshape: float32 throughout
        assert norms == [[TensorProto.FLOAT] * 3] and _unfused_readers(converted) == ["ReduceMean", "Sub"]
    else:  # the weight reads the scaling's Cast through the Reshape: no LayerNormalization
        assert norms == [] and _unfused_readers(converted) == ["Mul"]
    _loads_at_default_optimizations_and_matches(m, converted, {"x": rng(1).standard_normal((2, 8)).astype(np.float32)})
