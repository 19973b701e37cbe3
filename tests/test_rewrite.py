"""Invariants of the rewrite on the sample models: validity, idempotence, determinism, numerics."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from amp_rewrite import convert
from models import builders
from tests.helpers import _graphs, cast_targets, model, optimized, rng, run

SAMPLES = {name: build() for name, build in builders.SAMPLES.items()}
OPTION_SETS = {
    "cuda": {},
    "schema-low-io": dict(provider=None, keep_io_types=False),
    "bfloat16": dict(precision="bfloat16"),
    "all-low": dict(policy="all-low", provider=None),
}


def _inputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for info in model.graph.input:
        tensor_type = info.type.tensor_type
        shape = [d.dim_value or 3 for d in tensor_type.shape.dim]
        if info.name == "mask":
            shape = [3, 1, 3, 3]
        if tensor_type.elem_type == onnx.TensorProto.BOOL:
            feeds[info.name] = np.array(True)
        else:
            feeds[info.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


@pytest.mark.parametrize("options", list(OPTION_SETS))
@pytest.mark.parametrize("name", list(SAMPLES))
def test_sample_converts_validly_idempotently_and_deterministically(name: str, options: str) -> None:
    original = SAMPLES[name]
    first, report = convert(original, **OPTION_SETS[options])
    onnx.checker.check_model(first, full_check=True)
    again, _ = convert(original, **OPTION_SETS[options])
    assert again.SerializeToString() == first.SerializeToString(), "not deterministic"
    second, second_report = convert(first, **OPTION_SETS[options])
    assert second.SerializeToString() == first.SerializeToString(), "a second run changed the model"
    assert second_report.casts_inserted == 0
    assert [o.name for o in first.graph.output] == [o.name for o in original.graph.output]
    assert max(cast_targets(first).values(), default=1) == 1, "two casts of one tensor to one type"
    assert report.low_nodes > 0


@pytest.mark.parametrize("name", list(SAMPLES))
def test_sample_numerics_match_fp32(name: str) -> None:
    original = SAMPLES[name]
    mixed, _ = convert(original, provider=None)
    feeds = _inputs(original)
    for got, want in zip(run(mixed, **feeds), run(original, **feeds)):
        scale = float(np.abs(want).max())
        assert np.abs(np.asarray(got, np.float64) - want).max() <= 2e-2 * scale + 1e-3


def test_value_captured_by_subgraphs_is_cast_once_in_its_own_scope() -> None:
    """Rule: an outer value that bodies of If/Loop read is cast in the outer graph, once."""
    mixed, _ = convert(SAMPLES["control_flow"])
    outer_names = {o for n in mixed.graph.node for o in n.output} | {i.name for i in mixed.graph.input}
    bodies = list(_graphs(mixed.graph))[1:]
    inner_reads = {i for g in bodies for n in g.node for i in n.input}
    assert "projected" in inner_reads, "the bodies read the outer MatMul's output"
    assert not any(n.op_type == "Cast" and n.input[0] in outer_names for g in bodies for n in g.node)
    casts = [n for g in _graphs(mixed.graph) for n in g.node if n.op_type == "Cast" and n.input[0] == "projected"]
    assert len(casts) == 1 and casts[0] in list(mixed.graph.node)
    loop_body = next(a.g for n in mixed.graph.node if n.op_type == "Loop" for a in n.attribute)
    assert [o.type.tensor_type.elem_type for o in loop_body.output] == [9, 1], "body signature kept"


def test_external_data_sample_round_trips(tmp_path) -> None:
    source = builders.save_with_external_data(builders.transformer(blocks=2), tmp_path / "t.onnx")
    out, report = convert(source, tmp_path / "mixed.onnx")
    onnx.checker.check_model(str(out), full_check=True)
    assert (tmp_path / "mixed.onnx.data").stat().st_size < (tmp_path / "t.onnx.data").stat().st_size * 0.55
    loaded = onnx.load(str(out))
    assert all(t.data_type == onnx.TensorProto.FLOAT16 for t in loaded.graph.initializer if t.dims and t.dims[0] > 8)
    assert not any(e.key.startswith("amp_rewrite") for t in loaded.graph.initializer for e in t.external_data)
    feeds = _inputs(builders.transformer(blocks=2))
    want = run(onnx.load(str(source)), **feeds)[0]
    got = run(loaded, **feeds)[0]
    assert np.abs(got - want).max() < 2e-2 * np.abs(want).max()
    assert report.bytes_after < report.bytes_before


def test_streamed_large_model_builder_converts_with_external_data(tmp_path) -> None:
    """The >2 GB benchmark model's builder, at a size a test can afford."""
    source = builders.large_transformer(tmp_path / "big.onnx", target_bytes=3 << 20, width=128)
    out, report = convert(source, tmp_path / "big.mixed.onnx", range_check="off")
    onnx.checker.check_model(str(out), full_check=True)
    data = tmp_path / "big.mixed.onnx.data"
    assert data.stat().st_size < 0.51 * (tmp_path / "big.onnx.data").stat().st_size
    assert report.low_nodes == report.candidates


