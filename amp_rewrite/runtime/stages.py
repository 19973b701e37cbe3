"""Measuring a model's values stage by stage, so the cost stays close to one model run.

Two things make "one session with every value as an output" slow on big graphs:
ONNX Runtime's session creation grows faster than linearly with the node count
(its buffer-reuse planner most of all: a 20k-node model took minutes), and a run
holds every exposed value at once. ``measure`` therefore

- keeps only the nodes that the watched values depend on;
- cuts them, in the graph's order, into stages of at most ``STAGE_NODES`` nodes
  (nested nodes counted), each run as its own model, with buffer reuse off;
- feeds each stage the values earlier stages computed, reduces the watched values it
  returns to ``ValueStats`` at once, and keeps only what later stages read;
- hands what a stage freed (its session, its values) back to the system before the next;
- given the values' types ahead, alternates the stages between two processes, each
  creating its next session while the other runs a stage (two cores share the session
  creation), handing each other the values the other's stages read.

Memory holds one stage's values plus the values crossing into later stages.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from amp_rewrite.ir.graph import ValueKey, names_read, subgraphs
from amp_rewrite.ir.io import length_delimited
from amp_rewrite.runtime import instrument
from amp_rewrite.runtime.instrument import Thresholds, ValueStats
from amp_rewrite.runtime.isolate import FORKS, Progress, Started, release_free_memory
from amp_rewrite.runtime.samples import Sample

STAGE_NODES = 500
"""Nodes per stage: small enough that session creation stays linear and that a stage's
session and values stay small, large enough that the per-session overhead does not show.
Measured on the 48.6k- and 19.4k-node benchmark transformers (2 cores, the analysis running
beside): 500 nodes against 1,000 and 2,500 took 5.2-5.7 s against 5.4-5.6 and 5.4-5.9 (2.3 s
against 2.5-2.6 and 2.4-2.8) with less peak memory (378 against 389 and 421 MiB PSS; 218
against 228 and 261); 250 nodes saved no more memory (374)."""


@dataclass
class Stage:
    start: int
    stop: int
    nodes: list[int]
    """Positions of the top-level nodes the stage runs (those the watched values need)."""
    reads: list[str] = field(default_factory=list)
    """Values computed before the stage (or graph inputs) that it reads."""
    weights: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    """Values it returns: those watched, and those later stages read."""
    passed: list[str] = field(default_factory=list)
    """Its outputs that later stages read: the only ones kept past the stage."""


def plan(graph: onnx.GraphProto, watched: set[str], stage_nodes: int | None = None) -> list[Stage]:
    """The stages that compute ``watched`` (top-level value names) of ``graph``."""
    nodes = list(graph.node)  # read each node's fields once: protobuf access costs more than lists
    nested = [_nested_nodes(n) for n in nodes]
    reads = [names_read([n]) if nested[p] else {i for i in n.input if i} for p, n in enumerate(nodes)]
    outputs = [[o for o in n.output if o] for n in nodes]
    kept = _needed(watched, reads, outputs)
    stage_nodes = stage_nodes or STAGE_NODES
    stages: list[Stage] = []
    count = 0
    for position in kept:
        size = 1 + nested[position]
        if not stages or count + size > stage_nodes:
            stages.append(Stage(position, position, []))
            count = 0
        stages[-1].nodes.append(position)
        stages[-1].stop = position + 1
        count += size
    weights = {t.name for t in graph.initializer}
    last_read: dict[str, int] = {}
    for s, stage in enumerate(stages):
        for position in stage.nodes:
            for name in reads[position]:
                last_read[name] = s
    for s, stage in enumerate(stages):
        made = {o for p in stage.nodes for o in outputs[p]}
        read = set().union(*(reads[p] for p in stage.nodes)) - made
        stage.weights = sorted(read & weights)
        stage.reads = sorted(read - weights)
        stage.passed = sorted(o for o in made if last_read.get(o, -1) > s)
        stage.outputs = sorted(set(stage.passed).union(o for o in made if o in watched))
    return stages


def _needed(watched: set[str], reads: list[set[str]], outputs: list[list[str]]) -> list[int]:
    """Positions of the nodes that ``watched`` depend on, in order."""
    needed = set(watched)
    kept = []
    for position in range(len(outputs) - 1, -1, -1):
        if not needed.isdisjoint(outputs[position]):
            kept.append(position)
            needed |= reads[position]
    kept.reverse()
    return kept


def measure(model: onnx.ModelProto, top: Mapping[str, ValueKey], stats: Mapping[str, ValueKey],
            data: Sequence[Sample], thresholds: Thresholds, base_dir: str | os.PathLike | None,
            progress: Progress, types: Mapping[str, int] | None = None,
            threads: int = 0) -> dict[ValueKey, ValueStats]:
    """Statistics of the ``top`` values (output name -> value; those that are not float32
    tensors are passed over) and of the statistics rows that
    ``instrument.lift_nested`` carried out (``stats``), over every sample of ``data``.
    ``threads``: ONNX Runtime's intra-op threads in one process (0: one per core; 1 when
    something else runs beside).

    With ``types`` (the element types of top-level tensor values) and more than one stage,
    the stages alternate between this process and a second child process: each creates the
    session of its next stage while the other runs one (session creation, the larger part
    of the cost, overlaps the runs on two cores), and hands over what the other reads of
    each stage's outputs as soon as it ran. Each process holds one session at a time, with
    one thread: ONNX Runtime's per-session thread pools, spinning beside the other process,
    made the 48.6k-node benchmark transformer's measurement take 4.3-4.9 s instead of 2.8-3.3."""
    runs = _Runs(model, plan(model.graph, set(top) | set(stats)), top, stats, thresholds, base_dir)
    live = [dict(sample) for sample in data]
    if types is None or not FORKS or len(runs.stages) < 2:
        return runs.alternate(0, 1, live, {}, None, progress, threads)
    known = {name: helper.make_tensor_type_proto(types[name], None)
             for stage in runs.stages for name in stage.reads if name in types}
    known.update((name, _type_of(value)) for name, value in live[0].items())
    other = Started(lambda report, peer: runs.alternate(1, 2, live, known, peer, report),
                    "onnxruntime (range check, second process)")
    try:
        runs.alternate(0, 2, live, known, other, progress)
        for key, found in other.result().items():
            runs.add(key, found)
    finally:
        other.close()
    return runs.measured


