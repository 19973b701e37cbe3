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
- runs the later half of the stages in a second process that creates its first sessions
  while the first half runs (two cores share the session creation).

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
from amp_rewrite.runtime import instrument
from amp_rewrite.runtime.instrument import Thresholds, ValueStats
from amp_rewrite.runtime.isolate import FORKS, Progress, Started, release_free_memory
from amp_rewrite.runtime.samples import Sample

STAGE_NODES = 2500
"""Nodes per stage: small enough that session creation stays linear and that a stage's
session and values stay small, large enough that the per-session overhead does not show.
Measured on the 48.6k- and 19.4k-node benchmark transformers (2 cores): 2,500 against 10,000
nodes took the same time (8.8 s against 8.7-9.6 s; 3.24 s against 3.3-3.6 s) with 30% less
peak memory (724 against 1,023 MiB PSS; 412 against 557)."""


AHEAD = 4
"""Sessions the second process creates ahead, while the first half runs (the rest it creates as
it goes): each holds its stage's weights and graph. On the 48.6k-node benchmark transformer,
4 ahead took the same time as all 10 (7.4-7.9 s against 7.6-7.7 s) with 616 against 724 MiB
peak PSS; 2 ahead was slower (8.2-8.8 s)."""


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
    done: list[str] = field(default_factory=list)
    """Values no stage after this one reads."""
    size: int = 0
    """Nodes, nested ones included."""


def plan(graph: onnx.GraphProto, watched: set[str], stage_nodes: int | None = None) -> list[Stage]:
    """The stages that compute ``watched`` (top-level value names) of ``graph``."""
    nodes = list(graph.node)  # read each node's fields once: protobuf access costs more than lists
    nested = [_nested_nodes(n) for n in nodes]
    reads = [names_read([n]) if nested[p] else {i for i in n.input if i} for p, n in enumerate(nodes)]
    outputs = [[o for o in n.output if o] for n in nodes]
    needed = set(watched)
    kept = []
    for position in range(len(nodes) - 1, -1, -1):
        if not needed.isdisjoint(outputs[position]):
            kept.append(position)
            needed |= reads[position]
    kept.reverse()
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
        stages[-1].size += size
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
        stage.done = sorted(n for n in stage.reads if last_read[n] == s)
    return stages


def measure(model: onnx.ModelProto, top: Mapping[str, ValueKey], stats: Mapping[str, ValueKey],
            data: Sequence[Sample], thresholds: Thresholds, base_dir: str | os.PathLike | None,
            progress: Progress, types: Mapping[str, int] | None = None) -> dict[ValueKey, ValueStats]:
    """Statistics of the ``top`` values (output name -> value) and of the statistics rows that
    ``instrument.expose`` carried out (``stats``), over every sample of ``data``.

    With ``types`` (the element types of top-level tensor values) and more than one stage,
    the later half of the stages runs in a second child process, which creates its first
    ``AHEAD`` sessions while this one runs the first half: session creation, the larger part
    of the cost, on two cores. This process then only waits, its freed memory handed back to
    the system."""
    runs = _Runs(model, plan(model.graph, set(top) | set(stats)), top, stats, thresholds, base_dir)
    live = [dict(sample) for sample in data]
    split = _halfway(runs.stages) if types is not None and FORKS else len(runs.stages)
    later = None
    if split < len(runs.stages):
        wanted = runs.reads_from(split)
        inputs = {name for stage in runs.stages[split:] for name in stage.reads if name in types}
        known = {name: helper.make_tensor_type_proto(types[name], None) for name in inputs}
        known.update((name, _type_of(value)) for name, value in live[0].items())
        later = Started(lambda report, receive: runs.second_half(split, known, receive, report),
                        "onnxruntime (range check, second half)")
    runs.run(range(split), live, {}, progress)
    if later is not None:
        progress(f"running stages {split + 1}-{len(runs.stages)} of {len(runs.stages)}")
        later.send([{name: value for name, value in values.items() if name in wanted} for values in live])
        del live
        release_free_memory()
        for key, found in later.result().items():
            runs.add(key, found)
    return runs.measured


