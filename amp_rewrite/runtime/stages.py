"""Measuring a model's values stage by stage, so the cost stays close to one model run.

Two things make "one session with every value as an output" slow on big graphs:
ONNX Runtime's session creation grows faster than linearly with the node count
(its buffer-reuse planner most of all: a 20k-node model took minutes), and a run
holds every exposed value at once. ``measure`` therefore

- keeps only the nodes that the watched values depend on;
- cuts them, in the graph's order, into stages of at most ``STAGE_NODES`` nodes
  (nested nodes counted), each run as its own model, with buffer reuse off;
- feeds each stage the values earlier stages computed, reduces the watched values it
  returns to ``ValueStats`` at once, and keeps only what later stages read.

Memory holds one stage's values plus the values crossing into later stages.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from amp_rewrite.ir.graph import ValueKey, names_read, subgraphs
from amp_rewrite.runtime import instrument
from amp_rewrite.runtime.instrument import ValueStats
from amp_rewrite.runtime.isolate import Progress
from amp_rewrite.runtime.samples import Sample

STAGE_NODES = 4000
"""Nodes per stage: small enough that session creation stays linear, large enough that
the per-session overhead does not show."""


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
    done: list[str] = field(default_factory=list)
    """Values no stage after this one reads."""


def plan(graph: onnx.GraphProto, watched: set[str], stage_nodes: int = STAGE_NODES) -> list[Stage]:
    """The stages that compute ``watched`` (top-level value names) of ``graph``."""
    nodes = graph.node
    reads = [names_read([n]) if _has_subgraph(n) else {i for i in n.input if i} for n in nodes]
    needed = set(watched)
    kept = []
    for position in range(len(nodes) - 1, -1, -1):
        if any(o in needed for o in nodes[position].output):
            kept.append(position)
            needed |= reads[position]
    kept.reverse()
    stages: list[Stage] = []
    count = 0
    for position in kept:
        size = _size(nodes[position])
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
        made = {o for p in stage.nodes for o in nodes[p].output if o}
        read = set().union(*(reads[p] for p in stage.nodes)) - made
        stage.weights = sorted(read & weights)
        stage.reads = sorted(read - weights)
        stage.outputs = sorted(o for o in made if o in watched or last_read.get(o, -1) > s)
        stage.done = sorted(n for n in stage.reads if last_read[n] == s)
    return stages


def measure(model: onnx.ModelProto, top: Mapping[str, ValueKey], stats: Mapping[str, ValueKey],
            data: Sequence[Sample], threshold: float, base_dir: str | os.PathLike | None,
            progress: Progress) -> dict[ValueKey, ValueStats]:
    """Statistics of the ``top`` values (output name -> value) and of the statistics rows that
    ``instrument.expose`` carried out (``stats``), over every sample of ``data``."""
    weights = {t.name: t for t in model.graph.initializer}
    live = [dict(sample) for sample in data]
    measured: dict[ValueKey, ValueStats] = {}
    stages = plan(model.graph, set(top) | set(stats))
    for number, stage in enumerate(stages, 1):
        first = model.graph.node[stage.nodes[0]]
        where = (f"stage {number} of {len(stages)} (nodes {stage.start}-{stage.stop - 1}, from "
                 f"{first.op_type} {first.name or first.output[0]!r})")
        progress(f"creating the session for {where}")
        session = instrument.session(_stage_model(model, stage, live[0], weights), base_dir, reuse_memory=False)
        progress(f"running {where}")
        for values in live:
            results = instrument.run(session, {n: values[n] for n in stage.reads}, stage.outputs)
            for name, array in results.items():
                found = (ValueStats.of(array, threshold) if name in top
                         else ValueStats.of_rows(array) if name in stats else None)
                if found is not None:
                    key = top.get(name) or stats[name]
                    measured[key] = measured[key].merged(found) if key in measured else found
            for name in stage.done:
                values.pop(name, None)
            values.update(results)
        del session
    return measured


def _stage_model(model: onnx.ModelProto, stage: Stage, values: Sample,
                 weights: Mapping[str, onnx.TensorProto]) -> onnx.ModelProto:
    graph = onnx.GraphProto(name=f"stage_{stage.start}")
    graph.node.extend(model.graph.node[p] for p in stage.nodes)
    graph.initializer.extend(weights[n] for n in stage.weights)
    graph.input.extend(_value_info(n, values[n]) for n in stage.reads)
    if model.ir_version < 4:  # initializers must be listed as inputs too
        graph.input.extend(helper.make_tensor_value_info(n, weights[n].data_type, weights[n].dims)
                           for n in stage.weights)
    graph.output.extend(onnx.ValueInfoProto(name=n) for n in stage.outputs)
    stage_model = onnx.ModelProto(ir_version=model.ir_version, graph=graph)
    stage_model.opset_import.extend(model.opset_import)
    stage_model.functions.extend(model.functions)
    return stage_model


def _value_info(name: str, value) -> onnx.ValueInfoProto:
    if isinstance(value, list):  # a sequence
        elem = helper.np_dtype_to_tensor_dtype(value[0].dtype) if value else onnx.TensorProto.FLOAT
        return helper.make_tensor_sequence_value_info(name, elem, None)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype), None)


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _size(node: onnx.NodeProto) -> int:
    return 1 + sum(_size(n) for g in subgraphs(node) for n in g.node)
