"""Models declared at an IR version newer than the installed ONNX Runtime reads (onnx writes its
newest by default): every internal run uses the model declared at the newest version that runtime
reads, where the model's opsets allow it; the output keeps the input's version unless asked."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import amp_rewrite
from amp_rewrite import UserError
from amp_rewrite.cli import main
from amp_rewrite.ir import ir_versions
from amp_rewrite.runtime import instrument
from tests.helpers import colors, rng


def _newest_ir_classifier() -> onnx.ModelProto:
    """A two-layer classifier saved as onnx's helper saves it by default (its newest IR version),
    at opset 17; its first MatMul (and the Relu after it) overflow float16 on generated inputs."""
    weights = [numpy_helper.from_array(np.full((8, 16), 3000.0, np.float32), "w1"),
               numpy_helper.from_array(rng(1).normal(0, 1e-4, (16, 3)).astype(np.float32), "w2")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="big"), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["logits"], name="head")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_declared_version_is_read_and_rewritten_on_the_bytes() -> None:
    serialized = _newest_ir_classifier().SerializeToString()
    assert ir_versions.declared_ir_version(serialized) == onnx.IR_VERSION
    redeclared = ir_versions.declared_at(serialized, 9)
    assert ir_versions.declared_ir_version(redeclared) == onnx.IR_VERSION  # the leading field is left as it is
    assert onnx.ModelProto.FromString(redeclared).ir_version == 9  # the last one given counts
    assert ir_versions.needed_ir_version(_newest_ir_classifier()) == 8


def test_the_probed_version_is_the_one_onnxruntime_reads() -> None:
    import onnxruntime as ort

    newest = instrument.readable_ir_version()
    model = _newest_ir_classifier()
    model.ir_version = newest
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    if newest < onnx.IR_VERSION:  # the installed runtime is older than this onnx
        model.ir_version = newest + 1
        with pytest.raises(Exception, match="(?i)ir version"):
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        assert instrument.run(instrument.session(model), {"x": np.ones((2, 8), np.float32)})["logits"].shape == (2, 3)


@pytest.fixture(params=["installed", "older runtime"])
def runtime(request, monkeypatch) -> int:
    """The installed runtime, and one that reads up to the version before onnx's newest (what
    onnxruntime-gpu 1.31.1 is beside onnx 1.23): the second runs the redeclaring path wherever the
    installed runtime is new enough not to need it."""
    if request.param == "older runtime":
        monkeypatch.setattr(instrument, "readable_ir_version", lambda: onnx.IR_VERSION - 1)
    return instrument.readable_ir_version()


def test_convert_measures_ranges_and_keeps_the_ir_version(runtime) -> None:
    model = _newest_ir_classifier()
    out, report = amp_rewrite.convert(model, provider=None)
    assert report.range_check == "measured 3 values on generated inputs; 2 do not fit float16"
    assert colors(out)["big"] == "fp32"
    assert out.ir_version == model.ir_version == onnx.IR_VERSION
    redeclared = [n for n in report.notes if "its runs here used the model declared at IR version" in n]
    assert bool(redeclared) is (runtime < onnx.IR_VERSION)
    if redeclared:
        assert f"--ir-version {runtime} writes one that runtime loads" in redeclared[0]
    older, _ = amp_rewrite.convert(model, provider=None, ir_version=9)
    assert older.ir_version == 9
    onnx.checker.check_model(older, full_check=True)


def test_an_ir_version_the_opsets_cannot_have_is_refused() -> None:
    with pytest.raises(UserError, match=r"--ir-version 7: the model needs IR version 8 at least"):
        amp_rewrite.convert(_newest_ir_classifier(), provider=None, ir_version=7)
    with pytest.raises(UserError, match="ir_version must be between 3 and"):
        amp_rewrite.convert(_newest_ir_classifier(), provider=None, ir_version=onnx.IR_VERSION + 1)


def test_opsets_newer_than_the_runtime_reads_are_one_clear_error(monkeypatch) -> None:
    model = _newest_ir_classifier()
    monkeypatch.setattr(instrument, "readable_ir_version", lambda: 7)
    with pytest.raises(UserError, match="reads IR versions up to 7, and the model's opsets need IR version 8"):
        instrument.session(model)


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_check_and_train_run_such_a_model(precision, runtime, tmp_path) -> None:
    model = _newest_ir_classifier()
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(rng(0).normal(0, 0.3, (8, 16)).astype(np.float32),
                                                                "w1"))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    x = rng(2).normal(0, 1, (32, 8)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, labels=(x[:, 0] > 0).astype(np.int64))
    mixed = tmp_path / "m.mixed.onnx"
    assert main(["convert", str(path), "-o", str(mixed), "--provider", "none", "--quiet"]) == 0
    assert main(["check", str(path), str(mixed), "--random", "2"]) == 0
    notes = amp_rewrite.check(path, mixed, random=1).notes
    assert len(notes) == (2 if runtime < onnx.IR_VERSION else 0)
    assert all("its runs here used the model declared at IR version" in note for note in notes)
    trained = tmp_path / "t.onnx"
    assert main(["train", str(path), "--data", str(tmp_path / "d.npz"), "--loss", "cross-entropy", "--output",
                 "logits", "--labels", "labels", "--epochs", "2", "--precision", precision, "-o", str(trained),
                 "--quiet"]) == 0
    assert onnx.load(trained).ir_version == model.ir_version
