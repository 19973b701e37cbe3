"""Invariants of ``convert`` on random graphs (models/fuzzgraphs.py): it converts without an
exception to a valid model, which ONNX Runtime loads at its default optimizations wherever it
loads the float32 model so; the range check runs on every model that ONNX Runtime runs in
float32 (with no rule of ``inputs.dims`` failing on the way); and where it ran, on the inputs
it measured, no output element finite in float32 turns NaN/Inf in the converted model (run
with float16 storage emulated on CPU, as ``check`` does; both runs compute Sigmoid exactly,
as the range check measures it: ``with_exact_sigmoid``).

The two tests draw the same examples; apart, a failure of one does not end the search for
failures of the other. ``make test`` runs AMP_FUZZ_EXAMPLES (default 100) derandomized
examples; ``make fuzz`` runs many more from a random seed (AMP_FUZZ_RANDOM=1).
"""

from __future__ import annotations

import copy
import os

import numpy as np
import onnx
from hypothesis import HealthCheck, assume, given, settings

from amp_rewrite import convert
from amp_rewrite.inputs import samples
from amp_rewrite.runtime import expose
from amp_rewrite.runtime.emulate import emulated
from models.fuzz import CRASHES, load_failure, range_check_ran, run
from models.fuzzgraphs import Example, examples

EXAMPLES = int(os.environ.get("AMP_FUZZ_EXAMPLES", "100"))
RANDOM = os.environ.get("AMP_FUZZ_RANDOM", "") not in ("", "0")

fuzz_settings = settings(derandomize=not RANDOM, max_examples=EXAMPLES, deadline=None, print_blob=RANDOM,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def with_exact_sigmoid(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each Sigmoid computed exactly, as the range check measures it
    (``expose.exact_sigmoid``: ONNX Runtime's CPU Sigmoid is noise below about 1e-7)."""
    model = copy.deepcopy(model)
    expose.exact_sigmoid(model)
    return model


@fuzz_settings
@given(examples())
def test_random_graph_converts_validly_with_the_range_check(example: Example) -> None:
    run(example.model, example.feeds)  # the generator's promise: float32 runs on the feeds

    converted, report = convert(example.model)

    onnx.checker.check_model(converted, full_check=True)
    assert range_check_ran(report), \
        f"the range check did not run on a model onnxruntime runs in float32: {report.range_check}"
    assert not [note for note in report.notes if samples.IMPLIED_FAILED in note], report.notes
    if load_failure(example.model) is None:  # ONNX Runtime's fusions refuse some float32 models
        failure = load_failure(converted)
        assert failure is None or failure.startswith(CRASHES), f"ONNX Runtime: {failure}"


@fuzz_settings
@given(examples())
def test_random_graph_gains_no_nan_or_inf_where_the_range_check_ran(example: Example) -> None:
    expected = run(with_exact_sigmoid(example.model), example.feeds)
    converted, report = convert(example.model, inputs=[example.feeds])  # the check measures what we compare
    assume(range_check_ran(report))

    observed = run(with_exact_sigmoid(emulated(converted)), example.feeds)

    for info, want, got in zip(converted.graph.output, expected, observed):
        assert got.shape == want.shape, f"output {info.name}: shape {got.shape}, float32 gives {want.shape}"
        new = np.isfinite(want) & ~np.isfinite(got)
        assert not new.any(), (f"output {info.name}: {int(new.sum())} of {new.size} elements finite in float32 "
                               f"are NaN/Inf converted (e.g. float32 {want[new].flat[0]:.4g})\n{report.summary()}")