class _Runs:
    """The stages of one measurement, and what they measured so far."""

    def __init__(self, model: onnx.ModelProto, stages: list[Stage], top: Mapping[str, ValueKey],
                 stats: Mapping[str, ValueKey], thresholds: Thresholds, base_dir) -> None:
        self.model, self.stages, self.top, self.stats = model, stages, top, stats
        self.thresholds, self.base_dir = thresholds, base_dir
        self.weights = {t.name: t for t in model.graph.initializer}
        self.measured: dict[ValueKey, ValueStats] = {}

    def where(self, number: int) -> str:
        stage = self.stages[number]
        first = self.model.graph.node[stage.nodes[0]]
        return (f"stage {number + 1} of {len(self.stages)} (nodes {stage.start}-{stage.stop - 1}, from "
                f"{first.op_type} {first.name or first.output[0]!r})")

    def session(self, number: int, types: Mapping[str, onnx.TypeProto]):
        model = _stage_model(self.model, self.stages[number], types, self.weights)
        return instrument.session(model, self.base_dir, reuse_memory=False)

    def run(self, numbers: Iterable[int], live: list[Sample], sessions: dict, progress: Progress) -> None:
        """Run the stages ``numbers`` on every sample's ``live`` values (sessions made ahead or now)."""
        for number in numbers:
            stage = self.stages[number]
            session = sessions.pop(number, None)
            if session is None:
                progress(f"creating the session for {self.where(number)}")
                session = self.session(number, {name: _type_of(live[0][name]) for name in stage.reads})
            progress(f"running {self.where(number)}")
            for values in live:
                results = instrument.run(session, {name: values[name] for name in stage.reads}, stage.outputs)
                for name, array in results.items():
                    if name in self.top:
                        self.add(self.top[name], ValueStats.of(array, self.thresholds))
                    elif name in self.stats:
                        self.add(self.stats[name], ValueStats.of_rows(array))
                for name in stage.done:
                    values.pop(name, None)
                values.update((name, results[name]) for name in stage.passed)
            del session
            release_free_memory()

    def second_half(self, split: int, types: Mapping[str, onnx.TypeProto], receive, progress: Progress) -> dict:
        """In the second child: create the sessions of the first ``AHEAD`` stages from ``split``
        on (those whose input types are known), then run the stages on the values the first half
        hands over."""
        sessions = {}
        for number in range(split, min(len(self.stages), split + AHEAD)):
            if all(name in types for name in self.stages[number].reads):
                progress(f"creating the session for {self.where(number)}")
                with contextlib.suppress(Exception):  # a type known ahead was wrong: made again from the values
                    sessions[number] = self.session(number, types)
        self.run(range(split, len(self.stages)), receive(), sessions, progress)
        return self.measured

    def reads_from(self, split: int) -> set[str]:
        """Values that stages ``split`` on read and do not compute themselves."""
        wanted: set[str] = set()
        made: set[str] = set()
        for stage in self.stages[split:]:
            wanted |= set(stage.reads) - made
            made |= set(stage.outputs)
        return wanted

    def add(self, key: ValueKey, found: ValueStats) -> None:
        self.measured[key] = self.measured[key].merged(found) if key in self.measured else found


def _halfway(stages: list[Stage]) -> int:
    """The first stage of the later half, by node count (len(stages) when there is one stage)."""
    total = sum(stage.size for stage in stages)
    count = 0
    for number, stage in enumerate(stages):
        if count and count + stage.size / 2 >= total / 2:
            return number
        count += stage.size
    return len(stages)


def _stage_model(model: onnx.ModelProto, stage: Stage, types: Mapping[str, onnx.TypeProto],
                 weights: Mapping[str, onnx.TensorProto]) -> onnx.ModelProto:
    graph = onnx.GraphProto(name=f"stage_{stage.start}")
    graph.node.extend(model.graph.node[p] for p in stage.nodes)
    graph.initializer.extend(weights[n] for n in stage.weights)
    graph.input.extend(onnx.ValueInfoProto(name=n, type=types[n]) for n in stage.reads)
    if model.ir_version < 4:  # initializers must be listed as inputs too
        graph.input.extend(helper.make_tensor_value_info(n, weights[n].data_type, weights[n].dims)
                           for n in stage.weights)
    graph.output.extend(onnx.ValueInfoProto(name=n) for n in stage.outputs)
    stage_model = onnx.ModelProto(ir_version=model.ir_version, graph=graph)
    stage_model.opset_import.extend(model.opset_import)
    stage_model.functions.extend(model.functions)
    return stage_model


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
