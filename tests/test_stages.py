"""The range check's staged runs measure what one session exposing every value measures."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from amp_rewrite.runtime import instrument, samples, stages
from models.builders import control_flow, transformer
from tests.helpers import model

THRESHOLD = instrument.Thresholds(3e-8, 6e-5)


def _at_once(m: onnx.ModelProto, keys, data) -> dict:
    exposed = instrument.expose(m, keys, THRESHOLD)
    session = instrument.session(exposed.model)
    return instrument.merge(instrument.measure(exposed, instrument.run(session, s), THRESHOLD) for s in data)


def _staged(m: onnx.ModelProto, keys, data) -> dict:
    lifted = instrument.lift_nested(m, keys, THRESHOLD)
    top = {name: (graph, name) for graph, name in keys if graph == 0}
    return stages.measure(lifted.model, top, lifted.stats, data, THRESHOLD, None, lambda text: None)


@pytest.mark.parametrize("stage_nodes", [1, 7, 10_000])
@pytest.mark.parametrize("build", [lambda: transformer(blocks=2, with_mask=True), control_flow],
                         ids=["transformer", "control_flow"])
def test_staged_statistics_equal_one_session_exposing_everything(build, stage_nodes, monkeypatch) -> None:
    m = build()
    monkeypatch.setattr(stages, "STAGE_NODES", stage_nodes)
    keys = instrument.float_values(m)
    data = samples.generate(m, 2, seed=3)
    staged = _staged(m, keys, data)
    assert staged == _at_once(m, keys, data)
    assert len(staged) == len(keys) and any(k[0] != 0 for k in keys) == (build is control_flow)


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
    assert measured == _at_once(m, instrument.float_values(m), data)


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
    assert plan[1].outputs == ["s"] and plan[2].reads == ["s"]
    assert plan[1].passed == ["s"] and plan[3].outputs == ["y"] and plan[3].passed == []
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
    measured = stages.measure(m, {"y": (0, "y")}, {}, [{"x": x}], THRESHOLD, None, lambda text: None)
    assert measured[(0, "y")].max_abs == pytest.approx(2 * np.abs(np.maximum(x, 0)).max())


def test_the_stages_alternate_between_two_processes_with_the_same_statistics(monkeypatch) -> None:
    """With the values' types known ahead, every other stage runs in a second child process
    (each process makes its next session while the other runs a stage); what they hand each
    other gives, on two samples, the statistics of one session exposing everything. A type
    known wrongly ahead is made again from the values."""
    m = transformer(blocks=2, with_mask=True)
    monkeypatch.setattr(stages, "STAGE_NODES", 9)
    keys = [k for k in instrument.float_values(m) if k[0] == 0]
    data = samples.generate(m, 2, seed=3)
    types = {name: onnx.TensorProto.FLOAT for _, name in keys}
    wrong = dict(types, **{next(iter(types)): onnx.TensorProto.INT64})
    top = {name: (0, name) for _, name in keys}
    count = len(stages.plan(m.graph, set(top)))
    expected = _at_once(m, keys, data)
    for given in (types, wrong):
        steps: list[str] = []
        assert stages.measure(m, top, {}, data, THRESHOLD, None, steps.append, given) == expected
        ran = [int(step.split()[2]) for step in steps if step.startswith("running stage ")]
        assert count > 4 and ran == list(range(1, count + 1, 2))  # this process: stages 1, 3, 5, ...


def test_alternating_stages_carry_the_statistics_of_nested_values(monkeypatch) -> None:
    """Statistics rows lifted out of If/Loop/Scan bodies, measured by stages alternating
    between two processes, equal one session's."""
    m = control_flow()
    monkeypatch.setattr(stages, "STAGE_NODES", 3)
    keys = instrument.float_values(m)
    data = samples.generate(m, 2, seed=3)
    lifted = instrument.lift_nested(m, keys, THRESHOLD)
    top = {name: (graph, name) for graph, name in keys if graph == 0}
    types = {name: onnx.TensorProto.FLOAT for name in top}
    steps: list[str] = []
    measured = stages.measure(lifted.model, top, lifted.stats, data, THRESHOLD, None, steps.append, types)
    assert measured == _at_once(m, keys, data) and any(key[0] != 0 for key in measured)
    ran = [int(step.split()[2]) for step in steps if step.startswith("running stage ")]
    assert len(ran) > 1 and ran == list(range(1, 2 * len(ran), 2))


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
    live = [{"x": np.ones((2, 4), np.float32)}]
    held = []  # the values held as each stage starts to run

    def progress(text: str) -> None:
        if text.startswith("running"):
            held.append(sorted(live[0]))

    runs.alternate(0, 1, live, {}, None, progress)
    assert held == [["x"], ["a", "x"], ["b", "x"], ["b", "c"]] and live == [{}]
    assert set(runs.measured) == set(keys.values())
