"""Accuracy-driven conversion: ``convert --validate`` against onnxconverter-common's
``auto_convert_mixed_precision``, on the same models, samples and tolerance.

For each tool: model runs and ONNX Runtime sessions it needed, seconds, the share of
float nodes left in low precision, and the final error, measured the same way for
both with ``amp_rewrite.check`` emulating float16 (the peer validates on the CPU
provider, which computes float16 nodes in float32). Writes the "Validation" section
of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import amp_rewrite  # noqa: E402
from amp_rewrite.inputs import samples  # noqa: E402
from benchmarks import results  # noqa: E402
from models import builders  # noqa: E402

RTOL = ATOL = 1e-2
SECTION = "## Validation"


def _transformer() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    model = builders.transformer(blocks=4)
    return model, samples.generate(model, seed=3)[0]


MODELS = {**builders.FRAGILE, "transformer, 4 blocks": _transformer}


class Counter:
    """Counts ONNX Runtime sessions and runs made inside a block."""

    def __enter__(self) -> Counter:
        import onnxruntime as ort

        self.sessions = self.runs = 0
        self._original = ort.InferenceSession
        counter = self

        class Counted(ort.InferenceSession):
            def __init__(self, *args, **kwargs):
                counter.sessions += 1
                super().__init__(*args, **kwargs)

            def run(self, *args, **kwargs):
                counter.runs += 1
                return super().run(*args, **kwargs)

        ort.InferenceSession = Counted
        return self

    def __exit__(self, *exc) -> None:
        import onnxruntime as ort

        ort.InferenceSession = self._original


def low_share(model: onnx.ModelProto) -> float:
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    float_nodes = [n for n in model.graph.node if n.op_type != "Cast" and n.output
                   and types.get(n.output[0]) in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)]
    low = [n for n in float_nodes if types.get(n.output[0]) == onnx.TensorProto.FLOAT16]
    return len(low) / len(float_nodes) if float_nodes else 0.0


def run_tool(tool: str, model: onnx.ModelProto, sample: dict) -> dict:
    started = time.perf_counter()
    with Counter() as counted, contextlib.redirect_stdout(io.StringIO()):
        if tool == "amp-rewrite":  # its sessions run in child processes, where the counter does not reach
            converted, report = amp_rewrite.convert(model, policy="all-low", validate=[sample],
                                                    tolerance=amp_rewrite.Tolerance(RTOL, ATOL))
            counted.runs, counted.sessions = report.validation.runs, report.validation.sessions
        else:
            from onnxconverter_common import auto_mixed_precision

            converted = auto_mixed_precision.auto_convert_mixed_precision(model, sample, rtol=RTOL, atol=ATOL,
                                                                          keep_io_types=True)
    seconds = time.perf_counter() - started
    result = amp_rewrite.check(model, converted, inputs=[sample], tolerance=amp_rewrite.Tolerance(RTOL, ATOL))
    errors = result.outputs[0].errors
    return dict(runs=counted.runs, sessions=counted.sessions, seconds=seconds, low=low_share(converted),
                rel_l2=errors.rel_l2, nonfinite=errors.new_nonfinite, passed=bool(result))


def main() -> None:
    lines = [SECTION, "", results.machine() + ".", "",
             "`python benchmarks/validate_bench.py` (part of `make bench`). Same model, sample and "
             f"tolerance (elementwise rtol={RTOL:g}, atol={ATOL:g}) for both tools; amp-rewrite starts from the "
             "all-low policy, as the peer does. Model runs and sessions: amp-rewrite's from its report (float32 "
             "once, one emulated run per round, the last round once more as deployed), the peer's counted. Final "
             "error: `amp_rewrite.check` (float16 emulated on the CPU, and the model as deployed). The peer "
             "validates on the CPU provider, which computes float16 nodes in float32, so it accepts broken "
             "candidates and its bisection never starts here.", "",
             "| model | tool | model runs | sessions | seconds | nodes low | final rel L2 | new NaN/Inf | "
             "passes check |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, build in MODELS.items():
        model, sample = build()
        for tool in ("amp-rewrite", "auto_convert_mixed_precision"):
            try:
                r = run_tool(tool, model, sample)
            except Exception as exc:  # noqa: BLE001 (a peer failure is a result)
                lines.append(f"| {name} | {tool} | | | | | | | failed: {type(exc).__name__}: {str(exc)[:80]} |")
                continue
            lines.append(f"| {name} | {tool} | {r['runs']} | {r['sessions']} | {r['seconds']:.2f} | "
                         f"{r['low']:.0%} | {r['rel_l2']:.3g} | {r['nonfinite']} | {'yes' if r['passed'] else 'no'} |")
            print(lines[-1], flush=True)
    results.write(sections={SECTION.removeprefix("## "): lines[2:]})


if __name__ == "__main__":
    main()
