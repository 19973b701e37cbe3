"""One-element constants of a model's formulas: epsilons, scales and fill values, not weights.

Exporters write a formula's scalars as initializers: GELU's 0.5 and 0.044715, attention's
1/sqrt(d), a normalisation's epsilon added to its variance, an input rescaling's 1/255, an
attention mask's fill of -3.4e38, a detector's decoding offsets (PyTorch's dynamo names them
``val_N``, tf2onnx ``.../Cast/x:0``, onnx-simplifier ``.../Constant_N_output_0``). PyTorch
never trains them (they are no ``nn.Parameter``), and descending on them changes what the
model computes: an epsilon of 1e-6 moves by the learning rate each step, past zero. A weight of
one element is read as an operand of a layer instead: a Conv's or Gemm's bias, a one-output
linear layer's bias added to its MatMul, an ``Exp``'s input (CLIP's logit scale), a PRelu's slope.

Invariant: ``coefficients`` holds exactly the one-element float initializers (of any graph's
readers) that every reader reads as an operand of ``ARITHMETIC`` (elementwise arithmetic, a
comparison, a selection), none of them as an ``Add`` or ``Sum`` of the output of a ``LINEAR``
op (a bias). ``build`` leaves them out of the default parameters; ``--param`` still names one.
"""

from __future__ import annotations

import math

import onnx

from amp_rewrite.ir.builder import FLOAT_TYPES
from amp_rewrite.ir.sizes import iter_graphs

ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Sum", "Max", "Min", "Mean", "Where", "Clip", "Equal",
                        "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Mod"})
"""The readers through which a one-element tensor is a formula's coefficient."""
LINEAR = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "MatMulInteger", "FusedMatMul"})
"""The ops whose output, added to a one-element tensor, makes that tensor a bias (a weight)."""
BIAS_READERS = frozenset({"Add", "Sum"})


def coefficients(proto: onnx.ModelProto) -> set[str]:
    """The model's one-element float initializers that are coefficients of its formulas (the
    module's docstring)."""
    scalars = {t.name for t in proto.graph.initializer
               if t.data_type in FLOAT_TYPES and math.prod(t.dims) == 1}
    if not scalars:
        return set()
    graphs = list(iter_graphs(proto.graph))
    producer = {out: node.op_type for graph in graphs for node in graph.node for out in node.output}
    read_otherwise: set[str] = set()
    read: set[str] = set()
    for graph in graphs:
        read_otherwise.update(o.name for o in graph.output if o.name in scalars)
        for node in graph.node:
            for name in node.input:
                if name not in scalars:
                    continue
                read.add(name)
                arithmetic = node.op_type in ARITHMETIC and node.domain in ("", "ai.onnx")
                bias = node.op_type in BIAS_READERS and any(producer.get(other) in LINEAR for other in node.input)
                if not arithmetic or bias:
                    read_otherwise.add(name)
    return read - read_otherwise

