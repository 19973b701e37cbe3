"""The precision policy as data: op classes, provider refinements and per-input rules.

Four classes, after TensorFlow's AutoMixedPrecision lists:

- ``allow``: worth running in low precision (Tensor Core work) and safe there.
- ``deny``: needs float32 range or precision; always kept in float32.
- ``infer``: numerically safe either way; follows its neighbours.
- ``clear``: type-agnostic data movement; follows its neighbours.

Each group maps an op key, (domain, op type) with ``""`` for the default domain
(``ai.onnx`` is normalised to it by ``op_key``), to the reason a user reads in the
report. ONNX Runtime's contrib ops live in ``com.microsoft`` (their domains are
those of ``onnxruntime``'s schemas and of the kernel tables); an op defined in both
domains has an entry for each, so a default-domain node named like a contrib op is
not taken for one. Ops of the default domain that take no float tensor at all are
not listed; an op that is listed nowhere is handled by the ``unknown_ops`` setting.
"""

from __future__ import annotations

from types import MappingProxyType

ALLOW = "allow"
DENY = "deny"
INFER = "infer"
CLEAR = "clear"
CLASSES = (ALLOW, DENY, INFER, CLEAR)
MS = "com.microsoft"

OpKey = tuple[str, str]
"""(domain, op type); the default domain is ``""``."""


def op_key(domain: str, op_type: str) -> OpKey:
    """The key of an op in these lists (``ai.onnx`` is the default domain ``""``)."""
    return ("" if domain == "ai.onnx" else domain, op_type)


def _group(reason: str, *ops: str, ms: tuple[str, ...] = ()) -> dict[OpKey, str]:
    """``reason`` for each of ``ops`` (default domain) and of ``ms`` (``com.microsoft``)."""
    return {**{("", op): reason for op in ops}, **{(MS, op): reason for op in ms}}


_ALLOW = {
    **_group("matrix product: runs on Tensor Cores with float32 accumulation",
             "MatMul", "Gemm", "Einsum", ms=("FusedMatMul", "GemmFastGelu", "MatMulNBits")),
    **_group("convolution: runs on Tensor Cores (cuDNN) with float32 accumulation",
             "Conv", "ConvTranspose", "DeformConv", "CausalConvWithState", ms=("FusedConv", "CausalConvWithState")),
    **_group("recurrent cell: cuDNN runs it in float16 with float32 accumulation", "LSTM", "GRU", "RNN"),
    **_group("fused attention kernel: accumulates in float32 internally",
             "Attention", ms=("Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention")),
}

_DENY = {
    **_group("exponential or logarithm: overflows float16 (exp(x) > 65504 for x > 11) or loses its range",
             "Exp", "Log", "Softplus", "Mish", "ReduceLogSum", "ReduceLogSumExp"),
    **_group("power: results quickly leave float16's range", "Pow", "Reciprocal"),
    **_group("trigonometric/hyperbolic function that overflows or needs precision near its poles",
             "Tan", "Sinh", "Cosh", "Asin", "Acos", "Acosh", "Atanh"),
    **_group("periodic function: float16 rounds its argument x by up to |x|*2^-11, and all of that error "
             "reaches the output (diffusion timestep and rotary position embeddings take sin and cos of "
             "thousands of radians)", "Sin", "Cos"),
    **_group("softmax family: exponentials and a sum over the axis need float32",
             "Softmax", "LogSoftmax", "Hardmax"),
    **_group("loss: log of probabilities and a reduction; gradients start here",
             "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"),
    **_group("reduction: a sum over many elements overflows or loses small terms in float16",
             "ReduceSum", "ReduceMean", "ReduceProd", "ReduceSumSquare", "ReduceL1", "ReduceL2",
             "CumSum", "CumProd", "GlobalLpPool", "LpPool", "LpNormalization"),
    # SimplifiedLayerNormalization is ONNX Runtime's own op, registered in the default domain.
    **_group("normalisation: mean and variance statistics need float32",
             "LayerNormalization", "GroupNormalization", "InstanceNormalization", "RMSNormalization",
             "MeanVarianceNormalization", "LRN", "SimplifiedLayerNormalization",
             ms=("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "GroupNorm", "SkipGroupNorm",
                 "EmbedLayerNormalization", "BranchwiseRMSNorm", "GatedRMSNorm")),
    **_group("recurrent state summed over the whole sequence", "LinearAttention", ms=("LinearAttention",)),
    **_group("sequence generator: accumulating start + i*delta loses precision in float16", "Range", ms=("Range",)),
    **_group("numerically delicate linear algebra or signal processing", "Det", "DFT", "STFT"),
    **_group("random generator or window: output statistics and dtype are part of the contract",
             "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial",
             "BlackmanWindow", "HammingWindow", "HannWindow", "MelWeightMatrix"),
    **_group("box or coordinate arithmetic: float16 rounding moves coordinates by pixels",
             "RoiAlign", "MaxRoiPool", "AffineGrid", "NonMaxSuppression"),
}

