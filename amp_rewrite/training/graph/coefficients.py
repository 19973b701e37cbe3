"""Constants of a model's formulas (epsilons, scales, fill values, an identity affine), not weights.

Exporters write a formula's scalars as initializers: GELU's 0.5 and 0.044715, attention's
1/sqrt(d), a normalisation's epsilon added to its variance, an input rescaling's 1/255, an
attention mask's fill of -3.4e38, a detector's decoding offsets (PyTorch's dynamo names them
``val_N``, tf2onnx ``.../Cast/x:0``, onnx-simplifier ``.../Constant_N_output_0``). PyTorch
never trains them (they are no ``nn.Parameter``), and descending on them changes what the
model computes: an epsilon of 1e-6 moves by the learning rate each step, past zero. A weight of
one element is read as an operand of a layer instead: a Conv's or Gemm's bias, a one-output
linear layer's bias added to its MatMul, an ``Exp``'s input (CLIP's logit scale), a PRelu's slope.

GroupNormalization before opset 18 is spelled Reshape -> InstanceNormalization -> Reshape ->
Mul -> Add (both of PyTorch's exporters): the InstanceNormalization's scale and bias are ones and
zeros over the groups, and the layer's affine is the per-channel Mul and Add. Those ones and
zeros are the spelling's constants; trained, they would add a per-group affine the layer does not
have (and weight decay would pull the ones towards zero).

Invariant: ``coefficients`` holds exactly (1) the one-element float initializers that every
reader (in any graph) reads as an operand of ``ARITHMETIC`` (elementwise arithmetic, a
comparison, a selection), none of them as an ``Add`` or ``Sum`` of the output of a ``LINEAR`` op
(a bias), and (2) the all-ones scales and all-zeros biases read only by InstanceNormalization
nodes whose input a Reshape makes. ``build`` leaves them out of the default parameters;
``--param`` still names one.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from amp_rewrite.ir.builder import FLOAT_TYPES
from amp_rewrite.ir.sizes import iter_graphs
from amp_rewrite.ir.tensors import read_array

ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Sum", "Max", "Min", "Mean", "Where", "Clip", "Equal",
                        "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Mod"})
"""The readers through which a one-element tensor is a formula's coefficient."""
LINEAR = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "MatMulInteger", "FusedMatMul"})
"""The ops whose output, added to a one-element tensor, makes that tensor a bias (a weight)."""
BIAS_READERS = frozenset({"Add", "Sum"})


def coefficients(proto: onnx.ModelProto) -> set[str]:
    """The model's float initializers that are constants of its formulas (the module's docstring)."""
    tensors = {t.name: t for t in proto.graph.initializer if t.data_type in FLOAT_TYPES}
    graphs = list(iter_graphs(proto.graph))
    producer = {out: node.op_type for graph in graphs for node in graph.node for out in node.output}
    kept: dict[str, bool] = {}
    """Initializer -> whether every reader so far reads it as a constant."""
    for graph in graphs:
        for output in graph.output:
            kept[output.name] = False
        for node in graph.node:
            standard = node.domain in ("", "ai.onnx")
            for at, name in enumerate(node.input):
                tensor = tensors.get(name)
                if tensor is None:
                    continue
                if math.prod(tensor.dims) == 1:
                    bias = node.op_type in BIAS_READERS and any(producer.get(other) in LINEAR for other in node.input)
                    constant = standard and node.op_type in ARITHMETIC and not bias
                else:
                    constant = standard and _group_affine(node, at, tensor, producer)
                kept[name] = kept.get(name, True) and constant
    return {name for name, constant in kept.items() if constant and name in tensors}


def _group_affine(node: onnx.NodeProto, at: int, tensor: onnx.TensorProto, producer: dict[str, str]) -> bool:
    """Whether ``tensor``, read as input ``at`` of ``node``, is GroupNormalization's spelled-out
    identity affine: ones as an InstanceNormalization's scale or zeros as its bias, the
    normalised input made by a Reshape."""
    if node.op_type != "InstanceNormalization" or at not in (1, 2) or producer.get(node.input[0]) != "Reshape":
        return False
    return bool(np.all(read_array(tensor, None) == (1.0 if at == 1 else 0.0)))
