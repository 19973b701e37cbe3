"""Invariants of ``convert`` on random graphs (tests/fuzzgraphs.py): it converts without an
exception to a valid model; the range check runs on every model that ONNX Runtime runs in
float32; and where it ran, on the inputs it measured, no output element finite in float32
turns NaN/Inf in the converted model (run with float16 storage emulated on CPU, as ``check`` does;
both runs compute Sigmoid exactly, ``with_exact_sigmoid``).

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
from onnx import helper

from amp_rewrite import Report, convert
from amp_rewrite.ir.sizes import iter_graphs
from amp_rewrite.runtime import instrument
from amp_rewrite.runtime.emulate import emulated
from tests.fuzzgraphs import Example, examples

EXAMPLES = int(os.environ.get("AMP_FUZZ_EXAMPLES", "100"))
RANDOM = os.environ.get("AMP_FUZZ_RANDOM", "") not in ("", "0")
NOTHING_TO_MEASURE = "skipped: no value could change precision"
"""The range check's report when every node stays float32: it ran and had nothing to watch."""

fuzz_settings = settings(derandomize=not RANDOM, max_examples=EXAMPLES, deadline=None, print_blob=RANDOM,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return instrument.session(model).run(None, feeds)


def with_exact_sigmoid(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each Sigmoid computed as 1 / (1 + exp(-x)): ONNX Runtime's CPU Sigmoid
    is exact only to 2^-25 absolute, so below about 1e-7 its float32 results are noise (3e-8
    at -17.9999, 0 at -18 and at -17.2), and Log(Sigmoid(x)) there turns -inf or not with the
    last bits of x, in the float32 model as in any conversion of it. Its Exp is exact to 1e-7
    relative."""
    model = copy.deepcopy(model)
    for graph in iter_graphs(model.graph):
        nodes = []
        for node in graph.node:
            if node.op_type != "Sigmoid" or node.domain not in ("", "ai.onnx"):
                nodes.append(node)
                continue
            x, y, tmp = node.input[0], node.output[0], f"{node.output[0]}__exact_sigmoid"
            nodes += [helper.make_node("Constant", [], [f"{tmp}_one"], value_float=1.0),
                      helper.make_node("Neg", [x], [f"{tmp}_neg"]),
                      helper.make_node("Exp", [f"{tmp}_neg"], [f"{tmp}_exp"]),
                      helper.make_node("Add", [f"{tmp}_exp", f"{tmp}_one"], [f"{tmp}_sum"]),
                      helper.make_node("Reciprocal", [f"{tmp}_sum"], [y])]
        graph.ClearField("node")
        graph.node.extend(nodes)
    return model


def range_check_ran(report: Report) -> bool:
    return report.range_check.startswith("measured") or report.range_check == NOTHING_TO_MEASURE


@fuzz_settings
@given(examples())
def test_random_graph_converts_validly_with_the_range_check(example: Example) -> None:
    run(example.model, example.feeds)  # the generator's promise: float32 runs on the feeds

    converted, report = convert(example.model)

    onnx.checker.check_model(converted, full_check=True)
    assert range_check_ran(report), \
        f"the range check did not run on a model onnxruntime runs in float32: {report.range_check}"


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