@pytest.mark.parametrize("name", ["control_flow", "transformer"])
def test_casts_inserted_in_place_or_by_rebuilding_the_node_list_agree(name: str, monkeypatch) -> None:
    """``PendingInserts`` inserts a few nodes where they go, and rebuilds a graph's node list
    when that would move too many: both give the same model."""
    from amp_rewrite.ir import graph

    options = dict(provider=None, keep_io_types=True)
    inserted, report = convert(SAMPLES[name], **options)
    assert report.casts_inserted > 0
    monkeypatch.setattr(graph, "INSERT_MOVES", 0)
    rebuilt, _ = convert(SAMPLES[name], **options)
    assert rebuilt.SerializeToString() == inserted.SerializeToString()


def _fused(m: onnx.ModelProto, op_type: str, tmp_path) -> int:
    """How many ``op_type`` nodes ONNX Runtime (CPU, all optimizations) makes of ``m``."""
    return sum(n.op_type == op_type for n in optimized(m, tmp_path).graph.node)


def test_the_shapes_a_shapeless_model_was_inferred_are_declared_as_converted(tmp_path):
    """The encoder declares no value info; the conversion declares what shape inference found,
    each entry typed as converted (strict inference agrees). ONNX Runtime's own inference
    finds no rank behind the attention's Reshapes, and its SkipLayerNormalization fusion needs
    one: the conversion's residual Adds and LayerNorms fuse only with the declarations. A
    conversion that keeps every node float32 changes nothing, declarations included."""
    m = builders.transformer(blocks=2)
    assert not m.graph.value_info
    out, _ = convert(m)
    declared = {v.name: v.type.tensor_type.elem_type for v in out.graph.value_info}
    computed = {o for n in m.graph.node for o in n.output} - {o.name for o in m.graph.output}
    assert computed <= set(declared)
    strict = onnx.shape_inference.infer_shapes(out, strict_mode=True)
    assert all(declared[v.name] == v.type.tensor_type.elem_type for v in strict.graph.value_info if v.name in declared)
    assert onnx.TensorProto.FLOAT16 in declared.values()
    undeclared = onnx.ModelProto()
    undeclared.CopyFrom(out)
    undeclared.graph.ClearField("value_info")
    assert _fused(out, "SkipLayerNormalization", tmp_path) == 1
    assert _fused(undeclared, "SkipLayerNormalization", tmp_path) == 0
    assert convert(out)[0] == out  # converting again changes nothing
    assert convert(m, keep_fp32_ops=sorted({n.op_type for n in m.graph.node}))[0] == m