_INFER = {
    **_group("elementwise arithmetic: safe in float16 when its inputs are",
             "Add", "Sub", "Mul", "Div", "Sum", "Mean", "Max", "Min", "Mod", "Neg", "Abs", "Sign",
             "Sqrt", "Clip", "PRelu", "Where", "Shrink"),
    **_group("bounded activation: output range fits float16",
             "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "Tanh", "Elu", "Selu", "Celu", "Gelu",
             "HardSwish", "Swish", "ThresholdedRelu", "Softsign", "Erf", "Atan", "Asinh", "SwiGLU",
             ms=("Gelu", "FastGelu", "BiasGelu", "QuickGelu", "BiasAdd")),
    **_group("rounding: exact on values float16 represents", "Floor", "Ceil", "Round"),
    **_group("comparison or test: same result on values float16 represents",
             "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "IsNaN", "IsInf",
             "ArgMax", "ArgMin", "TopK"),
    **_group("pooling or resampling: local weighted sums of a few values",
             "AveragePool", "GlobalAveragePool", "Resize", "Upsample", "GridSample", "Col2Im", ms=("GridSample",)),
    **_group("inference-time normalisation with fixed statistics: an affine map per channel",
             "BatchNormalization"),
    **_group("quantisation boundary: scale and zero point follow the data",
             "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", ms=("QuantizeLinear", "DequantizeLinear")),
    **_group("rotary embedding: products with bounded sin/cos tables", "RotaryEmbedding", ms=("RotaryEmbedding",)),
}

_CLEAR = {
    **_group("data movement: copies values without arithmetic",
             "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split",
             "Slice", "Gather", "GatherElements", "GatherND", "Scatter", "ScatterElements", "ScatterND",
             "TensorScatter", "Expand", "Tile", "Pad", "CenterCropPad", "DepthToSpace", "SpaceToDepth",
             "Compress", "ReverseSequence", "Trilu", "OneHot", "Unique", "NonZero", "Shape", "Size",
             "EyeLike", "Dropout", "Optional", "OptionalGetElement", "OptionalHasElement", "MaxUnpool",
             "CastLike", "Cast", "ConstantOfShape", ms=("GatherND", "Pad", "Trilu", "Unique")),
    **_group("selection: max/min pick an input value unchanged",
             "MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin"),
}

OP_CLASSES: MappingProxyType[str, MappingProxyType[OpKey, str]] = MappingProxyType({
    ALLOW: MappingProxyType(_ALLOW),
    DENY: MappingProxyType(_DENY),
    INFER: MappingProxyType(_INFER),
    CLEAR: MappingProxyType(_CLEAR),
})