class _Runs:
    """The stages of one measurement, and what they measured so far."""

    def __init__(self, model: onnx.ModelProto, stages: list[Stage], top: Mapping[str, ValueKey],
                 stats: Mapping[str, ValueKey], thresholds: Thresholds, base_dir) -> None:
        self.model, self.stages, self.top, self.stats = model, stages, top, stats
        self.thresholds, self.base_dir = thresholds, base_dir
        self.weights = {t.name: t for t in model.graph.initializer}
        self.head = _model_head(model)
        self.measured: dict[ValueKey, ValueStats] = {}

    def where(self, number: int) -> str:
        stage = self.stages[number]
        first = self.model.graph.node[stage.nodes[0]]
        return (f"stage {number + 1} of {len(self.stages)} (nodes {stage.start}-{stage.stop - 1}, from "
                f"{first.op_type} {first.name or first.output[0]!r})")

    def session(self, number: int, types: Mapping[str, onnx.TypeProto], threads: int, progress: Progress):
        progress(f"creating the session for {self.where(number)}")
        model = _stage_model(self.model, self.head, self.stages[number], types, self.weights)
        return instrument.session(model, self.base_dir, reuse_memory=False, arena=False, threads=threads)

    def alternate(self, worker: int, workers: int, live: list[Sample], known: Mapping[str, onnx.TypeProto],
                  peer, progress: Progress, threads: int = 1) -> dict[ValueKey, ValueStats]:
        """Run every ``workers``-th stage from ``worker`` on every sample's ``live`` values; a
        ``peer`` (``Started`` or its child's end) runs the others. A stage's session is made
        from the ``known`` types before the peer's values for it arrive (from the values when
        a type is not known ahead or was wrong). The peer gets, after each stage, the outputs
        its later stages read; after its own stage, each process keeps only what its own later
        stages read."""
        mine = range(worker, len(self.stages), workers)
        theirs = [number for number in range(len(self.stages)) if number % workers != worker]
        received = 0
        for number in mine:
            stage = self.stages[number]
            session = None
            if peer is not None and all(name in known for name in stage.reads):
                with contextlib.suppress(Exception):  # a type known ahead was wrong: made again from the values
                    session = self.session(number, known, threads, progress)
            while received < len(theirs) and theirs[received] < number:
                for values, handed in zip(live, peer.receive()):
                    values.update(handed)
                received += 1
            if session is None:
                session = self.session(number, {name: _type_of(live[0][name]) for name in stage.reads}, threads,
                                       progress)
            progress(f"running {self.where(number)}")
            keep = self._read_by(later for later in mine if later > number)
            waiting = [later for later in theirs if later > number]
            handover = self._read_by(waiting)
            handed = [self._run(session, stage, values, keep, handover) for values in live]
            if waiting:  # one hand-over per stage that a later stage of the peer's waits for
                peer.send(handed)
            del session, handed
            release_free_memory()
        return self.measured

    def _run(self, session, stage: Stage, values: Sample, keep: set[str], handover: set[str]) -> Sample:
        """Run ``stage`` on one sample's ``values`` and measure what it returns; ``values`` then
        holds what ``keep`` names. Returns the outputs ``handover`` names."""
        results = instrument.run(session, {name: values[name] for name in stage.reads}, stage.outputs)
        for name, array in results.items():
            if name in self.stats:
                self.add(self.stats[name], ValueStats.of_rows(array))
            elif name in self.top and isinstance(array, np.ndarray) and array.dtype == np.float32:
                self.add(self.top[name], ValueStats.of(array, self.thresholds))
        values.update((name, results[name]) for name in stage.passed)
        for name in [name for name in values if name not in keep]:
            del values[name]
        return {name: results[name] for name in stage.passed if name in handover}

    def _read_by(self, numbers: Iterable[int]) -> set[str]:
        return {name for number in numbers for name in self.stages[number].reads}

    def add(self, key: ValueKey, found: ValueStats) -> None:
        self.measured[key] = self.measured[key].merged(found) if key in self.measured else found


