"""RNN, GRU and LSTM unrolled into their ops compute what ONNX Runtime's kernels compute, in every
direction, with and without biases, initial states, sequence lengths and batch-first layout; the
unrolled graphs' gradients match finite differences; a model with an LSTM trains."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.autodiff.context import DynamicShapes
from amp_rewrite.autodiff.lowerings.recurrent import GATES, unrolled
from amp_rewrite.cli import main
from tests.gradcheck import directional_check, ort_run, with_loss
from tests.helpers import rng

T, N, FEATURES, H = 5, 3, 4, 6


def _recurrent(op: str, direction: str = "forward", bias: bool = True, initial: bool = False,
               lengths: bool = False, layout: int = 0, lbr: int = 0, steps=T) -> onnx.ModelProto:
    d = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    inits = [numpy_helper.from_array(rng(1).normal(0, 0.4, (d, g * H, FEATURES)).astype(np.float32), "W"),
             numpy_helper.from_array(rng(2).normal(0, 0.4, (d, g * H, H)).astype(np.float32), "R")]
    names = ["x", "W", "R", "", "", "", ""][:7 if op == "LSTM" else 6]
    if bias:
        inits.append(numpy_helper.from_array(rng(3).normal(0, 0.4, (d, 2 * g * H)).astype(np.float32), "B"))
        names[3] = "B"
    if lengths:
        inits.append(numpy_helper.from_array(np.array([T, 2, 4], np.int32), "lens"))
        names[4] = "lens"
    if initial:  # [D, N, H], batch first [N, D, H]
        for seed, name, slot in ((4, "h0", 5), (5, "c0", 6))[:2 if op == "LSTM" else 1]:
            state = rng(seed).normal(0, 0.5, (d, N, H)).astype(np.float32)
            inits.append(numpy_helper.from_array(state.transpose(1, 0, 2).copy() if layout else state, name))
            names[slot] = name
    outs = ["y", "y_h", "y_c"][:3 if op == "LSTM" else 2]
    attrs = {"hidden_size": H, "direction": direction}
    if layout:
        attrs["layout"] = 1
    if op == "GRU" and lbr:
        attrs["linear_before_reset"] = 1
    node = helper.make_node(op, names, outs, name="rec", **attrs)
    shape = [N, steps, FEATURES] if layout else [steps, N, FEATURES]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


def _x(layout: int = 0) -> np.ndarray:
    x = rng(6).normal(0, 1, (T, N, FEATURES)).astype(np.float32)
    return x.transpose(1, 0, 2).copy() if layout else x


CASES = [("RNN", "forward", True, False, False, 0, 0), ("RNN", "bidirectional", False, True, False, 0, 0),
         ("GRU", "forward", True, True, False, 0, 0), ("GRU", "reverse", True, False, False, 0, 1),
         ("GRU", "bidirectional", True, True, False, 1, 1), ("GRU", "forward", True, False, True, 0, 0),
         ("LSTM", "forward", True, True, True, 0, 0), ("LSTM", "reverse", False, False, False, 0, 0),
         ("LSTM", "bidirectional", True, True, False, 0, 0), ("LSTM", "bidirectional", True, False, False, 1, 0),
         ("GRU", "reverse", True, True, True, 0, 0), ("LSTM", "bidirectional", True, True, True, 0, 0),
         ("RNN", "bidirectional", True, False, True, 0, 0)]


@pytest.mark.parametrize("op, direction, bias, initial, lengths, layout, lbr", CASES)
def test_the_unrolled_graph_computes_what_onnxruntime_computes(op, direction, bias, initial, lengths, layout,
                                                                lbr) -> None:
    model = _recurrent(op, direction, bias, initial, lengths, layout, lbr)
    outs = [o.name for o in model.graph.output]
    if layout:  # ONNX Runtime's CPU kernels refuse batch-first layouts: the time-first model, transposed
        time_first = ort_run(_recurrent(op, direction, bias, initial, lengths, 0, lbr), {"x": _x(0)}, outs)
        want = {o: v.transpose(2, 0, 1, 3) if v.ndim == 4 else v.transpose(1, 0, 2) for o, v in time_first.items()}
    else:
        want = ort_run(model, {"x": _x(layout)}, outs)
    flat = onnx.ModelProto.FromString(model.SerializeToString())
    assert unrolled(flat) == ["rec"] and op not in {n.op_type for n in flat.graph.node}
    got = ort_run(flat, {"x": _x(layout)}, outs)
    for name in outs:
        assert got[name].shape == want[name].shape, name
        assert np.allclose(got[name], want[name], atol=1e-5), (name, np.abs(got[name] - want[name]).max())


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("lengths", [False, True], ids=["full", "sequence-lens"])
def test_the_unrolled_gradients_match_finite_differences(op, lengths) -> None:
    model = _recurrent(op, "bidirectional", initial=True, lengths=lengths)
    unrolled(model)
    feeds = {"x": _x()}
    weights = ["W", "R", "B", "h0"]
    directional_check(with_loss(model, feeds), feeds, weights)


def test_a_sequence_of_unknown_length_asks_for_specialization() -> None:
    with pytest.raises(DynamicShapes, match="its sequence length is not static"):
        unrolled(_recurrent("LSTM", steps="T"))


def test_train_fine_tunes_an_lstm_tagger(tmp_path) -> None:
    """x[T,N,4] -> LSTM(6) -> y[T,1,N,6] summed over the direction's axis: an mse fine-tune, the
    sequence length symbolic in the model and fixed by the data."""
    model = _recurrent("LSTM", steps="T")
    del model.graph.output[1:]
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    x = rng(7).normal(0, 1, (T, 16, FEATURES)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, labels=np.zeros((T, 1, 16, H), np.float32))
    for precision in ("float32", "float16"):
        assert main(["train", str(path), "--data", str(tmp_path / "d.npz"), "--batch-axis", "x:1", "--batch-axis",
                     "labels:2", "--loss", "mse", "--output", "y", "--lr", "1e-2", "--epochs", "3", "--batch-size",
                     "8", "--precision", precision, "-o", str(tmp_path / "t.onnx"), "--quiet"]) == 0
    trained = onnx.load(tmp_path / "t.onnx")
    assert [n.op_type for n in trained.graph.node] == ["LSTM"]
