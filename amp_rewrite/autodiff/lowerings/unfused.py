"""ONNX Runtime's fused transformer ops as the standard ops they fuse, so that a gradient passes them.

ONNX Runtime's transformer optimizer (``onnxruntime.transformers.optimizer``) fuses BERT-like
graphs into ``com.microsoft`` contrib ops (EmbedLayerNormalization, Attention,
SkipLayerNormalization, BiasGelu, FastGelu...), and its RMS-norm fusions write
SimplifiedLayerNormalization, a default-domain op only ONNX Runtime defines; none has a gradient
rule. ``unfused`` rewrites each top-level node of the ops in ``UNFUSERS`` (in place) into
default-domain ops computing what ONNX Runtime's CPU kernel computes:

- layer norms: LayerNormalization where the default opset is 17 or later, else the mean and
  biased variance over the last axis; RMS norms: ``x / sqrt(mean(x^2) + eps) * gamma``;
- EmbedLayerNormalization: word, position (``0..S-1``, or ``position_ids``) and segment rows
  gathered and summed, then the layer norm; its ``mask_index`` output is each row's count of
  mask values equal to 1 (zeros without a mask), as the kernel counts them;
- Attention: the input times the packed qkv weight plus its bias, split into Q, K, V, each
  reshaped to (batch, heads, seq, head size); ``scale * Q K^T`` (scale ``1/sqrt(head size)`` by
  default) plus the mask's additive form (``mask_filter_value``, -10000, where a key is masked)
  plus ``attention_bias``; Softmax over the keys; times V; back to (batch, seq, hidden). The mask
  forms are ONNX Runtime's: 1-D end positions (B) or end and start positions (2B), a raw 0/1
  mask (B, T) or (B, S, T); the additive mask is made once per mask and shared;
- Gelu and BiasGelu with Erf; FastGelu and GemmFastGelu with the tanh approximation; QuickGelu
  as ``x * sigmoid(alpha x)``; BiasAdd as two Adds.

Invariant: after ``unfused``, no top-level node of an op in ``UNFUSERS`` remains; every output
that a node or the graph reads keeps its name and its value (within float rounding); every
initializer keeps its name and tensor, so weights trained on the unfused graph go back into the
fused model by name; new nodes and values are named after the fused node (``<node>/...``).
Secondary outputs nothing reads are dropped (with their value_info). A form it cannot rewrite
(Attention with past state, a causal mask, rotary embeddings, a 4-D mask; a read output it
cannot compute, such as a layer norm's saved mean) raises a UserError naming the node, and the
model is then left as it was. Ops it does not know stay as they are: the gradient refuses them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import GraphBuilder, Names
from amp_rewrite.ir.graph import ModelIndex
from amp_rewrite.ir.opsets import default_opset
from amp_rewrite.ir.sizes import ValueSizes
from amp_rewrite.ir.types import typed_index, value_types

MS = "com.microsoft"
MIN_OPSET = 11
"""The default-domain opset the rewrites need at least (Range; Slice's inputs; Greater on integers)."""
ADDED_OPSET = 17
"""The default-domain opset imported into a model that imports none (LayerNormalization is in it)."""
MASK_FILTER = -10000.0
"""Attention's default ``mask_filter_value``: what a masked key's score gets added."""
LAYER_NORM_EPSILON = 1e-12
"""The default epsilon of the com.microsoft layer norms (SimplifiedLayerNormalization's is 1e-5)."""
FAST_GELU = (math.sqrt(2 / math.pi), 0.044715 * math.sqrt(2 / math.pi))
"""FastGelu's tanh argument ``x * (A + B x^2)``: (A, B)."""
NOT_COMPUTED = {(MS, "SkipLayerNormalization"): {1: "mean", 2: "inv_std_var"},
                (MS, "SkipSimplifiedLayerNormalization"): {1: "mean", 2: "inv_std_var"},
                ("", "SimplifiedLayerNormalization"): {1: "inv_std_var"}}
"""Outputs a rewrite does not compute (training-only statistics, whose layout the kernels own): a
node whose such output is read is refused."""


@dataclass
class _Fused:
    """One fused node being rewritten: its builder, and what the model says of its values."""

    b: GraphBuilder
    node: onnx.NodeProto
    label: str
    read: frozenset[int]
    """The indices of the outputs some node or the graph reads."""
    index: ModelIndex
    sizes: ValueSizes
    masks: dict[tuple, str]
    """Additive attention masks made so far, by (mask, filter value, element type): shared."""

    def input(self, i: int) -> str | None:
        return self.node.input[i] if i < len(self.node.input) and self.node.input[i] else None

    def output(self, i: int) -> str:
        return self.node.output[i]

    def wants(self, i: int) -> bool:
        return i in self.read

    def attr(self, name: str, default: Any = None) -> Any:
        return next((helper.get_attribute_value(a) for a in self.node.attribute if a.name == name), default)

    def shape(self, i: int) -> tuple | None:
        """Input ``i``'s shape (ints, dimension names or None), or None when unknown."""
        value = self.index.values.get((0, self.node.input[i]))
        return self.sizes.shape(value) if value is not None else None

    def producer(self, i: int) -> tuple[str, int] | None:
        """(op type, output index) of the com.microsoft node that makes input ``i``, if one does."""
        value = self.index.values.get((0, self.node.input[i]))
        if value is None or value.producer is None:
            return None
        node = self.index.nodes[value.producer[0]]
        return (node.op_type, value.producer[1]) if node.domain == MS else None

    def refuse(self, reason: str) -> NoReturn:
        raise UserError(f"{self.node.op_type} node {self.label!r}: {reason}, which unfused cannot rewrite into "
                        f"standard ops for differentiation")


def has_fused_ops(model: onnx.ModelProto) -> bool:
    """Whether ``model`` holds a top-level node of an op ``unfused`` rewrites."""
    return any((_domain(n), n.op_type) in UNFUSERS for n in model.graph.node)


def unfused(model: onnx.ModelProto) -> list[str]:
    """Rewrite the top-level fused ONNX Runtime ops of ``model`` into standard ops (in place, see the
    module's docstring); one-line notes of what changed, or [] when nothing did."""
    graph = model.graph
    if not has_fused_ops(model):
        return []
    opset = default_opset(model)
    if opset is not None and opset < MIN_OPSET:
        raise UserError(f"the model imports default-domain opset {opset}; unfusing its ONNX Runtime ops needs "
                        f"{MIN_OPSET} or later (upgrade it, e.g. with onnx.version_converter)")
    index = typed_index(model)
    sizes, names, types = ValueSizes(index), Names.of_model(model), value_types(index)
    masks: dict[tuple, str] = {}
    nodes: list[onnx.NodeProto] = []
    counts: Counter[str] = Counter()
    dropped: set[str] = set()
    for node in index.nodes:
        if node.graph != 0:
            continue
        rewrite = UNFUSERS.get((node.domain, node.op_type))
        if rewrite is None:
            nodes.append(node.proto)
            continue
        read = frozenset(i for i, key in enumerate(node.outputs)
                         if key is not None and (index.values[key].uses or index.values[key].output_of))
        label = node.proto.name or node.proto.output[0]
        fused = _Fused(GraphBuilder(names, opset or ADDED_OPSET, types, prefix=f"{label}/"), node.proto, label, read,
                       index, sizes, masks)
        for i, what in NOT_COMPUTED.get((node.domain, node.op_type), {}).items():
            if fused.wants(i):
                fused.refuse(f"its output {what} is read")
        rewrite(fused)
        made = {out for n in fused.b.nodes for out in n.output}
        dropped.update(out for out in node.proto.output if out and out not in made)
        nodes.extend(fused.b.nodes)
        counts[node.op_type] += 1
    del graph.node[:]
    graph.node.extend(nodes)
    kept_infos = [vi for vi in graph.value_info if vi.name not in dropped]
    del graph.value_info[:]
    graph.value_info.extend(kept_infos)
    total = sum(counts.values())
    notes = [f"unfused {total} ONNX Runtime fused op{'s' if total != 1 else ''} "
             f"({', '.join(f'{op} x{n}' for op, n in sorted(counts.items()))}) into standard ops for differentiation"]
    if opset is None:
        model.opset_import.append(helper.make_opsetid("", ADDED_OPSET))
        model.ir_version = max(model.ir_version, helper.find_min_ir_version_for([model.opset_import[-1]]))
        notes.append(f"imported default-domain opset {ADDED_OPSET} for the standard ops")
    return notes


def _domain(node: onnx.NodeProto) -> str:
    return "" if node.domain == "ai.onnx" else node.domain


# -- shared pieces ----------------------------------------------------------------------------------
def _layer_norm(b: GraphBuilder, x: str, gamma: str, beta: str | None, epsilon: float, output: str) -> None:
    """``output`` = the layer norm of ``x`` over its last axis, scaled by ``gamma``, shifted by ``beta``."""
    if b.opset >= 17:
        b.op("LayerNormalization", x, gamma, *([beta] if beta else []), axis=-1, epsilon=epsilon, outputs=[output])
        return
    centred = b.op("Sub", x, b.axes_op("ReduceMean", x, [-1], keepdims=1))
    variance = b.axes_op("ReduceMean", b.op("Mul", centred, centred), [-1], keepdims=1)
    normal = b.op("Div", centred, b.op("Sqrt", b.op("Add", variance, b.const(epsilon, like=x))))
    if beta:
        b.op("Add", b.op("Mul", normal, gamma), beta, outputs=[output])
    else:
        b.op("Mul", normal, gamma, outputs=[output])


def _rms_norm(b: GraphBuilder, x: str, gamma: str, epsilon: float, output: str, axes: list[int]) -> None:
    """``output`` = ``x / sqrt(mean(x^2) + epsilon) * gamma``, the mean over ``axes``."""
    mean_square = b.axes_op("ReduceMean", b.op("Mul", x, x), axes, keepdims=1)
    normal = b.op("Div", x, b.op("Sqrt", b.op("Add", mean_square, b.const(epsilon, like=x))))
    b.op("Mul", normal, gamma, outputs=[output])


def _gelu(b: GraphBuilder, x: str, output: str) -> None:
    """``output`` = ``0.5 x (1 + erf(x / sqrt(2)))``."""
    erf = b.op("Erf", b.op("Mul", x, b.const(1 / math.sqrt(2), like=x)))
    b.op("Mul", b.op("Mul", x, b.const(0.5, like=x)), b.op("Add", erf, b.const(1.0, like=x)), outputs=[output])


def _fast_gelu(b: GraphBuilder, x: str, output: str) -> None:
    """``output`` = ``0.5 x (1 + tanh(x (A + B x^2)))`` (``FAST_GELU``)."""
    a, c = FAST_GELU
    inner = b.op("Mul", x, b.op("Add", b.op("Mul", b.op("Mul", x, x), b.const(c, like=x)), b.const(a, like=x)))
    b.op("Mul", b.op("Mul", x, b.const(0.5, like=x)), b.op("Add", b.op("Tanh", inner), b.const(1.0, like=x)),
         outputs=[output])


def _plus(b: GraphBuilder, x: str, *terms: str | None) -> str:
    """``x`` plus each term given (added in order, as the kernels add them)."""
    for term in terms:
        if term:
            x = b.op("Add", x, term)
    return x


def _copy(b: GraphBuilder, x: str, output: str) -> None:
    b.op("Identity", x, outputs=[output])


def _dims(b: GraphBuilder, x: str, start: int, end: int) -> str:
    """``x``'s extents ``start`` to ``end`` (1-D int64)."""
    return b.op("Slice", b.op("Shape", x), b.ints([start]), b.ints([end]))


# -- the rewrites -----------------------------------------------------------------------------------
def _embed_layer_norm(f: _Fused) -> None:
    """Word + position + segment embeddings, layer-normalized; the mask's counts of ones."""
    b = f.b
    ids, segments, words, positions, segment_table, gamma, beta, mask, position_ids = map(f.input, range(9))
    assert ids and words and positions and gamma and beta
    if position_ids:
        position_rows = b.op("Gather", positions, position_ids)
    else:  # rows 0..S-1 of the table
        position_rows = b.op("Slice", positions, b.ints([0]), _dims(b, ids, 1, 2))
    segment_rows = b.op("Gather", segment_table, segments) if segments and segment_table else None
    total = _plus(b, b.op("Gather", words, ids), position_rows, segment_rows)
    _layer_norm(b, total, gamma, beta, f.attr("epsilon", LAYER_NORM_EPSILON), f.output(0))
    if f.wants(1):
        if mask:
            ones = b.op("Cast", b.op("Equal", mask, b.const(1, like=mask)), to=TensorProto.INT32)
            _copy(b, b.reduce_sum(ones, [1], keepdims=0), f.output(1))
        else:
            b.op("ConstantOfShape", _dims(b, ids, 0, 1), outputs=[f.output(1)],
                 value=numpy_helper.from_array(np.zeros(1, np.int32)))
    if f.wants(2):
        _copy(b, total, f.output(2))


def _attention(f: _Fused) -> None:
    """Self-attention with a packed qkv weight (see the module's docstring)."""
    if f.attr("unidirectional", 0):
        f.refuse("it has a causal (unidirectional) mask")
    if f.attr("do_rotary", 0):
        f.refuse("it applies rotary embeddings (do_rotary)")
    if f.input(4) or f.input(6):
        f.refuse("it reads past state (past / past_sequence_length)")
    b, heads = f.b, int(f.attr("num_heads"))
    x, weights = f.input(0), f.input(1)
    assert x and weights
    sizes = [int(s) for s in f.attr("qkv_hidden_sizes", [])]
    if not sizes:
        shape = f.shape(1)
        width = shape[-1] if shape else None
        if not isinstance(width, int) or width % 3:
            f.refuse("the width of its weights is unknown or not three equal parts (and it has no qkv_hidden_sizes)")
        sizes = [width // 3] * 3
    if any(size % heads for size in sizes) or sizes[0] != sizes[1]:
        f.refuse(f"its qkv hidden sizes {sizes} do not split into {heads} heads with Q and K alike")
    qkv = _plus(b, b.op("MatMul", x, weights), f.input(2))
    split = b.ops("Split", qkv, b.ints(sizes), outputs=3, axis=-1) if b.opset >= 13 else \
        b.ops("Split", qkv, outputs=3, axis=-1, split=sizes)
    q, k, v = (b.op("Transpose", b.op("Reshape", part, b.ints([0, 0, heads, -1])), perm=[0, 2, 1, 3])
               for part in split)
    scores = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2]))
    scale = f.attr("scale", 0.0) or 1.0 / math.sqrt(float(sizes[0] // heads))
    scores = b.op("Mul", scores, b.const(np.float32(scale), like=scores))
    mask = f.input(3)
    scores = _plus(b, scores, _additive_mask(f, mask, x) if mask else None, f.input(5))
    context = b.op("MatMul", b.op("Softmax", scores, axis=-1), v)
    b.op("Reshape", b.op("Transpose", context, perm=[0, 2, 1, 3]), b.ints([0, 0, -1]), outputs=[f.output(0)])
    if f.wants(1):  # present: the keys and values, stacked (no past to prepend)
        b.op("Concat", b.axes_op("Unsqueeze", k, [0]), b.axes_op("Unsqueeze", v, [0]), axis=0,
             outputs=[f.output(1)])


def _additive_mask(f: _Fused, mask: str, x: str) -> str:
    """The mask as what the scores get added, (B, 1, 1, T) or (B, 1, S, T): 0 where a key is
    attended, ``mask_filter_value`` where it is masked; made once per mask."""
    b = f.b
    filter_value = float(f.attr("mask_filter_value", MASK_FILTER))
    key = (mask, filter_value, b.types.get(x))
    if key in f.masks:
        return f.masks[key]
    shape = f.shape(3)
    made_by = f.producer(3)
    rank = len(shape) if shape is not None else 1 if made_by == ("EmbedLayerNormalization", 1) else None
    if rank == 1:
        keep = _kept_positions(b, mask, x, lengths_only=made_by == ("EmbedLayerNormalization", 1))
    elif rank in (2, 3):
        keep = b.op("Greater", mask, b.const(0, like=mask))
    else:
        f.refuse(f"its mask_index has {'an unknown rank' if rank is None else f'rank {rank}'} (1, 2 or 3 are "
                 f"rewritten)")
    additive = b.op("Where", keep, b.const(0.0, like=x), b.const(filter_value, like=x))
    f.masks[key] = b.axes_op("Unsqueeze", additive, [1, 2] if rank != 3 else [1])
    return f.masks[key]


def _kept_positions(b: GraphBuilder, mask: str, x: str, lengths_only: bool) -> str:
    """(B, T) booleans from a 1-D mask_index: key ``j`` of row ``b`` is kept where
    ``j < end[b]`` and, when the mask holds 2B values, ``j >= start[b]`` (``mask[B + b]``)."""
    positions = b.op("Range", b.const(np.int64(0)), b.op("Gather", b.op("Shape", x), b.const(np.int64(1)), axis=0),
                     b.const(np.int64(1)))
    positions = b.axes_op("Unsqueeze", positions, [0])
    index = b.op("Cast", mask, to=TensorProto.INT64)
    batch = _dims(b, x, 0, 1)
    ends = b.axes_op("Unsqueeze", b.op("Slice", index, b.ints([0]), batch), [1])
    keep = b.op("Less", positions, ends)
    if lengths_only:
        return keep
    padded = b.op("Concat", index, b.zeros_like(index), axis=0)  # B values: its starts are zeros
    starts = b.axes_op("Unsqueeze", b.op("Slice", padded, batch, b.op("Add", batch, batch)), [1])
    return b.op("And", keep, b.op("Not", b.op("Less", positions, starts)))


def _skip_layer_norm(f: _Fused) -> None:
    """(input + skip + bias), layer-normalized; that sum is output 3."""
    x, skip, gamma, beta, bias = map(f.input, range(5))
    assert x and skip and gamma
    total = _plus(f.b, f.b.op("Add", x, skip), bias)
    _layer_norm(f.b, total, gamma, beta, f.attr("epsilon", LAYER_NORM_EPSILON), f.output(0))
    if f.wants(3):
        _copy(f.b, total, f.output(3))


def _skip_simplified_layer_norm(f: _Fused) -> None:
    """(input + skip + bias), RMS-normalized; that sum is output 3."""
    x, skip, gamma, bias = map(f.input, range(4))
    assert x and skip and gamma
    total = _plus(f.b, f.b.op("Add", x, skip), bias)
    _rms_norm(f.b, total, gamma, f.attr("epsilon", LAYER_NORM_EPSILON), f.output(0), [-1])
    if f.wants(3):
        _copy(f.b, total, f.output(3))


def _simplified_layer_norm(f: _Fused) -> None:
    """RMS norm over the axes from ``axis`` on."""
    x, gamma = f.input(0), f.input(1)
    assert x and gamma
    axis = int(f.attr("axis", -1))
    if axis < 0:
        axes = list(range(axis, 0))
    else:
        shape = f.shape(0)
        if shape is None:
            f.refuse(f"its input's rank is unknown (and axis {axis} counts from the front)")
        axes = list(range(axis, len(shape)))
    _rms_norm(f.b, x, gamma, f.attr("epsilon", 1e-5), f.output(0), axes)


def _bias_gelu(f: _Fused) -> None:
    a, bias = f.input(0), f.input(1)
    assert a
    _gelu(f.b, _plus(f.b, a, bias), f.output(0))


def _fast_gelu_op(f: _Fused) -> None:
    x = f.input(0)
    assert x
    _fast_gelu(f.b, _plus(f.b, x, f.input(1)), f.output(0))


def _gemm_fast_gelu(f: _Fused) -> None:
    x, w = f.input(0), f.input(1)
    assert x and w
    _fast_gelu(f.b, _plus(f.b, f.b.op("MatMul", x, w), f.input(2)), f.output(0))


def _quick_gelu(f: _Fused) -> None:
    x, alpha = f.input(0), float(f.attr("alpha", 1.702))
    assert x
    scaled = x if alpha == 1.0 else f.b.op("Mul", x, f.b.const(np.float32(alpha), like=x))
    f.b.op("Mul", x, f.b.op("Sigmoid", scaled), outputs=[f.output(0)])


def _bias_add(f: _Fused) -> None:
    x, bias, skip = map(f.input, range(3))
    assert x and bias and skip
    f.b.op("Add", f.b.op("Add", x, bias), skip, outputs=[f.output(0)])


def _gelu_op(f: _Fused) -> None:
    x = f.input(0)
    assert x
    _gelu(f.b, x, f.output(0))


UNFUSERS: dict[tuple[str, str], Callable[[_Fused], None]] = {
    (MS, "EmbedLayerNormalization"): _embed_layer_norm,
    (MS, "Attention"): _attention,
    (MS, "SkipLayerNormalization"): _skip_layer_norm,
    (MS, "SkipSimplifiedLayerNormalization"): _skip_simplified_layer_norm,
    ("", "SimplifiedLayerNormalization"): _simplified_layer_norm,  # only ONNX Runtime defines it
    (MS, "BiasGelu"): _bias_gelu,
    (MS, "Gelu"): _gelu_op,
    (MS, "FastGelu"): _fast_gelu_op,
    (MS, "GemmFastGelu"): _gemm_fast_gelu,
    (MS, "QuickGelu"): _quick_gelu,
    (MS, "BiasAdd"): _bias_add,
}
"""(domain, op) -> the rewrite of one node of it into standard ops."""
