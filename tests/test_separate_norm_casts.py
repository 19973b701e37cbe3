"""SeparateNormCasts: a converted decomposed LayerNorm loads in ONNX Runtime at its default
optimizations, whose LayerNormFusion takes a leading Cast into a LayerNormalization of mixed
types (found on an H100 by benchmarks/gpu_fuzz.py, and the same on the CPU provider)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from amp_rewrite import convert
from amp_rewrite.runtime import instrument, samples
from models.builders import transformer
from tests.helpers import model, rng

NORM = """mean = ReduceMean <axes = [-1]> (h)
          d = Sub (h, mean)
          p = Pow (d, two)
          v = ReduceMean <axes = [-1]> (p)
          ve = Add (v, eps)
          s = Sqrt (ve)
          n = Div (d, s)
          ng = Mul (n, gamma)
          y = Add (ng, beta)"""
WEIGHTS = {"w": rng(0).standard_normal((8, 8)).astype(np.float32), "two": np.float32(2.0),
           "eps": np.float32(1e-5), "gamma": np.ones(8, np.float32), "beta": np.zeros(8, np.float32)}


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
    converted, report = convert(m, provider=None)
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


def test_the_sample_transformer_with_decomposed_layernorms_loads_at_default_optimizations() -> None:
    """The bundled encoder with its LayerNorms written out (as older exporters write them): the
    first reads the float16 embeddings' Cast, which ONNX Runtime refused to fuse before."""
    m = transformer(blocks=2, with_mask=True, fused_layer_norm=False)
    converted, report = convert(m)
    assert any("LayerNormFusion" in note for note in report.notes)
    feeds = samples.generate(m, seed=0)[0]
    _loads_at_default_optimizations_and_matches(m, converted, feeds)