# Where a provider's low-precision kernel accumulates in float32 internally, the
# op is safe in low precision: it becomes ``infer`` and runs low wherever its
# neighbours do (faster than casting around it), but is never forced low
# (memory-bound ops gain nothing from casts added just for them).
PROVIDER_CLASSES: MappingProxyType[str, MappingProxyType[OpKey, tuple[str, str]]] = MappingProxyType({
    "CUDAExecutionProvider": MappingProxyType({
        key: (INFER, f"CUDA's low-precision {key[1]} kernel accumulates in float32, so it is safe there")
        for key in _group("", "LayerNormalization", "SimplifiedLayerNormalization", "InstanceNormalization",
                          "Softmax", "LogSoftmax",
                          ms=("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "GroupNorm"))
    }),
})

# Deny ops whose only risk is range: where the range check measures their values (on
# generated inputs or calibration data), they become ``infer`` and run low wherever their
# neighbours do; MeasureRanges keeps one float32 where its measured values leave the low
# type's range, or where they were not measured. Without a measurement they stay deny, and
# so does one that a deny op reads (a norm's square, read by the ReduceMean of its variance:
# there an overflow on data the measurement did not see would collapse the statistic).
MEASURED_CLASSES: MappingProxyType[OpKey, tuple[str, str]] = MappingProxyType({
    key: (INFER, "power whose values the range check measures: low where they stay within range "
                 "(a tanh GELU's cube, a written-out norm's square)")
    for key in _group("", "Pow", "Reciprocal")
})

# Type parameters that stay float32 even where the schema allows low precision.
# Keyed by op: {type parameter: reason}.
KEEP_FP32_TYPE_PARAMS: MappingProxyType[OpKey, dict[str, str]] = MappingProxyType({
    ("", "Resize"): {"T2": "roi holds coordinates; float16 rounding moves them"},
    ("", "LayerNormalization"): {"U": "mean and inverse-std-dev statistics are float32 outputs"},
    ("", "Dropout"): {"T1": "the ratio is a scalar hyper-parameter"},
    ("", "BitCast"): {"T1": "reinterprets bits: the bit width is part of the op's contract",
                      "T2": "reinterprets bits: the bit width is part of the op's contract"},
})

# Ops whose output element type is fixed by an attribute; a low-precision
# coloring rewrites that attribute (an int data type, or a tensor's values).
RETYPED_BY_ATTRIBUTE: MappingProxyType[OpKey, str] = MappingProxyType({
    ("", "Cast"): "to",
    ("", "ConstantOfShape"): "value",
    ("", "EyeLike"): "dtype",
})

# Inputs at which an element flushed to zero turns into inf or NaN (log(0), x/0, 1/0):
# the range check keeps a value read there in float32 when any of its nonzero elements
# flushes to zero in the target type, on any data.
ZERO_SINGULAR_INPUTS: frozenset[tuple[OpKey, int]] = frozenset({
    (("", "Log"), 0), (("", "Div"), 1), (("", "Reciprocal"), 0),
})

# Ops whose output holds exactly the elements of their first input, reordered or
# reshaped: a range measured on one holds for the other, so the range check measures one.
SAME_ELEMENTS: frozenset[OpKey] = frozenset(
    _group("", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity"))

# The ends of a quantized node unit (DequantizeLinear -> op -> QuantizeLinear), which
# runtimes run as one integer kernel: the op between them keeps float32.
DEQUANTIZE: frozenset[OpKey] = frozenset(_group("", "DequantizeLinear", ms=("DequantizeLinear",)))
QUANTIZE: frozenset[OpKey] = frozenset(_group("", "QuantizeLinear", ms=("QuantizeLinear",)))

# Ops that own subgraphs: their own inputs and outputs keep their types, their
# bodies are colored with the rest of the model.
CONTROL_FLOW: frozenset[OpKey] = frozenset(_group("", "If", "Loop", "Scan", "SequenceMap"))


def check_disjoint() -> None:
    """Raise if an op is listed in two classes (run when a policy is built)."""
    seen: dict[OpKey, str] = {}
    for cls, ops in OP_CLASSES.items():
        for key in ops:
            if key in seen:
                domain, op = key
                raise ValueError(f"op {op} of domain {domain or 'ai.onnx'!r} is listed as both {seen[key]} and {cls}")
            seen[key] = cls
