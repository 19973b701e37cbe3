"""KeepResidualStream: in a training step, the residual stream's sums are float32.

A residual block adds its output to its input, ``x + f(x)``; where the sum is itself the next
block's skip operand (pre-norm transformers, LeViT, MLP-Mixers: the stream is never
renormalised between blocks), every block adds a small update to a large running sum. In float16
each sum keeps 11 bits of the larger operand, so fine-tuning's small changes to ``f`` round away
in the stream, and the trained model ends worse than float32's. Training keeps those sums float32
(Megatron-LM's ``fp32_residual_connection``); the blocks still run low, and the casts are one per
block output and one per read of the stream by a low op (its norm usually reads float32 anyway).
A residual whose sum is renormalised before the next block (post-norm BERT, ResNet's Relu and
next BatchNormalization) is left to the policy.
"""

from __future__ import annotations

from amp_rewrite.ir.graph import ModelIndex, Node, ValueKey
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.coloring import Color, Priority
from amp_rewrite.rewrite.options import ColoringOptions
from amp_rewrite.rewrite.passes.base import Pass, PassResult

MOVES = frozenset({"Reshape", "Transpose", "Identity", "Squeeze", "Unsqueeze", "Flatten"})
"""Ops that move a value's elements without changing them: the stream passes through them."""
MAX_SEARCH = 4096
"""Nodes searched back from a block's output for its skip operand, at most: a block is smaller."""


class KeepResidualStream(Pass[Analysis]):
    """Invariant: with ``fp32_residual_stream``, every top-level candidate Add one of whose operands
    is computed from the other (the skip), where the skip comes, through ops that only move data,
    from another such Add, or the sum is the skip of another such Add, is float32 (policy
    priority: a user's override wins). Without it, nothing changes."""

    def __init__(self, options: ColoringOptions) -> None:
        self.options = options

    def run(self, analysis: Analysis) -> PassResult:
        if not self.options.fp32_residual_stream:
            return PassResult(False)
        index, coloring = analysis.index, analysis.coloring
        before = coloring.changes
        skips: dict[int, Node | None] = {}  # a residual Add's id -> where its skip comes from (through moves)
        for node_id in coloring.decisions:
            node = index.nodes[node_id]
            if node.graph == 0 and node.op_type == "Add" and node.domain == "" and len(node.inputs) == 2:
                skip = _skip(index, node)
                if skip is not None:
                    skips[node_id] = _source(index, skip)
        stream: set[int] = set()
        for node_id, source in skips.items():
            if source is not None and source.id in skips:
                stream.update((node_id, source.id))
        for node_id in sorted(stream):
            if coloring.decisions[node_id].color is not Color.FP32:
                coloring.fix(node_id, Color.FP32, "the residual stream: training keeps its sums float32 (small "
                             "updates to a large sum round away in low precision)", Priority.POLICY)
        return PassResult(coloring.changes != before)


def _skip(index: ModelIndex, node: Node) -> ValueKey | None:
    """The operand of the Add ``node`` that the other one is computed from (its key), or None."""
    for i in (0, 1):
        skip, branch = node.inputs[i], node.inputs[1 - i]
        if skip is None or branch is None or skip == branch:
            continue
        if _descends(index, branch, skip):
            return skip
    return None


def _descends(index: ModelIndex, value: ValueKey, ancestor: ValueKey) -> bool:
    """Whether ``value`` is computed from ``ancestor`` (within MAX_SEARCH nodes back)."""
    start = index.producer_node(index.values[ancestor])
    floor = start.id if start is not None else -1
    seen: set[int] = set()
    todo = [value]
    while todo and len(seen) < MAX_SEARCH:
        key = todo.pop()
        producer = index.producer_node(index.values[key])
        if producer is None or producer.id <= floor or producer.id in seen:
            continue
        seen.add(producer.id)
        for name in producer.inputs:
            if name == ancestor:
                return True
            if name is not None:
                todo.append(name)
    return False


def _source(index: ModelIndex, key: ValueKey) -> Node | None:
    """The node that makes ``key``, looking through ops that only move data."""
    node = index.producer_node(index.values[key])
    while node is not None and node.op_type in MOVES and node.domain == "" and node.inputs and node.inputs[0]:
        node = index.producer_node(index.values[node.inputs[0]])
    return node
