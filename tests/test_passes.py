"""The pass interface: every pass states its invariant, runs on one context and says what it
changed; the pipeline runs each stage's passes in the numbered order and times each by name;
each pass reads only its part of the options."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import onnx
import pytest

from amp_rewrite import ConvertOptions, convert
from amp_rewrite.ir.graph import ModelIndex
from amp_rewrite.ir.precision import Precision
from amp_rewrite.rewrite import passes
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.options import ColoringOptions, MeasurementOptions, OutputOptions, ValidationOptions
from amp_rewrite.rewrite.passes import Pass, PassResult, Rewrite
from amp_rewrite.rewrite.pipeline import analysis_passes, model_passes, rewrite_passes, run_passes
from tests.helpers import model

OPTIONS = ConvertOptions(provider=None, range_check="off").validated()
NUMBERED = ["InlineFunctions", "UpgradeOpset", "InferTypes", "FindCandidates", "ColorByPolicy", "KeepResidualStream",
            "KeepUnfitConstants",
            "KeepTruncatedValues", "KeepQuantizedUnits", "MeasureRanges", "PropagateDeny", "KeepRmsEpsilons",
            "ChooseMinCasts", "InsertCasts", "SeparateNormCasts", "DeclareInferredShapes"]


def _stages(options: ConvertOptions = OPTIONS) -> list[Pass]:
    return [*model_passes(options), *analysis_passes(options), *rewrite_passes()]


def test_the_pipeline_runs_every_pass_in_the_numbered_order():
    classes = {cls.__name__ for _, cls in inspect.getmembers(passes, inspect.isclass)
               if issubclass(cls, Pass) and cls is not Pass}
    assert [step.name for step in _stages()] == NUMBERED
    assert classes == set(NUMBERED)


@pytest.mark.parametrize("step", _stages(), ids=lambda step: step.name)
def test_every_pass_states_its_invariant(step: Pass):
    assert (type(step).__doc__ or "").startswith("Invariant: ")


class _Noting(Pass[list]):
    """Invariant: the context ends with the pass's word."""

    def __init__(self, word: str) -> None:
        self.word = word

    def run(self, context: list) -> PassResult:
        changed = not context or context[-1] != self.word
        if changed:
            context.append(self.word)
        return PassResult(changed, (f"{self.word} noted",) if changed else ())


def test_run_passes_times_each_pass_by_name_and_keeps_their_notes_in_order():
    seconds = {"Earlier": 1.0}
    context: list[str] = []
    result = run_passes([_Noting("a"), _Noting("b")], context, seconds)
    assert result == PassResult(True, ("a noted", "b noted")) and context == ["a", "b"]
    assert set(seconds) == {"Earlier", "_Noting"} and seconds["_Noting"] >= 0
    again = run_passes([_Noting("b")], context, seconds)
    assert again == PassResult(False) and context == ["a", "b"]


def _analysed(m: onnx.ModelProto) -> tuple[Rewrite, list[PassResult]]:
    analysis = Analysis(ModelIndex(m), OPTIONS)
    results = [step.run(analysis) for step in analysis_passes(OPTIONS)]
    rewrite = Rewrite(analysis)
    results += [step.run(rewrite) for step in rewrite_passes()]
    return rewrite, results


def test_no_pass_changes_a_graph_with_nothing_to_convert():
    m = model("(int64[4] x) => (int64[4] y) { y = Add(x, x) }")
    before = m.SerializeToString()
    rewrite, results = _analysed(m)
    assert not any(r.changed for r in results) and not any(r.notes for r in results)
    assert rewrite.stats.edits == 0 and m.SerializeToString() == before


def test_the_passes_that_color_and_edit_say_so():
    m = model("(float[2,4] x) => (float[2,4] y) { h = MatMul(x, w) \n r = Relu(h) \n y = Exp(r) }",
              {"w": np.ones((4, 4), np.float32)})
    rewrite, results = _analysed(m)
    changed = {step.name for step, r in zip([*analysis_passes(OPTIONS), *rewrite_passes()], results) if r.changed}
    assert {"FindCandidates", "ColorByPolicy", "ChooseMinCasts", "InsertCasts"} <= changed
    assert "KeepTruncatedValues" not in changed and rewrite.stats.casts > 0


def test_a_converted_model_reports_the_same_stages():
    m = model("(float[2,4] x) => (float[2,4] y) { y = MatMul(x, w) }", {"w": np.ones((4, 4), np.float32)})
    _, report = convert(m, provider=None, range_check="off")
    assert list(report.stages) == ["load", "analysis", "range check", "rewrite", "save"]


def test_every_option_belongs_to_one_concern():
    """Each flat field of ConvertOptions is in exactly one view; the target precision is in each
    view that judges against it."""
    owners: dict[str, list[str]] = {}
    for view in (ColoringOptions, MeasurementOptions, ValidationOptions, OutputOptions):
        for f in dataclasses.fields(view):
            owners.setdefault(f.name, []).append(view.__name__)
    assert set(owners) == {f.name for f in dataclasses.fields(ConvertOptions)}
    assert {name for name, views in owners.items() if len(views) > 1} == {"precision"}


def test_the_views_hold_the_validated_values():
    options = ConvertOptions(precision="bfloat16", shapes={"x": [1, 2]}, headroom=4.0, opset=17,
                             keep_fp32_ops=["Add"]).validated()
    assert options.coloring.precision is options.measurement.precision is Precision.BFLOAT16
    assert options.coloring.keep_fp32_ops == ["Add"] and options.measurement.shapes == {"x": (1, 2)}
    assert options.measurement.range_check == "on" and options.measurement.headroom == 4.0
    assert options.output == OutputOptions(ir_version=None, opset=17)
    assert options.validation.tolerance == options.tolerance
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.coloring.provider = "CPUExecutionProvider"  # type: ignore[misc]
    changed = dataclasses.replace(options, headroom=8.0)
    assert changed.measurement.headroom == 8.0 and options.measurement.headroom == 4.0
