"""The batch statistics of a train-mode BatchNormalization, in one of two formulations.

Both normalise ``x`` ([N, C, ...]) by its mean and biased variance over every axis but the
channel, and return them for the running statistics; the gradients come from the rules of
the ops they emit. They differ in which tensors hold float32 once the mixed-precision
rewrite has made ``x`` float16:

- ``decomposed``: ReduceMean, Sub and Mul over the activation. The policy keeps the
  reductions float32 (deny) and everything after them up to the next allow op, so ``x`` is
  cast to float32, and the centred activation, its square, the output and their gradients
  are float32 tensors the size of the activation.
- ``layer-norm``: LayerNormalization over the spatial axes (scale ones, epsilon the node's)
  returns each (n, c)'s mean and inverse standard deviation in float32 (``stash_type`` 1; its
  kernels accumulate in float whatever X's type), shaped [N, C, 1, ...]. They give the
  channel's statistics in float32 by the law of total variance (each (n, c) holds as many
  elements): ``mean_c = mean_n(mean_nc)``, ``var_c + eps = mean_n(var_nc + eps) +
  mean_n((mean_nc - mean_c)^2)``, a sum of non-negative terms (no cancellation). An
  inference-mode BatchNormalization applies them: ``y = BN(x, scale / sqrt(var_c + eps),
  bias, mean_c, 1 - eps, eps)``; folding ``1/sqrt(var_c + eps)`` into the scale keeps the
  variance out of float16 (a standard deviation over 256 would overflow it, and its
  gradient grows as 1/std^3). The invariant, where the rewrite runs the two norms in ``x``'s
  type (LayerNormalization is infer on CUDA, BatchNormalization infer): float32 holds the
  [N, C] and [C] statistics and nothing shaped like the activation, forward or backward (the
  LayerNormalization rule differentiates Mean and InvStdDev with per-row coefficients, the
  BatchNormalization rule sums over N and the spatial axes as LayerNormalization means:
  ``autodiff/rules/norm.py``). CUDA's BatchNormalization takes its per-channel inputs in X's
  type, so the rewrite casts them to float16; their gradients (sums over the batch, loss
  scale included) are made in float32 and stay float32 on their way back (the Cast rule
  takes a rule's uncast value), so they overflow no more than the decomposition's.

``FORMULATION`` chooses, as data; ``layer-norm`` (the default) applies where the default
opset has LayerNormalization (17 on) and ``x`` has spatial axes (rank 3 on), ``decomposed``
elsewhere.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from amp_rewrite.ir.builder import GraphBuilder

FORMULATIONS = ("decomposed", "layer-norm")
FORMULATION = "layer-norm"
"""The formulation ``batchnorm_to_train_mode`` emits where it applies (``formulation``)."""
LAYER_NORM_OPSET = 17


def formulation(opset: int, rank: int) -> str:
    """The formulation for an input of ``rank`` in a model of default ``opset``: ``FORMULATION``
    where it applies, else ``decomposed``."""
    if FORMULATION not in FORMULATIONS:
        raise ValueError(f"unknown batch-statistics formulation {FORMULATION!r}; choose one of "
                         f"{', '.join(FORMULATIONS)}")
    if FORMULATION == "layer-norm" and (opset < LAYER_NORM_OPSET or rank < 3):
        return "decomposed"
    return FORMULATION


def declarations(nodes: list[onnx.NodeProto]) -> list[onnx.ValueInfoProto]:
    """The element types of the statistics that ``nodes``' LayerNormalizations output (float32,
    their ``stash_type``), to declare in the graph: the schema leaves them open, and the
    mixed-precision rewrite retypes only values of known type (an untyped mean would leave the
    BatchNormalization reading it float32 beside a float16 input)."""
    return [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for node in nodes
            if node.op_type == "LayerNormalization" for name in node.output[1:] if name]


def normalised(b: GraphBuilder, x: str, scale: str, bias: str, output: str, epsilon: float,
               rank: int) -> tuple[str, str]:
    """Write ``output = scale * (x - mean) / sqrt(var + epsilon) + bias`` with the batch's
    statistics over every axis but 1, in the ``formulation`` for ``b``'s opset and ``x``'s
    ``rank``; return (mean, biased variance), C elements each."""
    build = _layer_norm if formulation(b.opset, rank) == "layer-norm" else _decomposed
    return build(b, x, scale, bias, output, epsilon, rank)


def pooled(b: GraphBuilder, x: str, scale: str, bias: str, output: str, epsilon: float,
           rank: int) -> tuple[str, str]:
    """Write ``output`` = the GlobalAveragePool of ``normalised``'s output without making that
    output: each (n, c)'s mean of ``x`` is the LayerNormalization's Mean, so the pool is
    ``gain_c * mean_nc + (bias_c - gain_c * mean_c)`` on [N, C, 1, ...] values (the shortcut for a
    BatchNormalization that only a GlobalAveragePool reads; ``layer-norm`` formulation only)."""
    assert formulation(b.opset, rank) == "layer-norm"
    return _layer_norm(b, x, scale, bias, output, epsilon, rank, pool=True)


def _decomposed(b: GraphBuilder, x: str, scale: str, bias: str, output: str, epsilon: float,
                rank: int) -> tuple[str, str]:
    """Reductions and elementwise ops over the activation (as PyTorch's train mode computes it)."""
    axes = [0, *range(2, rank)]
    channel = [1, -1] + [1] * (rank - 2)  # per-channel values broadcast over the input
    mean = b.axes_op("ReduceMean", x, axes, keepdims=1)
    centred = b.op("Sub", x, mean)
    var = b.axes_op("ReduceMean", b.op("Mul", centred, centred), axes, keepdims=1)
    std = b.op("Sqrt", b.op("Add", var, b.const(epsilon, like=x)))
    # gamma / std per channel, then one product over the activation (not a division and a product)
    gain = b.op("Div", b.op("Reshape", scale, b.ints(channel)), std)
    b.op("Add", b.op("Mul", centred, gain), b.op("Reshape", bias, b.ints(channel)), outputs=[output])
    return mean, var


def _layer_norm(b: GraphBuilder, x: str, scale: str, bias: str, output: str, epsilon: float,
                rank: int, pool: bool = False) -> tuple[str, str]:
    """Per-(n, c) statistics from LayerNormalization, combined per channel in float32, applied by
    an inference-mode BatchNormalization. The statistics, [N, C, 1, ...], are transposed to
    [1, C, N, ...] so that a GlobalAveragePool (an infer op) averages over n: a ReduceMean is deny,
    and the rewrite keeps everything downstream of a deny op float32 up to the next allow op (the
    BatchNormalization and the activation with it). The spread is written ``mean_c - mean_nc``: a
    Sub of a GlobalAveragePool's input minus its output reads as a written-out norm's mean."""
    row_mean, row_inv_std = b.row_statistics(x, 2, epsilon)
    swap = [2, 1, 0, *range(3, rank)]  # [N, C, 1, ...] -> [1, C, N, ...]
    per_row = row_mean
    row_mean, row_inv_std = (b.op("Transpose", v, perm=swap) for v in (row_mean, row_inv_std))
    row_var_eps = b.op("Div", b.const(1.0, like=row_mean), b.op("Mul", row_inv_std, row_inv_std))  # var_nc + eps
    mean = b.op("GlobalAveragePool", row_mean)  # [1, C, 1, ...]
    spread = b.op("Sub", mean, row_mean)
    var_eps = b.op("GlobalAveragePool", b.op("Add", row_var_eps, b.op("Mul", spread, spread)))
    mean, var_eps = (b.op("Reshape", v, b.ints([-1])) for v in (mean, var_eps))  # [C]
    gain = b.op("Div", scale, b.op("Sqrt", var_eps))
    if pool:
        channel = b.ints([1, -1] + [1] * (rank - 2))
        gain_c = b.op("Reshape", gain, channel)
        shift = b.op("Sub", b.op("Reshape", bias, channel), b.op("Mul", gain_c, b.op("Reshape", mean, channel)))
        b.op("Add", b.op("Mul", per_row, gain_c), shift, outputs=[output])
    else:
        unit = b.op("Expand", b.const(1.0 - epsilon, like=scale), b.op("Shape", scale))  # + epsilon = 1
        b.op("BatchNormalization", x, gain, bias, mean, unit, outputs=[output], epsilon=epsilon)
    return mean, b.op("Sub", var_eps, b.const(epsilon, like=var_eps))
