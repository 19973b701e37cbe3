"""The op lists and kernel tables as data: complete, disjoint, and read correctly."""

from __future__ import annotations

import onnx.defs
import pytest
from onnx import TensorProto, helper

import amp_rewrite
from amp_rewrite.ir.ort_schemas import ort_schema
from amp_rewrite.policy import oplists
from amp_rewrite.policy.classes import Policy
from amp_rewrite.policy.kernels import kernel_table
from tests import helpers

# Default-domain ops that touch float tensors but are deliberately absent from the lists.
UNLISTED = {
    "If": "control flow: bodies are colored, the node keeps its signature",
    "Loop": "control flow", "Scan": "control flow", "SequenceMap": "control flow",
    "Constant": "constants are converted offline, not colored",
    "RandomNormal": "no inputs: output type is its dtype attribute",
    "RandomUniform": "no inputs: output type is its dtype attribute",
    "ImageDecoder": "uint8 only",
    "QLinearConv": "quantized: its float inputs are scales of fixed type float",
    "QLinearMatMul": "quantized: its float inputs are scales of fixed type float",
    "TfIdfVectorizer": "its float output has a fixed type",
    "BitCast": "reinterprets bits: its type parameters stay float32 (KEEP_FP32_TYPE_PARAMS) under every policy",
}
SEQUENCE_OPS = {"ConcatFromSequence", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
                "SequenceInsert", "SequenceLength", "SplitToSequence"}


def _float_ops() -> set[str]:
    ops = set()
    for schema in onnx.defs.get_all_schemas():
        if schema.domain != "":
            continue
        types = {t for c in schema.type_constraints for t in c.allowed_type_strs}
        types |= {f.type_str for f in (*schema.inputs, *schema.outputs)}
        if "tensor(float16)" in types or "tensor(float)" in types:
            ops.add(schema.name)
    return ops


def test_every_float_op_of_the_default_domain_is_classified_or_explained() -> None:
    listed = {op for ops in oplists.OP_CLASSES.values() for domain, op in ops if domain == ""}
    missing = _float_ops() - listed - set(UNLISTED) - SEQUENCE_OPS
    assert not missing, f"ops with no class: {sorted(missing)}"


def test_classes_are_disjoint_and_every_op_has_a_reason() -> None:
    oplists.check_disjoint()
    assert all(reason for ops in oplists.OP_CLASSES.values() for reason in ops.values())


def test_every_listed_op_is_defined_in_its_domain() -> None:
    """Each key names a real op: of ONNX, or of ONNX Runtime (its contrib ops, SimplifiedLayerNormalization)."""
    keys = {key for ops in oplists.OP_CLASSES.values() for key in ops}
    keys |= {key for ops in oplists.PROVIDER_CLASSES.values() for key in ops}
    keys |= {*oplists.KEEP_FP32_TYPE_PARAMS, *oplists.RETYPED_BY_ATTRIBUTE, *oplists.CONTROL_FLOW}
    undefined = {(d, op) for d, op in keys if not onnx.defs.has(op, d) and ort_schema(d, op, 10**6) is None}
    assert not undefined, f"listed but defined in no domain: {sorted(undefined)}"


def test_provider_refinement_makes_accumulating_ops_infer_on_cuda_only() -> None:
    assert Policy("CUDAExecutionProvider").classify("", "Softmax").name == oplists.INFER
    assert Policy(None).classify("", "Softmax").name == oplists.DENY
    assert Policy(None, "all-low").classify("", "Softmax").name == oplists.ALLOW
    assert Policy(None, "all-low").classify("", "Reshape").name == oplists.CLEAR
    assert Policy("CUDAExecutionProvider").classify("com.microsoft", "SkipLayerNormalization").name == oplists.INFER
    assert Policy(None).classify("com.microsoft", "SkipLayerNormalization").name == oplists.DENY
    # ONNX Runtime's float16 EmbedLayerNormalization sums its statistics in float16: deny on CUDA too
    assert Policy("CUDAExecutionProvider").classify("com.microsoft", "EmbedLayerNormalization").name == oplists.DENY


