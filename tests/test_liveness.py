"""``ir.liveness.planned``: kept bytes and the live set's peak, in graph order."""

from __future__ import annotations

from onnx import TensorProto, helper

from amp_rewrite.ir.liveness import planned


def test_the_peak_counts_every_value_from_its_node_to_its_last_reader() -> None:
    """a and b are read by the Add that makes c: three 1 KiB values live there, two after."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"], name="sum"), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])])
    found = planned(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), top=2)
    assert (found["kept"], found["peak"], found["at"], found["unknown"]) == (1024, 3072, "Add sum", 0)
    assert [size for _, size in found["largest"]] == [1024, 1024]
