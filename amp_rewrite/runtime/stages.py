"""Measuring a model's values stage by stage, so the cost stays close to one model run.

Two things make "one session with every value as an output" slow on big graphs:
ONNX Runtime's session creation grows faster than linearly with the node count
(its buffer-reuse planner most of all), and a run holds every exposed value at once.
``measure`` therefore

- keeps only the nodes that the watched values depend on;
- cuts them, in the graph's order, into stages of at most ``STAGE_NODES`` nodes
  (nested nodes counted), each run as its own model, with buffer reuse off, and ONNX Runtime's
  memory arena off but where a stage holds subgraphs: a Loop allocates its body's values again
  on every iteration, which the arena recycles (Mask R-CNN's paste-masks Loop), where a
  straight-line stage without buffer reuse allocates each value once and the arena only grows;
- feeds each stage the values earlier stages computed, reduces the watched values it
  returns to ``ValueStats`` at once, and keeps only what later stages read;
- frees a stage's session and values before the next, whose allocations reuse their memory
  (handing it back to the system after each stage, ``malloc_trim``, would make the next stage
  fault the pages in again, and lowers no peak).

Memory holds one stage's values plus the values crossing into later stages.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from amp_rewrite.inputs.samples import Sample
from amp_rewrite.ir.graph import ValueKey, names_read, subgraphs
from amp_rewrite.ir.io import length_delimited
from amp_rewrite.ir.measurements import Thresholds, ValueStats
from amp_rewrite.ir.tensors import read_array, value_bytes
from amp_rewrite.runtime import instrument
from amp_rewrite.runtime.isolate import Progress, caller_waits

STAGE_NODES = 500
"""Nodes per stage: small enough that session creation stays linear and that a stage's
session and values stay small, large enough that the per-session overhead does not show
(larger stages hold more memory at the peak and take no less time; smaller ones save no
more memory; the measurements are in benchmarks/RESULTS.md)."""


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
    """Values it reads that no later stage reads: dropped after it."""
    loops: bool = False
    """Whether a node of the stage holds subgraphs (a Loop's body allocates its values again
    on every iteration)."""


def plan(graph: onnx.GraphProto, watched: set[str], stage_nodes: int | None = None) -> list[Stage]:
    """The stages that compute ``watched`` (top-level value names) of ``graph``."""
    # each node's fields read once (protobuf access costs more than lists), into tuples: a set
    # per node would be a large share of the plan's memory
    nested, reads, outputs = [], [], []
    for node in graph.node:
        inner = _nested_nodes(node)
        nested.append(inner)
        reads.append(tuple(names_read([node])) if inner else _named(node.input))
        outputs.append(_named(node.output))
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
        stages[-1].loops |= size > 1
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


def _needed(watched: set[str], reads: list[tuple[str, ...]], outputs: list[tuple[str, ...]]) -> list[int]:
    """Positions of the nodes that ``watched`` depend on, in order."""
    needed = set(watched)
    kept = []
    for position in range(len(outputs) - 1, -1, -1):
        if not needed.isdisjoint(outputs[position]):
            kept.append(position)
            needed.update(reads[position])
    kept.reverse()
    return kept


def measure(model: onnx.ModelProto, top: Mapping[str, ValueKey], stats: Mapping[str, ValueKey],
            data: Sequence[Sample], thresholds: Thresholds, base_dir: str | os.PathLike | None,
            progress: Progress, threads: int = 0) -> dict[ValueKey, ValueStats]:
    """Statistics of the ``top`` values (output name -> value; those that are not float32
    tensors are passed over) and of the statistics rows that ``expose.lift_nested``
    carried out (``stats``), over every sample of ``data``. ``threads``: ONNX Runtime's
    intra-op threads (0: one per core; 1 when something else runs beside), one per core for
    the stages that start once the caller of a child measuring only waits (``caller_waits``)."""
    runs = _Runs(model, plan(model.graph, set(top) | set(stats)), top, stats, thresholds, base_dir)
    live = [dict(sample) for sample in data]
    for number, stage in enumerate(runs.stages):
        progress(f"creating the session for {runs.where(number)}")
        stage_model = _stage_model(model, runs.head, stage, {n: _type_of(live[0][n]) for n in stage.reads},
                                   runs.weights, runs.handed, base_dir)
        session = instrument.session(stage_model, base_dir, reuse_memory=False, arena=stage.loops,
                                     threads=0 if caller_waits() else threads, initializers=runs.handed_to(stage))
        progress(f"running {runs.where(number)}")
        for values in live:
            runs.run(session, stage, values)
        del session
    return runs.measured


class _Runs:
    """The stages of one measurement, and what they measured so far."""

    def __init__(self, model: onnx.ModelProto, stages: list[Stage], top: Mapping[str, ValueKey],
                 stats: Mapping[str, ValueKey], thresholds: Thresholds, base_dir: str | os.PathLike | None) -> None:
        self.model, self.stages, self.top, self.stats, self.thresholds = model, stages, top, stats, thresholds
        self.base_dir = base_dir
        self.weights = {t.name: t for t in model.graph.initializer}
        self.handed = {t.name for t in model.graph.initializer if t.data_type in HANDED_TYPES
                       and t.HasField("raw_data") and value_bytes(t) >= HANDED_BYTES}
        """Weights that sessions get as arrays (``handed_to``), not in the serialized stage."""
        self.head = _model_head(model)
        self.measured: dict[ValueKey, ValueStats] = {}

    def handed_to(self, stage: Stage) -> dict[str, np.ndarray]:
        """The large weights ``stage`` reads, as arrays over copies of their bytes: for its session
        to copy in, then dropped (one stage's weights held twice at most, not every stage's)."""
        return {name: read_array(self.weights[name], self.base_dir) for name in stage.weights if name in self.handed}

    def where(self, number: int) -> str:
        stage = self.stages[number]
        first = self.model.graph.node[stage.nodes[0]]
        return (f"stage {number + 1} of {len(self.stages)} (nodes {stage.start}-{stage.stop - 1}, from "
                f"{first.op_type} {first.name or first.output[0]!r})")

    def run(self, session, stage: Stage, values: Sample) -> None:
        """Run ``stage`` on one sample's ``values`` and measure what it returns; ``values`` then
        holds what later stages read."""
        results = instrument.run(session, {name: values[name] for name in stage.reads}, stage.outputs)
        for name, array in results.items():
            if name in self.stats:
                self.add(self.stats[name], ValueStats.of_rows(array))
            elif name in self.top and isinstance(array, np.ndarray) and array.dtype == np.float32:
                self.add(self.top[name], ValueStats.of(array, self.thresholds))
        values.update((name, results[name]) for name in stage.passed)
        for name in stage.done:
            del values[name]

    def add(self, key: ValueKey, found: ValueStats) -> None:
        self.measured[key] = self.measured[key].merged(found) if key in self.measured else found


def _model_head(model: onnx.ModelProto) -> bytes:
    """The serialized fields of a stage model but its graph: those of ``model``."""
    head = onnx.ModelProto(ir_version=model.ir_version)
    head.opset_import.extend(model.opset_import)
    head.functions.extend(model.functions)
    return head.SerializeToString()


def _stage_model(model: onnx.ModelProto, head: bytes, stage: Stage, types: Mapping[str, onnx.TypeProto],
                 weights: Mapping[str, onnx.TensorProto], handed: set[str], base_dir) -> bytes:
    """The stage as a serialized model, written field by field: building the model, then
    serializing it, copied every node and weight twice. The ``handed`` weights are placeholders
    (external data that is never read): the session gets their arrays (``Runs.handed_to``).
    Other external weights are written in with their values (``_inline``)."""
    nodes = model.graph.node
    inputs = [onnx.ValueInfoProto(name=n, type=types[n]) for n in stage.reads]
    if model.ir_version < 4:  # initializers must be listed as inputs too
        inputs += [helper.make_tensor_value_info(n, weights[n].data_type, weights[n].dims) for n in stage.weights]
    graph = [length_delimited(_NAME, f"stage_{stage.start}".encode()),
             *(length_delimited(_NODE, nodes[p].SerializeToString()) for p in stage.nodes),
             *(length_delimited(_INITIALIZER, _stage_weight(weights[n], n in handed, base_dir).SerializeToString())
               for n in stage.weights),
             *(length_delimited(_INPUT, info.SerializeToString()) for info in inputs),
             *(length_delimited(_OUTPUT, onnx.ValueInfoProto(name=n).SerializeToString()) for n in stage.outputs)]
    return head + length_delimited(_GRAPH, b"".join(graph))


HANDED_BYTES = 1 << 16
"""Weights of at least this many bytes reach a stage's session as arrays: serializing large
weights into each stage's model and parsing them back would be a large share of the measurement."""


