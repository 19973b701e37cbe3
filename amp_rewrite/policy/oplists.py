"""The precision policy as data: op classes, provider refinements and per-input rules.

Four classes, after TensorFlow's AutoMixedPrecision lists:

- ``allow``: worth running in low precision (Tensor Core work) and safe there.
- ``deny``: needs float32 range or precision; always kept in float32.
- ``infer``: numerically safe either way; follows its neighbours.
- ``clear``: type-agnostic data movement; follows its neighbours.

Each group is a mapping from op type to the reason a user reads in the report.
Ops of the default domain that take no float tensor at all are not listed; an
op that is listed nowhere is handled by the ``unknown_ops`` setting.
"""

from __future__ import annotations

from types import MappingProxyType

ALLOW = "allow"
DENY = "deny"
INFER = "infer"
CLEAR = "clear"
CLASSES = (ALLOW, DENY, INFER, CLEAR)


def _group(reason: str, *ops: str) -> dict[str, str]:
    return dict.fromkeys(ops, reason)


_ALLOW = {
    **_group("matrix product: runs on Tensor Cores with float32 accumulation",
             "MatMul", "Gemm", "Einsum", "FusedMatMul", "GemmFastGelu", "MatMulNBits"),
    **_group("convolution: runs on Tensor Cores (cuDNN) with float32 accumulation",
             "Conv", "ConvTranspose", "FusedConv", "DeformConv", "CausalConvWithState"),
    **_group("recurrent cell: cuDNN runs it in float16 with float32 accumulation", "LSTM", "GRU", "RNN"),
    **_group("fused attention kernel: accumulates in float32 internally",
             "Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention"),
}

_DENY = {
    **_group("exponential or logarithm: overflows float16 (exp(x) > 65504 for x > 11) or loses its range",
             "Exp", "Log", "Softplus", "Mish", "ReduceLogSum", "ReduceLogSumExp"),
    **_group("power: results quickly leave float16's range", "Pow", "Reciprocal"),
    **_group("trigonometric/hyperbolic function that overflows or needs precision near its poles",
             "Tan", "Sinh", "Cosh", "Asin", "Acos", "Acosh", "Atanh"),
    **_group("softmax family: exponentials and a sum over the axis need float32",
             "Softmax", "LogSoftmax", "Hardmax"),
    **_group("loss: log of probabilities and a reduction; gradients start here",
             "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"),
    **_group("reduction: a sum over many elements overflows or loses small terms in float16",
             "ReduceSum", "ReduceMean", "ReduceProd", "ReduceSumSquare", "ReduceL1", "ReduceL2",
             "CumSum", "CumProd", "GlobalLpPool", "LpPool", "LpNormalization"),
    **_group("normalisation: mean and variance statistics need float32",
             "LayerNormalization", "GroupNormalization", "InstanceNormalization", "RMSNormalization",
             "MeanVarianceNormalization", "LRN", "SkipLayerNormalization", "SimplifiedLayerNormalization",
             "SkipSimplifiedLayerNormalization", "GroupNorm"),
    **_group("recurrent state summed over the whole sequence", "LinearAttention"),
    **_group("sequence generator: accumulating start + i*delta loses precision in float16", "Range"),
    **_group("numerically delicate linear algebra or signal processing", "Det", "DFT", "STFT"),
    **_group("random generator or window: output statistics and dtype are part of the contract",
             "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial",
             "BlackmanWindow", "HammingWindow", "HannWindow", "MelWeightMatrix"),
    **_group("reinterprets bits: the bit width is part of the op's contract", "BitCast"),
    **_group("box or coordinate arithmetic: float16 rounding moves coordinates by pixels",
             "RoiAlign", "MaxRoiPool", "AffineGrid", "NonMaxSuppression"),
}

