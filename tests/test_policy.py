"""The op lists and kernel tables as data: complete, disjoint, and read correctly."""

from __future__ import annotations

import onnx.defs

from amp_rewrite.policy import oplists
from amp_rewrite.policy.classes import Policy
from amp_rewrite.policy.kernels import kernel_table

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
    listed = {op for ops in oplists.OP_CLASSES.values() for op in ops}
    missing = _float_ops() - listed - set(UNLISTED) - SEQUENCE_OPS
    assert not missing, f"ops with no class: {sorted(missing)}"


def test_classes_are_disjoint_and_every_op_has_a_reason() -> None:
    oplists.check_disjoint()
    assert all(reason for ops in oplists.OP_CLASSES.values() for reason in ops.values())


def test_provider_refinement_makes_accumulating_ops_infer_on_cuda_only() -> None:
    assert Policy("CUDAExecutionProvider").classify("Softmax").name == oplists.INFER
    assert Policy(None).classify("Softmax").name == oplists.DENY
    assert Policy(None, "all-low").classify("Softmax").name == oplists.ALLOW
    assert Policy(None, "all-low").classify("Reshape").name == oplists.CLEAR


def test_cuda_table_lookups_follow_opset_ranges_and_type_constraints() -> None:
    table = kernel_table("CUDAExecutionProvider")
    assert table.supports("", "MatMul", 13, "bfloat16", frozenset({"T"}))
    assert not table.supports("", "MatMul", 12, "bfloat16", frozenset({"T"}))
    assert table.supports("", "LayerNormalization", 17, "float16", frozenset({"T"}))
    assert not table.supports("", "LayerNormalization", 17, "float16", frozenset({"U"}))
    assert not table.supports("", "Range", 11, "float16", frozenset({"T"}))
    assert not table.supports("", "NoSuchOp", 17, "float16", frozenset({"T"}))


def test_cpu_table_is_available_whichever_onnxruntime_is_installed() -> None:
    table = kernel_table("CPUExecutionProvider")
    assert not table.supports("", "MatMul", 17, "float16", frozenset({"T"}))
    assert table.supports("", "Transpose", 17, "float16", frozenset({"T"}))
