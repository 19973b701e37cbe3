"""The range check's staged runs measure what one session exposing every value measures."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from amp_rewrite.inputs import samples
from amp_rewrite.ir.measurements import PackedStats, Thresholds, ValueStats
from amp_rewrite.runtime import expose, instrument, stages
from models.builders import control_flow, transformer
from tests.helpers import model

THRESHOLD = Thresholds(3e-8, 6e-5)


def _at_once(m: onnx.ModelProto, keys, data) -> dict:
    exposed = expose.expose(m, keys, THRESHOLD)
    session = instrument.session(exposed.model)
    return expose.merge(expose.measure(exposed, instrument.run(session, s), THRESHOLD) for s in data)


def _staged(m: onnx.ModelProto, keys, data) -> dict:
    lifted = expose.lift_nested(m, keys, THRESHOLD)
    top = {name: (graph, name) for graph, name in keys if graph == 0}
    return stages.measure(lifted.model, top, lifted.stats, data, THRESHOLD, None, lambda text: None)


@pytest.mark.parametrize("handed", [stages.HANDED_BYTES, 0], ids=["large-weights-handed", "every-float-weight-handed"])
@pytest.mark.parametrize("stage_nodes", [1, 7, 10_000])
@pytest.mark.parametrize("build", [lambda: transformer(blocks=2, with_mask=True), control_flow],
                         ids=["transformer", "control_flow"])
def test_staged_statistics_equal_one_session_exposing_everything(build, stage_nodes, handed, monkeypatch) -> None:
    """Also where the stages' sessions get every float weight as an array beside a placeholder,
    not in the serialized stage."""
    m = build()
    monkeypatch.setattr(stages, "STAGE_NODES", stage_nodes)
    monkeypatch.setattr(stages, "HANDED_BYTES", handed)
    keys = expose.float_values(m)
    data = samples.generate(m, 2, seed=3)
    staged = _staged(m, keys, data)
    assert staged == _at_once(m, keys, data)
    assert len(staged) == len(keys) and any(k[0] != 0 for k in keys) == (build is control_flow)


@pytest.mark.parametrize("handed", [stages.HANDED_BYTES, 0], ids=["large-weights-handed", "every-float-weight-handed"])
def test_borrowed_weights_are_measured_as_embedded_ones(handed, tmp_path, monkeypatch) -> None:
    """A model loaded with its float weights left in the file (``io.load(borrow=...)``): the
    stages get the small ones' values written in, ONNX Runtime reads the large ones from the
    file (every one where HANDED_BYTES is 0), and they measure what the embedded model gives."""
    from amp_rewrite.ir import io

    path = tmp_path / "m.onnx"
    onnx.save(transformer(blocks=2, with_mask=True), path)
    monkeypatch.setattr(io, "STREAMED_LOAD_BYTES", 0)
    monkeypatch.setattr(stages, "HANDED_BYTES", handed)
    lent = io.load(path, borrow=io.EXTERNAL_THRESHOLD)
    assert sum(t.data_location == onnx.TensorProto.EXTERNAL for t in lent.graph.initializer) > 10
    keys = expose.float_values(lent)
    top = {name: (0, name) for _, name in keys}
    data = samples.generate(lent, 2, seed=3)
    measured = stages.measure(lent, top, {}, data, THRESHOLD, str(tmp_path), lambda text: None, threads=1)
    assert measured == _at_once(onnx.load(path), keys, data)


def test_lifting_every_nested_value_lifts_the_nested_float_values() -> None:
    m = control_flow()
    every = expose.lift_nested(m, None, THRESHOLD)
    named = expose.lift_nested(m, [k for k in expose.float_values(m) if k[0]], THRESHOLD)
    assert every.stats and sorted(every.stats.values()) == sorted(named.stats.values())
    plain = transformer(blocks=1)
    assert expose.lift_nested(plain, None, THRESHOLD).stats == {}


def test_named_values_that_are_not_float_tensors_are_passed_over() -> None:
    m = model("""(float[2,4] x) => (float[2,4] y) {
        s = Shape(x)
        r = Reshape(x, s)
        y = Relu(r)
    }""")
    every = {o: (0, o) for node in m.graph.node for o in node.output}
    data = samples.generate(m, 2, seed=3)
    measured = stages.measure(m, every, {}, data, THRESHOLD, None, lambda text: None, threads=1)
    assert set(measured) == {(0, "r"), (0, "y")}
    assert measured == _at_once(m, expose.float_values(m), data)


def test_only_the_nodes_the_watched_values_need_run_and_sequences_cross_stages() -> None:
    m = model("""(float[2,4] x) => (float[2,4] y, float[2,4] z) {
        a = Relu(x)
        s = SequenceConstruct(a, x)
        b = Neg(x)
        first = SequenceAt(s, zero)
        y = Mul(first, two)
        z = Exp(b)
    }""", {"zero": np.array(0, np.int64), "two": np.array(2.0, np.float32)})
    plan = stages.plan(m.graph, {"y"}, stage_nodes=1)
    ops = [[m.graph.node[p].op_type for p in s.nodes] for s in plan]
    assert ops == [["Relu"], ["SequenceConstruct"], ["SequenceAt"], ["Mul"]]  # no Neg, no Exp
    assert plan[1].outputs == ["s"] and plan[2].reads == ["s"] and plan[2].done == ["s"]
    assert plan[1].passed == ["s"] and plan[3].outputs == ["y"] and plan[3].passed == []
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
    measured = stages.measure(m, {"y": (0, "y")}, {}, [{"x": x}], THRESHOLD, None, lambda text: None)
    assert measured[(0, "y")].max_abs == pytest.approx(2 * np.abs(np.maximum(x, 0)).max())


def test_a_stage_keeps_only_the_values_that_later_stages_read() -> None:
    """A watched value that no later stage reads is measured and dropped at once: the values
    held between stages are those crossing into later ones, not every value measured so far."""
    m = model("""(float[2,4] x) => (float[2,4] y) {
        a = Relu(x)
        b = Neg(a)
        c = Exp(x)
        y = Mul(b, c)
    }""")
    keys = {name: (0, name) for name in ("a", "b", "c", "y")}
    plan = stages.plan(m.graph, set(keys), stage_nodes=1)
    runs = stages._Runs(m, plan, keys, {}, THRESHOLD, None)
    values = {"x": np.ones((2, 4), np.float32)}
    held = []  # the values held as each stage starts to run
    for stage in plan:
        held.append(sorted(values))
        types = {name: stages._type_of(values[name]) for name in stage.reads}
        stage_model = stages._stage_model(m, runs.head, stage, types, runs.weights, runs.handed, None)
        runs.run(instrument.session(stage_model, initializers=runs.handed_to(stage)), stage, values)
    assert held == [["x"], ["a", "x"], ["b", "x"], ["b", "c"]] and values == {}
    assert set(runs.measured) == set(keys.values())


def test_packed_statistics_cross_a_pickle_and_read_as_the_dict_they_pack() -> None:
    """What the measuring child sends its caller: every key reads back the statistics it had
    (counts as ints, the peak as a float), and a key not measured reads as missing."""
    import pickle

    m = control_flow()
    keys = expose.float_values(m)
    stats = _staged(m, keys, samples.generate(m, 2, seed=3))
    packed = pickle.loads(pickle.dumps(PackedStats(stats)))
    assert len(packed) == len(stats) > 0
    for key, value in stats.items():
        got = packed.get(key)
        assert got == value and all(type(a) is type(b) for a, b in zip(got, value)), key
    assert packed.get((0, "no such value")) is None


def test_a_nested_value_measured_in_the_graph_counts_only_its_finite_elements() -> None:
    """A value inside an If branch holding -inf (a mask's fill) has the statistics of its finite
    elements, as one measured whole: float16 holds -inf itself."""
    from onnx import TensorProto, helper, numpy_helper

    fill = numpy_helper.from_array(np.array(-np.inf, np.float32))
    branch = helper.make_graph(
        [helper.make_node("Constant", [], ["minus_inf"], value=fill),
         helper.make_node("Where", ["keep", "x", "minus_inf"], ["masked"]),
         helper.make_node("Abs", ["masked"], ["out"])],
        "masked", [], [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 4])])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["plain"])], "plain", [],
                              [helper.make_tensor_value_info("plain", TensorProto.FLOAT, [2, 4])])
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], then_branch=branch, else_branch=other)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("keep", TensorProto.BOOL, [2, 4]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    keys = [k for k in expose.float_values(m) if k[0]]
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
    data = [{"x": x, "keep": x > 0, "flag": np.array(True)}]
    staged = _staged(m, keys, data)
    assert staged == _at_once(m, keys, data)
    assert staged[next(k for k in keys if k[1] == "masked")].max_abs == 4.0
    assert staged[next(k for k in keys if k[1] == "minus_inf")] == ValueStats(0.0, 0, 0, 0)


def _with_trips(m: onnx.ModelProto, trips: int) -> onnx.ModelProto:
    from onnx import numpy_helper

    at = next(i for i, t in enumerate(m.graph.initializer) if t.name == "trips")
    m.graph.initializer[at].CopyFrom(numpy_helper.from_array(np.array(trips, np.int64), "trips"))
    return m


def test_a_loop_carries_its_values_statistics_as_one_running_row_whatever_its_trip_count() -> None:
    """A value inside a Loop body comes out as one row (a loop-carried value, not a scan output
    of a row per iteration, which a Loop of 10**13 trips grows without bound) holding what every
    iteration's value gives, measured here in numpy."""
    m = _with_trips(control_flow(width=4), 50)
    loop = next(n for n in m.graph.node if n.op_type == "Loop")
    body = {n.name: n.output[0] for n in loop.attribute[0].g.node if n.name in ("body_matmul", "body_tanh", "body_add")}
    keys = [k for k in expose.float_values(m) if k[0] and k[1] in body.values()]
    carried_in = next(n for n in m.graph.node if n.op_type == "If").output[0]
    exposed = expose.expose(m, [*keys, (0, carried_in), (0, "projected")], THRESHOLD)
    data = samples.generate(m, 1, seed=3)[0]
    results = instrument.run(instrument.session(exposed.model), data)
    assert len(exposed.stats) == 3 and all(results[name].shape == (4,) for name in exposed.stats)
    weight = next(onnx.numpy_helper.to_array(t) for t in m.graph.initializer
                  if t.name == loop.attribute[0].g.node[0].input[1])
    carried, seen = results[carried_in], {name: [] for name in body}
    for _ in range(50):
        product = carried @ weight
        carried = np.tanh(product) + results["projected"]
        for name, value in zip(("body_matmul", "body_tanh", "body_add"), (product, np.tanh(product), carried)):
            seen[name].append(ValueStats.of(value, THRESHOLD))
    measured = expose.measure(exposed, results, THRESHOLD)
    for name, rows in seen.items():
        got, want = measured[next(k for k in keys if k[1] == body[name])], expose.merge({0: r} for r in rows)[0]
        assert got[1:] == want[1:] and got.max_abs == pytest.approx(want.max_abs, rel=1e-5), name