HANDED_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE})
"""Weights that may be handed: float ones (ONNX Runtime's shape inference reads integer shape
operands from the serialized model, and refuses external ones)."""


def _stage_weight(tensor: onnx.TensorProto, handed: bool, base_dir) -> onnx.TensorProto:
    """A weight as a stage's model holds it: a placeholder for a handed one, with its values for
    a small external one (ONNX Runtime opens the file for each external tensor, which for the
    many small weights that ``io.load(borrow=...)`` leaves in the file costs more than their
    bytes), as it is otherwise: a large external one is read by ONNX Runtime into its own buffer
    (handed as an array, it would be held twice while the session is made)."""
    if handed:
        return _placeholder(tensor)
    if tensor.data_location != onnx.TensorProto.EXTERNAL or value_bytes(tensor) >= HANDED_BYTES:
        return tensor
    inline = onnx.TensorProto()
    inline.CopyFrom(tensor)
    inline.ClearField("external_data")
    inline.ClearField("data_location")
    inline.raw_data = read_array(tensor, base_dir).tobytes()
    return inline


def _placeholder(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """``tensor``'s name, type and shape, its data said to be external (ONNX Runtime replaces it
    with the array the session is given before it would read the file)."""
    placeholder = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims,
                                   data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", "handed-to-the-session"), ("offset", "0"), ("length", str(value_bytes(tensor)))):
        placeholder.external_data.add(key=key, value=value)
    return placeholder


_GRAPH = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_NAME, _NODE, _INITIALIZER, _INPUT, _OUTPUT = (onnx.GraphProto.DESCRIPTOR.fields_by_name[name].number
                                              for name in ("name", "node", "initializer", "input", "output"))


def _type_of(value) -> onnx.TypeProto:
    """The type of a run's value: a tensor, or a sequence of tensors (a list)."""
    if isinstance(value, list):
        elem = helper.np_dtype_to_tensor_dtype(value[0].dtype) if value else onnx.TensorProto.FLOAT
        return helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, None))
    return helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype), None)


def _named(names) -> tuple[str, ...]:
    """A node's inputs or outputs but the empty names of omitted ones (copied whole, then
    filtered where one is empty: a comprehension over the protobuf field reads it an item at a time)."""
    named = tuple(names)
    return tuple(filter(None, named)) if "" in named else named


def _nested_nodes(node: onnx.NodeProto) -> int:
    """Nodes in the node's subgraphs, theirs included."""
    if not node.attribute:
        return 0
    return sum(1 + _nested_nodes(n) for g in subgraphs(node) for n in g.node)