def test_lists_are_keyed_by_domain_and_op() -> None:
    """A contrib op matches in com.microsoft only; ai.onnx is the default domain; an op of both has both."""
    policy = Policy(None)
    assert policy.classify("com.microsoft", "FusedMatMul").name == oplists.ALLOW
    assert policy.classify("", "FusedMatMul") is None
    assert policy.classify("com.example", "MatMul") is None
    assert policy.classify("ai.onnx", "MatMul").name == oplists.ALLOW
    assert policy.classify("", "RotaryEmbedding").name == policy.classify("com.microsoft", "RotaryEmbedding").name
    assert policy.classify("", "GroupNormalization").name == policy.classify("com.microsoft", "GroupNorm").name
    assert policy.classify("com.microsoft", "GroupNormalization") is None


def test_disjointness_is_checked_per_domain_and_op(monkeypatch) -> None:
    clashing = {**oplists.OP_CLASSES, oplists.CLEAR: {**oplists.OP_CLASSES[oplists.CLEAR],
                                                       ("com.microsoft", "FusedMatMul"): "clash"}}
    monkeypatch.setattr(oplists, "OP_CLASSES", clashing)
    with pytest.raises(ValueError, match="FusedMatMul of domain 'com.microsoft' is listed as both allow and clear"):
        oplists.check_disjoint()


def _fused_matmul_model(domain: str) -> onnx.ModelProto:
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], name="allow1", domain=domain, alpha=1.0)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [4, 8]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def test_contrib_op_of_com_microsoft_is_classified() -> None:
    """A com.microsoft FusedMatMul is an allow op (ONNX Runtime's schema gives its type parameters)."""
    options = amp_rewrite.ConvertOptions(provider="CUDAExecutionProvider", range_check="off")
    analysis = amp_rewrite.analyze(_fused_matmul_model("com.microsoft"), options)
    assert not analysis.unknown_ops
    [decision] = analysis.coloring.decisions.values()
    assert decision.op_class == oplists.ALLOW
    assert decision.reason.startswith("allow: matrix product")


def test_default_domain_node_named_like_a_contrib_op_is_not_matched() -> None:
    options = amp_rewrite.ConvertOptions(provider="CUDAExecutionProvider", range_check="off")
    analysis = amp_rewrite.analyze(_fused_matmul_model(""), options)
    assert analysis.unknown_ops == {"FusedMatMul": 1}
    assert not any(d.op_class == oplists.ALLOW for d in analysis.coloring.decisions.values())


def test_cuda_table_lookups_follow_opset_ranges_and_type_constraints() -> None:
    table = kernel_table("CUDAExecutionProvider")
    assert table.supports("", "MatMul", 13, "bfloat16", frozenset({"T"}))
    assert not table.supports("", "MatMul", 12, "bfloat16", frozenset({"T"}))
    assert table.supports("", "LayerNormalization", 17, "float16", frozenset({"T"}))
    assert not table.supports("", "LayerNormalization", 17, "float16", frozenset({"U"}))
    assert not table.supports("", "Range", 11, "float16", frozenset({"T"}))
    assert not table.supports("", "NoSuchOp", 17, "float16", frozenset({"T"}))


def test_a_function_without_a_kernel_has_one_where_every_op_of_its_inlined_body_has() -> None:
    """ONNX Runtime inlines Swish (opset 24) into Sigmoid and Mul: kernel_check saw it run in float16
    on CUDA, where both have float16 kernels, and through inserted casts on the CPU, where Sigmoid has none."""
    cuda, cpu = kernel_table("CUDAExecutionProvider"), kernel_table("CPUExecutionProvider")
    assert cuda.supports("", "Swish", 24, "float16", frozenset({"T"}))
    assert cuda.supports("", "Mish", 22, "bfloat16", frozenset({"T"}))
    assert not cpu.supports("", "Swish", 24, "float16", frozenset({"T"}))
    converted, _ = amp_rewrite.convert(helpers.model(
        "(float[4,8] x, float[8,8] w) => (float[4,8] y) { [mm] h = MatMul(x, w)\n [swish] y = Swish(h) }", opset=24),
        options=amp_rewrite.ConvertOptions(provider="CUDAExecutionProvider"))
    assert helpers.colors(converted) == {"mm": "low", "swish": "low"}


def test_cpu_table_is_available_whichever_onnxruntime_is_installed() -> None:
    table = kernel_table("CPUExecutionProvider")
    assert not table.supports("", "MatMul", 17, "float16", frozenset({"T"}))
    assert table.supports("", "Transpose", 17, "float16", frozenset({"T"}))
