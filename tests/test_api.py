"""The Python API: convert() returns the kind it was given and never edits its argument."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest

from amp_rewrite import ConvertOptions, Report, UserError, convert
from amp_rewrite.rewrite.report import REASON_WIDTH, _reason_kind
from models import builders
from tests.helpers import model


def test_model_proto_in_model_proto_out_and_argument_untouched() -> None:
    original = builders.transformer()
    before = original.SerializeToString()
    mixed, report = convert(original)
    assert isinstance(mixed, onnx.ModelProto) and isinstance(report, Report)
    assert original.SerializeToString() == before
    assert report.low_nodes == report.candidates


def test_path_in_path_out(tmp_path) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(builders.mlp(), source)
    result, report = convert(source, tmp_path / "out.onnx", ConvertOptions(precision="bfloat16"))
    assert result == tmp_path / "out.onnx"
    onnx.checker.check_model(str(result), full_check=True)
    assert report.precision == "bfloat16"


def test_onnx_ir_model_in_onnx_ir_model_out() -> None:
    model = ir.serde.deserialize_model(builders.mlp())
    mixed, report = convert(model, provider=None)
    assert isinstance(mixed, ir.Model)
    assert report.casts_inserted == 2
    onnx.checker.check_model(ir.serde.serialize_model(mixed), full_check=True)


@pytest.mark.parametrize("kwargs, message", [
    (dict(precision="float8"), "unknown precision"),
    (dict(provider="TPUExecutionProvider"), "unknown provider"),
    (dict(unknown_ops="ignore"), "unknown unknown_ops"),
    (dict(keep_fp32_nodes=["("]), "not a valid regular expression"),
    (dict(colour="red"), "unexpected keyword"),
])
def test_bad_options_raise_user_error(kwargs, message) -> None:
    with pytest.raises(UserError, match=message):
        convert(builders.mlp(), **kwargs)


def test_path_without_output_and_unknown_kinds_are_user_errors(tmp_path) -> None:
    with pytest.raises(UserError, match="output path is required"):
        convert(tmp_path / "m.onnx")
    with pytest.raises(UserError, match="cannot convert a dict"):
        convert({})


def test_proto_with_unloaded_external_data_is_refused(tmp_path) -> None:
    path = builders.save_with_external_data(builders.transformer(), tmp_path / "t.onnx")
    with pytest.raises(UserError, match="external data that is not loaded"):
        convert(onnx.load(path, load_external_data=False))


def test_summary_names_a_reason_whole_or_marks_it_cut() -> None:
    """A kernel reason keeps its opset; one too long for the summary line ends in "..."."""
    m = model("(float[2,3] x, float[2,3] y) => (float[2,3] z) { z = Add(x, y) }", opset=6)
    summary = convert(m, range_check="off")[1].summary()
    assert "CUDAExecutionProvider has no float16 kernel for Add at opset 6\n" in summary
    long = "value " + "'" + "a" * 80 + "' reached 1e9 on generated inputs, beyond 4094"
    assert _reason_kind(long).endswith(" ...") and len(_reason_kind(long)) <= REASON_WIDTH + 4
