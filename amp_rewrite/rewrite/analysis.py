"""The state that the coloring passes share, and the questions they ask of it."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

from onnx import TensorProto

from amp_rewrite.ir.graph import GRAPH_INPUT, INITIALIZER, ModelIndex, Value
from amp_rewrite.ir.precision import Precision
from amp_rewrite.ir.sizes import InferredTypes
from amp_rewrite.ir.tensors import constant_tensor
from amp_rewrite.policy.classes import Policy
from amp_rewrite.policy.oplists import DENY, INFER, MEASURED_CLASSES, OP_CLASSES, ZERO_SINGULAR_INPUTS, op_key
from amp_rewrite.rewrite.coloring import Color, Coloring, Priority
from amp_rewrite.rewrite.measuring import Pending, Ranges
from amp_rewrite.rewrite.options import ConvertOptions

FLOAT = TensorProto.FLOAT
OFFLINE = "offline"
"""Producer kind of initializers and Constant outputs: converted once, ahead of time."""


@dataclass(frozen=True, slots=True)
class Slots:
    """The inputs and outputs of a node bound to a float32 type parameter that may change."""

    inputs: frozenset[int]
    outputs: frozenset[int]
    params: frozenset[str]


@dataclass
class Analysis:
    """The context of the analysis passes (``passes.base.Pass``): the model's index, the options,
    and what the passes found so far (the candidates' slots, the coloring, notes...)."""

    index: ModelIndex
    options: ConvertOptions
    base_dir: str | os.PathLike | None = None
    slots: dict[int, Slots] = field(default_factory=dict)
    coloring: Coloring = field(default_factory=Coloring)
    unknown_ops: Counter = field(default_factory=Counter)
    kept_constants: dict[str, str] = field(default_factory=dict)
    unfit_readers: set[int] = field(default_factory=set)
    """Nodes kept float32 because a constant they read does not fit the target type."""
    notes: list[str] = field(default_factory=list)
    range_check: str = "not run"
    seconds: dict[str, float] = field(default_factory=dict)
    """Seconds by pipeline step (the index, each pass), as ``analyze`` and ``rewrite`` timed them."""
    measured_fp32: dict[str, str] = field(default_factory=dict)
    ranges: Ranges = field(default_factory=Ranges)
    """What the range check judges (``measuring.Ranges``: data, or calls returning data)."""
    pending: Pending | None = None
    """What MeasureRanges left for its caller to judge (``settle``) once the measurement is in."""
    inferred: InferredTypes | None = None
    """Tensor types shape inference found ahead (``sizes.inferred_types``) for ChooseMinCasts's
    costs, then declared in the model by ``DeclareInferredShapes``, which drops them; None:
    inferred when a cost first needs a shape the model lacks."""

    def __post_init__(self) -> None:
        coloring = self.options.coloring
        self.policy = Policy(coloring.provider, coloring.policy, measured=self.ranges.ahead)

    @property
    def precision(self) -> Precision:
        return self.options.coloring.precision

    @property
    def io_color(self) -> Color:
        return Color.FP32 if self.options.coloring.keep_io_types else Color.LOW

    def is_float(self, value: Value) -> bool:
        return value.elem_type == FLOAT

    def is_offline(self, value: Value) -> bool:
        """Whether ``value`` is an initializer or a Constant's output."""
        if value.source == INITIALIZER:
            return True
        if value.producer is None:
            return False
        node = self.index.nodes[value.producer[0]]
        return node.op_type == "Constant" and node.domain == ""

    def constant_of(self, value: Value) -> TensorProto | None:
        """The tensor of an offline value (``is_offline``): its initializer or its Constant's."""
        if value.source == INITIALIZER:
            return self.index.initializers[value.key]
        producer = self.index.producer_node(value)
        assert producer is not None, "an offline value is an initializer or a Constant's output"
        return constant_tensor(producer.proto)

    def measured_infer(self, node_id: int) -> bool:
        """Whether only the range check's measurement makes the node infer (``MEASURED_CLASSES``):
        it may run low only where its values were measured."""
        decision = self.coloring.decisions.get(node_id)
        if decision is None or decision.op_class != INFER:
            return False
        node = self.index.nodes[node_id]
        return op_key(node.domain, node.op_type) in MEASURED_CLASSES

    def deny(self, node_id: int, why: str, like: str | None = None) -> None:
        """The node deny and float32 (PropagateDeny then follows it), for the policy's reason for
        its own op or for the default-domain op ``like``: a ``measured_infer`` node deny again, as
        without a measurement; a GlobalAveragePool that is a written-out norm's ReduceMean."""
        node, decision = self.index.nodes[node_id], self.coloring.decisions[node_id]
        decision.op_class = DENY
        reason = OP_CLASSES[DENY][("", like) if like else op_key(node.domain, node.op_type)]
        self.coloring.fix(node_id, Color.FP32, f"deny: {reason} ({why})", Priority.POLICY)

    def producer_color(self, value: Value) -> Color | str:
        """The precision a float32 value is produced in: a color, or OFFLINE for constants."""
        if self.is_offline(value):
            return OFFLINE
        if value.source == GRAPH_INPUT:
            return self.io_color if value.key[0] == 0 else Color.FP32
        assert value.producer is not None, "a float value is an input, a weight or a node's output"
        node_id, index = value.producer
        slots = self.slots.get(node_id)
        if slots is not None and index in slots.outputs:
            decision = self.coloring.decisions.get(node_id)
            return (decision.color if decision else None) or Color.FP32
        return Color.FP32

    def use_color(self, node_id: int, index: int) -> Color:
        """The precision a node reads its input ``index`` in."""
        slots = self.slots.get(node_id)
        if slots is not None and index in slots.inputs:
            decision = self.coloring.decisions.get(node_id)
            return (decision.color if decision else None) or Color.FP32
        return Color.FP32

    def reads_as_made(self, node_id: int, index: int) -> bool:
        """Whether the node reads input ``index`` in whatever precision it is made: the input
        of one of the model's own Casts to float32, which converts on its own (to float32, or
        to the low type where it runs low) as a cast before it would, with the same rounding."""
        return not index and self.index.nodes[node_id].cast_to == FLOAT

    def output_color(self, graph_id: int) -> Color:
        return self.io_color if graph_id == 0 else Color.FP32

    def zero_singular(self, node_id: int, index: int) -> bool:
        """Whether a zero at input ``index`` of the node turns into inf or NaN (``ZERO_SINGULAR_INPUTS``)."""
        node = self.index.nodes[node_id]
        return (op_key(node.domain, node.op_type), index) in ZERO_SINGULAR_INPUTS

    def slot_readers(self, value: Value) -> list[tuple[int, int]]:
        """The (node, input index) uses of ``value`` at convertible slots of candidates."""
        slots = self.slots
        return [(n, i) for n, i in value.uses if (s := slots.get(n)) is not None and i in s.inputs]

    def slot_values(self, node_id: int):
        """(is_input, index, value) for each convertible slot of a candidate node."""
        index = self.index
        node, slots = index.nodes[node_id], self.slots[node_id]
        for i in slots.inputs:
            yield True, i, index.value(node.inputs[i])
        for i in slots.outputs:
            yield False, i, index.value(node.outputs[i])