def _model_head(model: onnx.ModelProto) -> bytes:
    """The serialized fields of a stage model but its graph: those of ``model``."""
    head = onnx.ModelProto(ir_version=model.ir_version)
    head.opset_import.extend(model.opset_import)
    head.functions.extend(model.functions)
    return head.SerializeToString()


def _stage_model(model: onnx.ModelProto, head: bytes, stage: Stage, types: Mapping[str, onnx.TypeProto],
                 weights: Mapping[str, onnx.TensorProto]) -> bytes:
    """The stage as a serialized model, written field by field: building the model, then
    serializing it, copied every node and weight twice."""
    nodes = model.graph.node
    inputs = [onnx.ValueInfoProto(name=n, type=types[n]) for n in stage.reads]
    if model.ir_version < 4:  # initializers must be listed as inputs too
        inputs += [helper.make_tensor_value_info(n, weights[n].data_type, weights[n].dims) for n in stage.weights]
    graph = [length_delimited(_NAME, f"stage_{stage.start}".encode()),
             *(length_delimited(_NODE, nodes[p].SerializeToString()) for p in stage.nodes),
             *(length_delimited(_INITIALIZER, weights[n].SerializeToString()) for n in stage.weights),
             *(length_delimited(_INPUT, info.SerializeToString()) for info in inputs),
             *(length_delimited(_OUTPUT, onnx.ValueInfoProto(name=n).SerializeToString()) for n in stage.outputs)]
    return head + length_delimited(_GRAPH, b"".join(graph))


_GRAPH = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_NAME, _NODE, _INITIALIZER, _INPUT, _OUTPUT = (onnx.GraphProto.DESCRIPTOR.fields_by_name[name].number
                                              for name in ("name", "node", "initializer", "input", "output"))


def _type_of(value) -> onnx.TypeProto:
    """The type of a run's value: a tensor, or a sequence of tensors (a list)."""
    if isinstance(value, list):
        elem = helper.np_dtype_to_tensor_dtype(value[0].dtype) if value else onnx.TensorProto.FLOAT
        return helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, None))
    return helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype), None)


def _nested_nodes(node: onnx.NodeProto) -> int:
    """Nodes in the node's subgraphs, theirs included."""
    if not node.attribute:
        return 0
    return sum(1 + _nested_nodes(n) for g in subgraphs(node) for n in g.node)