def test_a_model_that_can_select_nothing_declares_no_invented_dims() -> None:
    """A detector's NonZero of a score threshold selects no box on some inputs. ONNX Runtime's
    ReshapeFusion matches the Reshape's target dims to its input's by the symbols declared
    (``unk__N``, which ONNX's inference makes up) and writes [0, -1], which an empty tensor
    cannot take: declared, the converted model failed where the original ran (torchvision's
    RetinaNet with no detection). The dims are declared unknown there instead."""
    m = model("""(float[N] scores, float[N,A,4] boxes) => (float[K,4] y) {
        [project] b = MatMul(boxes, w)
        keep = Greater(scores, threshold)
        found = NonZero(keep)
        picked = Squeeze(found, zero)
        kept = Gather(scores, picked)
        count = Shape(kept)
        k = Min(count, limit)
        top, order = TopK(kept, k)
        chosen = Gather(picked, order)
        selected = Gather(b, chosen)
        flat = Flatten<axis=1>(selected)
        low = Slice(flat, zero, two, one)
        high = Slice(flat, two, four, one)
        low3 = Unsqueeze(low, two)
        high3 = Unsqueeze(high, two)
        pairs = Concat<axis=2>(low3, high3)
        shape = Shape(flat)
        rows = Gather<axis=0>(shape, first)
        cols = Gather<axis=0>(shape, second)
        rows1 = Unsqueeze(rows, zero)
        cols1 = Unsqueeze(cols, zero)
        target = Concat<axis=0>(rows1, cols1)
        y = Reshape(pairs, target)
    }""", {"w": rng(0).normal(size=(4, 4)).astype(np.float32), "threshold": np.array(0.5, np.float32),
           "limit": np.array([1000], np.int64), "first": np.array(0, np.int64), "second": np.array(1, np.int64),
           **{name: np.array([v], np.int64) for name, v in (("zero", 0), ("one", 1), ("two", 2), ("four", 4))}})
    out, _ = convert(m, range_check="off")
    dims = [d for v in out.graph.value_info for d in v.type.tensor_type.shape.dim]
    assert len(out.graph.value_info) > 10 and not any(d.dim_param.startswith("unk__") for d in dims)
    assert any(d.dim_param == "N" for d in dims)  # the model's own dim names stay
    boxes = rng(1).normal(size=(6, 1, 4)).astype(np.float32)
    for scores in (np.zeros(6, np.float32), np.ones(6, np.float32)):  # nothing selected, everything
        feeds = {"scores": scores, "boxes": boxes}
        original, deployed = (ort.InferenceSession(x.SerializeToString()).run(None, feeds)[0] for x in (m, out))
        assert deployed.shape == original.shape == ((0, 4) if not scores.any() else (6, 4))
        np.testing.assert_allclose(deployed, original, rtol=1e-2, atol=1e-2)

@pytest.mark.parametrize("shape", [None, [], [1, 128, 768], ["batch", None, 3], ["d" * 300, *range(1, 40)]])
@pytest.mark.parametrize("source", [onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16])
def test_a_declared_type_is_retyped_as_protobuf_would_write_it(source: int, shape) -> None:
    """``DeclareInferredShapes`` retypes an inferred type's bytes where the element type is one
    byte (in place) and parses them otherwise: both give protobuf's own bytes."""
    from amp_rewrite.rewrite.passes.declare_inferred_shapes import _with_elem_type

    serialized = onnx.helper.make_tensor_type_proto(source, shape).SerializeToString()
    for target in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT, 200):
        expected = onnx.TypeProto.FromString(serialized)
        expected.tensor_type.elem_type = target
        assert _with_elem_type(serialized, target) == expected.SerializeToString()


def test_a_graph_that_declares_value_info_keeps_its_own() -> None:
    """Declarations go only to graphs that declare none: an exporter's own are left as written."""
    m = builders.transformer(blocks=1)
    first = m.graph.node[0].output[0]
    m.graph.value_info.add(name=first).type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    out, _ = convert(m)
    assert [v.name for v in out.graph.value_info] == [first]