_INFER = {
    **_group("elementwise arithmetic: safe in float16 when its inputs are",
             "Add", "Sub", "Mul", "Div", "Sum", "Mean", "Max", "Min", "Mod", "Neg", "Abs", "Sign",
             "Sqrt", "Clip", "PRelu", "Where", "Shrink"),
    **_group("bounded activation: output range fits float16",
             "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "Tanh", "Elu", "Selu", "Celu", "Gelu",
             "HardSwish", "Swish", "ThresholdedRelu", "Softsign", "Erf", "Sin", "Cos", "Atan", "Asinh",
             "FastGelu", "BiasGelu", "QuickGelu", "BiasAdd", "SwiGLU"),
    **_group("rounding: exact on values float16 represents", "Floor", "Ceil", "Round"),
    **_group("comparison or test: same result on values float16 represents",
             "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "IsNaN", "IsInf",
             "ArgMax", "ArgMin", "TopK"),
    **_group("pooling or resampling: local weighted sums of a few values",
             "AveragePool", "GlobalAveragePool", "Resize", "Upsample", "GridSample", "Col2Im"),
    **_group("inference-time normalisation with fixed statistics: an affine map per channel",
             "BatchNormalization"),
    **_group("quantisation boundary: scale and zero point follow the data",
             "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"),
    **_group("rotary embedding: products with bounded sin/cos tables", "RotaryEmbedding"),
}

_CLEAR = {
    **_group("data movement: copies values without arithmetic",
             "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split",
             "Slice", "Gather", "GatherElements", "GatherND", "Scatter", "ScatterElements", "ScatterND",
             "TensorScatter", "Expand", "Tile", "Pad", "CenterCropPad", "DepthToSpace", "SpaceToDepth",
             "Compress", "ReverseSequence", "Trilu", "OneHot", "Unique", "NonZero", "Shape", "Size",
             "EyeLike", "Dropout", "Optional", "OptionalGetElement", "OptionalHasElement", "MaxUnpool",
             "CastLike", "Cast", "ConstantOfShape"),
    **_group("selection: max/min pick an input value unchanged",
             "MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin"),
}

OP_CLASSES: MappingProxyType[str, MappingProxyType[str, str]] = MappingProxyType({
    ALLOW: MappingProxyType(_ALLOW),
    DENY: MappingProxyType(_DENY),
    INFER: MappingProxyType(_INFER),
    CLEAR: MappingProxyType(_CLEAR),
})

# Where a provider's low-precision kernel accumulates in float32 internally, the
# op is safe in low precision: it becomes ``infer`` and runs low wherever its
# neighbours do (faster than casting around it), but is never forced low
# (memory-bound ops gain nothing from casts added just for them).
PROVIDER_CLASSES: MappingProxyType[str, MappingProxyType[str, tuple[str, str]]] = MappingProxyType({
    "CUDAExecutionProvider": MappingProxyType({
        op: (INFER, f"CUDA's low-precision {op} kernel accumulates in float32, so it is safe there")
        for op in ("LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                   "SkipSimplifiedLayerNormalization", "InstanceNormalization", "GroupNorm",
                   "Softmax", "LogSoftmax")
    }),
})

# Type parameters that stay float32 even where the schema allows low precision.
# Keyed by op type: {type parameter: reason}.
KEEP_FP32_TYPE_PARAMS: MappingProxyType[str, dict[str, str]] = MappingProxyType({
    "Resize": {"T2": "roi holds coordinates; float16 rounding moves them"},
    "LayerNormalization": {"U": "mean and inverse-std-dev statistics are float32 outputs"},
    "Dropout": {"T1": "the ratio is a scalar hyper-parameter"},
})

# Ops whose output element type is fixed by an attribute; a low-precision
# coloring rewrites that attribute (an int data type, or a tensor's values).
RETYPED_BY_ATTRIBUTE: MappingProxyType[str, str] = MappingProxyType({
    "Cast": "to",
    "ConstantOfShape": "value",
    "EyeLike": "dtype",
})

# Ops that own subgraphs: their own inputs and outputs keep their types, their
# bodies are colored with the rest of the model.
CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def check_disjoint() -> None:
    """Raise if an op is listed in two classes (run when a policy is built)."""
    seen: dict[str, str] = {}
    for cls, ops in OP_CLASSES.items():
        for op in ops:
            if op in seen:
                raise ValueError(f"op {op} is listed as both {seen[op]} and {cls}")
            seen[op] = cls
