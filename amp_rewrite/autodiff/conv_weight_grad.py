"""A convolution's weight gradient in four formulations, and the rule that picks one by shape.

The weight gradient is one sum; the formulations change only which kernels ONNX Runtime runs for
it (on CUDA, which cuDNN engine its heuristics pick: the shape decides, search does not). In the
forward Conv's terms (the ConvTranspose rule passes its operands in these roles), windows read
``a`` (N x C x spatial, padded by ``begin``/``end``) at ``o * strides + r * dilations`` and write
``go`` (N x K x out) in ``group`` groups of C/group channels and K/group filters, so::

    dW[k, c, r] = sum over n, o of go[n, k, o] * a_padded[n, group_of(k) * C/group + c, o * strides + r * dilations]

shaped K x C/group x kernel.

- ``direct`` (formulation A, ``conv._weight_grad``): one Conv whose contraction axis is the
  batch, the batch-transposed ``go`` (a kernel of extent ``out``) over the batch-transposed ``a``.
  cuDNN runs it with forward kernels, which do not split the N x out loop: a small dW gives them
  few output tiles. Any shape, static or not.
- ``grouped`` (:func:`grouped`): split-K. The batch in ``split`` parts made the groups of one
  grouped Conv, then the partial kernels summed in float32.
- ``transposed`` (:func:`transposed`): a ConvTranspose with swapped roles, which runs cuDNN's
  backward-data kernels. One group, no dilation.
- ``im2col`` (:func:`im2col`): one Slice per kernel offset, a batched MatMul, the batch summed
  in float32. For few input rows (C/group x kernel), such as a 3-channel first layer.

Every one but ``direct`` needs static shapes of ``a`` and ``go``; :func:`choose` turns a
:class:`ConvShape` and the requested mode into a :class:`Choice`, with its reason, and falls
back to ``direct`` where the requested formulation does not apply.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from onnx import TensorProto

from amp_rewrite.autodiff.context import SLICE_END
from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import LOW_TYPES, GraphBuilder

Dims = tuple[int, ...]

MODES = ("direct", "grouped", "transposed", "im2col", "auto")
"""The values of ``add_backward``'s ``conv_weight_grad``: a formulation forced where it applies
(``direct`` elsewhere), or ``auto`` (:func:`choose`'s rule)."""

def checked(mode: str) -> str:
    """``mode``, where it is one of ``MODES``; else a UserError naming them."""
    if mode not in MODES:
        raise UserError(f"conv_weight_grad {mode!r} is not one of {', '.join(MODES)}")
    return mode


# -- the rule's thresholds (from docs/training-speed.md, item 1: arithmetic, not measured) --
SPLIT_MIN_SAMPLES = 16
"""Samples per part of a split batch: each group of the grouped Conv contracts over at least 16
channels, a whole Tensor Core tile in float16."""
SPLIT_MAX = 8
"""Parts of a split batch at most: 8 turns the 61 output tiles of the seed CNN's conv2 into ~490
(3.7 waves on 132 SMs), enough to fill the device, while the float32 partial kernels (8 x dW)
stay small and each group long enough to amortize its tile's setup."""
TINY_MACS = 2**27
"""Multiply-adds below which a weight gradient is left direct: it then takes about as long as the
kernel launches (Transpose, Cast, ReduceSum) that a reformulation adds."""
ONE_WAVE_OUTPUTS = 2**21
"""dW elements at which the direct Conv's 128 x 128 output tiles fill 132 SMs once; from there on
it has enough tiles and splitting its contraction buys nothing."""
IM2COL_MAX_ROWS = 27
"""C/group x kernel elements at most for ``auto``'s im2col (3 channels by 3 x 3): the copy then
holds at most 27 values per output position, less than a typical activation."""


@dataclass(frozen=True)
class ConvShape:
    """A weight gradient's geometry in the forward Conv's terms (see the module docstring);
    ``batch``, ``filters``, ``spatial`` and ``out`` are None where not static."""

    batch: int | None
    channels: int
    filters: int | None
    group: int
    kernel: Dims
    strides: Dims
    dilations: Dims
    begin: Dims
    end: Dims
    spatial: Dims | None
    out: Dims | None
    elem_type: int | None

    @property
    def static(self) -> bool:
        return None not in (self.batch, self.filters, self.spatial, self.out)

    @property
    def sizes(self) -> tuple[int, int, Dims, Dims]:
        """(batch, filters, spatial, out) of a static shape."""
        assert self.batch is not None and self.filters is not None
        assert self.spatial is not None and self.out is not None
        return self.batch, self.filters, self.spatial, self.out

    @property
    def macs(self) -> int:
        """Multiply-adds of the sum (static shapes only)."""
        batch, filters, _, out = self.sizes
        return batch * math.prod(out) * filters * self.rows

    @property
    def rows(self) -> int:
        """Input rows per group: C/group x kernel."""
        return self.channels // self.group * math.prod(self.kernel)

    @property
    def made(self) -> Dims:
        """Kernel offsets a Conv over the padded ``a`` with ``go`` as kernel makes (at least ``kernel``)."""
        _, _, spatial, out = self.sizes
        return tuple((s + b + e - (st * (o - 1) + 1)) // d + 1 for s, o, b, e, st, d in
                     zip(spatial, out, self.begin, self.end, self.strides, self.dilations))


@dataclass(frozen=True)
class Choice:
    """The formulation a weight gradient is built in, and why."""

    formulation: str
    why: str


def split(shape: ConvShape) -> int:
    """The parts the batch splits into: the largest divisor g <= SPLIT_MAX of N with N/g >=
    SPLIT_MIN_SAMPLES (1: no split)."""
    n = shape.batch or 0
    return max((g for g in range(1, SPLIT_MAX + 1) if n % g == 0 and n // g >= SPLIT_MIN_SAMPLES), default=1)


# -- applicability: None where the formulation builds this gradient, else why it cannot ----------------
def _grouped_fails(shape: ConvShape) -> str | None:
    if shape.batch is None:
        return "the batch is not static"
    if split(shape) < 2:
        return f"batch {shape.batch} has no divisor g >= 2 with N/g >= {SPLIT_MIN_SAMPLES}"
    return None


def _transposed_fails(shape: ConvShape) -> str | None:
    if shape.group != 1:
        return "it has groups (a ConvTranspose with swapped roles pairs every channel with every filter)"
    if any(d != 1 for d in shape.dilations):
        return "it is dilated (the flipped activation as a filter would need strides)"
    return None


APPLIES: dict[str, Callable[[ConvShape], str | None]] = {
    "grouped": _grouped_fails,
    "transposed": _transposed_fails,
    "im2col": lambda shape: None,
}
"""Beyond static shapes, which every formulation but ``direct`` needs."""


def _fails(formulation: str, shape: ConvShape) -> str | None:
    if not shape.static:
        return "its shapes are not static"
    return APPLIES[formulation](shape)


# -- the rule -------------------------------------------------------------------------------------------
AUTO: tuple[tuple[str, Callable[[ConvShape], bool], str], ...] = (
    ("im2col", lambda s: s.group == 1 and s.rows <= IM2COL_MAX_ROWS,
     f"a first layer (C x kernel <= {IM2COL_MAX_ROWS}): the direct Conv makes a handful of output tiles"),
    ("grouped", lambda s: s.sizes[1] * s.rows < ONE_WAVE_OUTPUTS,
     f"dW has under {ONE_WAVE_OUTPUTS} elements, too few tiles for the direct Conv; the batch splits"),
)
"""``auto``'s rule, first match wins, for float16, bfloat16 and float32 gradients of at least
TINY_MACS multiply-adds: (formulation, when, why)."""


def choose(shape: ConvShape, mode: str) -> Choice:
    """The formulation of the weight gradient of ``shape`` for the requested ``mode`` (one of
    MODES). A named formulation is taken where it applies, ``direct`` elsewhere.

    ``auto`` takes im2col for first layers (one group, C x kernel <= 27), else grouped split-K
    where the batch splits (g >= 2 parts of N/g >= 16 samples) and dW is small enough that the
    direct Conv cannot fill the device, else ``direct``; float64 and tiny gradients (under
    2**27 multiply-adds) stay direct, and ``transposed`` is never chosen. These thresholds come
    from the arithmetic of docs/training-speed.md (item 1: output tiles
    against 132 SMs), not from a measurement: they await the GPU probe's timings (train_probe.py,
    section ``wgrad``, recorded in benchmarks/RESULTS.md), which may move them or let
    ``transposed`` win some shapes."""
    if mode == "direct":
        return Choice("direct", "requested")
    if mode != "auto":
        why = _fails(mode, shape)
        return Choice(mode, "requested") if why is None else Choice("direct", f"{mode} does not apply: {why}")
    if not shape.static:
        return Choice("direct", "its shapes are not static")
    if shape.elem_type not in (*LOW_TYPES, TensorProto.FLOAT):
        return Choice("direct", "no measurement or analysis covers this element type")
    if shape.macs < TINY_MACS:
        return Choice("direct", f"tiny ({shape.macs} multiply-adds < {TINY_MACS})")
    for formulation, when, why in AUTO:
        if _fails(formulation, shape) is None and when(shape):
            return Choice(formulation, why)
    return Choice("direct", "dW has output tiles enough for the direct Conv, or the batch does not split")


# -- the formulations ---------------------------------------------------------------------------------
def batch_major(b: GraphBuilder, a: str, channels: int, group: int, spatial: Dims | None, n: int) -> str:
    """``a`` (N x channels x S) with batch and channel axes swapped; with groups, shaped
    C/group x (group * N) x S, so that a Conv's group j reads group j's channels of every sample."""
    swap = [1, 0, *range(2, 2 + n)]
    if group == 1:
        return b.op("Transpose", a, perm=swap)
    # N x (g * per) x S -> per x (g * N) x S, so that Conv's group g pairs group i of a with that of other
    per = channels // group
    if spatial is not None:
        first, second = b.ints([0, group, per, *spatial]), b.ints([per, -1, *spatial])
    else:
        tail = b.op("Shape", a, start=2)
        first = b.op("Concat", b.ints([0, group, per]), tail, axis=0)
        second = b.op("Concat", b.ints([per, -1]), tail, axis=0)
    moved = b.op("Transpose", b.op("Reshape", a, first), perm=[2, 1, 0, *range(3, 3 + n)])
    return b.op("Reshape", moved, second)


def grouped(b: GraphBuilder, a: str, go: str, shape: ConvShape) -> str:
    """Grouped split-K: the batch split into g parts of n' samples (g from :func:`split`), each
    part (per forward group) one group of a single grouped Conv. The batch-transposed ``a`` needs
    no new copy (part i of group j is its channels [(j g + i) n', (j g + i + 1) n')); ``go`` is
    reshaped to [g, n', K, out], transposed to [g, K, n', out] and reshaped to [g K, n', out]
    (with forward groups, [G g K/G, n', out] ordered by forward group). The Conv's g partial
    kernels are cast to float32 (for float16 and bfloat16 operands) and summed by one
    ReduceSum, then returned to the operands' type."""
    batch, filters, spatial, out = shape.sizes
    n, g, per, groups = len(shape.kernel), split(shape), shape.channels // shape.group, shape.group
    lead, part = ([groups] if groups > 1 else []), filters // groups
    lhs = batch_major(b, a, shape.channels, groups, spatial, n)
    parts = b.op("Reshape", go, b.ints([g, batch // g, *lead, part, *out]))
    order = [2, 0, 3, 1] if groups > 1 else [0, 2, 1]
    moved = b.op("Transpose", parts, perm=[*order, *range(len(order), len(order) + n)])
    rhs = b.op("Reshape", moved, b.ints([groups * g * part, batch // g, *out]))
    y = b.op("Conv", lhs, rhs, group=groups * g, strides=list(shape.dilations), dilations=list(shape.strides),
             pads=list(shape.begin) + list(shape.end))  # per x (G g K/G) x made
    y = b.op("Reshape", _cut(b, y, shape), b.ints([per, *lead, g, part, *shape.kernel]))
    y, elem = _widened(b, y, a)
    y = b.reduce_sum(y, [1 + len(lead)], keepdims=0)  # per x [G x] K/G x kernel
    back = [1, 2, 0] if groups > 1 else [1, 0]
    y = b.op("Transpose", y, perm=[*back, *range(len(back), len(back) + n)])
    if groups > 1:
        y = b.op("Reshape", y, b.ints([filters, per, *shape.kernel]))
    return _narrowed(b, y, elem)


def transposed(b: GraphBuilder, a: str, go: str, shape: ConvShape) -> str:
    """A ConvTranspose with swapped roles: the batch-transposed ``go`` (K x N x out) as its input,
    ``a`` flipped along every spatial axis (N x C x spatial) as its filter, the forward's strides,
    symmetric pads; then one Slice with step -1 cuts the kernel's offsets out and flips them back.
    Per axis, offset r of the kernel lands at position extent - 1 + begin - r of the full
    result (of extent strides * (out - 1) + extent); offsets reading only padding (past the full
    result) come out zero through a Pad. Needs one group and no dilation."""
    _, _, spatial, outs = shape.sizes
    n = len(shape.kernel)
    axes = list(range(2, 2 + n))
    lhs = b.op("Transpose", go, perm=[1, 0, *axes])
    flipped = b.op("Slice", a, b.ints([-1] * n), b.ints([-SLICE_END] * n), b.ints(axes), b.ints([-1] * n))
    pads: list[int] = []
    starts: list[int] = []
    before: list[int] = []
    after: list[int] = []
    for extent, out, stride, begin, size in zip(spatial, outs, shape.strides, shape.begin, shape.kernel):
        full, first = stride * (out - 1) + extent, extent - size + begin  # first: where offset size - 1 lands
        pad = max(0, min(first, full - first - size))
        start, length = first - pad, full - 2 * pad
        before.append(max(0, -start))
        after.append(max(0, start + size - length))
        pads.append(pad)
        starts.append(start + before[-1])
    y = b.op("ConvTranspose", lhs, flipped, strides=list(shape.strides), pads=pads + pads)  # K x C x length
    if any(before) or any(after):
        y = b.op("Pad", y, b.ints([0, 0, *before, 0, 0, *after]))
    # Offsets start + size - 1 down to start, flipped back: a Slice with step -1 (an end of -1 would wrap).
    ends = [s - 1 if s > 0 else -SLICE_END for s in starts]
    return b.op("Slice", y, b.ints([s + k - 1 for s, k in zip(starts, shape.kernel)]), b.ints(ends), b.ints(axes),
                b.ints([-1] * n))


def im2col(b: GraphBuilder, a: str, go: str, shape: ConvShape) -> str:
    """im2col: the padded ``a`` sliced once per kernel offset r (start r * dilations, step strides,
    out positions), the slices concatenated on the first spatial axis so that, reshaped, they
    are the columns [N, G, C/G x kernel, out] in dW's (c, r) order; a batched MatMul with the
    transposed ``go`` ([N, G, out, K/G]) makes one partial dW per sample, cast to float32 (for
    float16 and bfloat16 operands), summed over the batch by one ReduceSum, and returned to the
    operands' type."""
    batch, filters, _, out = shape.sizes
    n, groups = len(shape.kernel), shape.group
    axes, positions = list(range(2, 2 + n)), math.prod(out)
    if any(shape.begin) or any(shape.end):
        a = b.op("Pad", a, b.ints([0, 0, *shape.begin, 0, 0, *shape.end]))
    steps = [b.ints(shape.strides)] if any(s != 1 for s in shape.strides) else []
    cols = []
    for offset in itertools.product(*map(range, shape.kernel)):
        starts = [r * d for r, d in zip(offset, shape.dilations)]
        ends = [s + (o - 1) * st + 1 for s, o, st in zip(starts, out, shape.strides)]
        cols.append(b.op("Slice", a, b.ints(starts), b.ints(ends), b.ints(axes), *steps))
    col = b.op("Concat", *cols, axis=2) if len(cols) > 1 else cols[0]  # N x C x (offsets * out[0]) x out[1:]
    col = b.op("Reshape", col, b.ints([batch, groups, shape.rows, positions]))
    part = filters // groups
    rhs = b.op("Reshape", go, b.ints([batch, groups, part, positions]))
    rhs = b.op("Transpose", rhs, perm=[0, 1, 3, 2])  # N x G x out x K/G
    y, elem = _widened(b, b.op("MatMul", col, rhs), a)  # N x G x rows x K/G
    y = b.op("Transpose", b.reduce_sum(y, [0], keepdims=0), perm=[0, 2, 1])  # G x K/G x rows
    y = b.op("Reshape", y, b.ints([filters, shape.channels // groups, *shape.kernel]))
    return _narrowed(b, y, elem)


FORMULATIONS: dict[str, Callable[[GraphBuilder, str, str, ConvShape], str]] = {
    "grouped": grouped,
    "transposed": transposed,
    "im2col": im2col,
}
"""The builders besides ``direct``: (builder, a, go, static shape) -> dW (K x C/group x kernel)."""


# -- helpers ------------------------------------------------------------------------------------------
def _cut(b: GraphBuilder, y: str, shape: ConvShape) -> str:
    """``y`` (.. x made) cut to the kernel's extents where the windows' remainder made more."""
    n = len(shape.kernel)
    if shape.made == shape.kernel:
        return y
    return b.op("Slice", y, b.ints([0] * n), b.ints(shape.kernel), b.ints(list(range(2, 2 + n))))


def _widened(b: GraphBuilder, y: str, like: str) -> tuple[str, int | None]:
    """``y`` cast to float32 where ``like`` is float16 or bfloat16 (partial sums are added in
    float32); and the type to return the sum to (None: it already has it)."""
    elem = b.types.get(like)
    if elem in LOW_TYPES:
        return b.op("Cast", y, to=TensorProto.FLOAT), elem
    return y, None


def _narrowed(b: GraphBuilder, y: str, elem: int | None) -> str:
    return y if elem is None else b.op("Cast", y, to=elem)
