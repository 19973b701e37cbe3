"""What the fuzz test (``tests/test_fuzz.py``) asks of a model and its conversion, shared with
``benchmarks/gpu_fuzz.py`` and ``benchmarks/torch_exports.py``: its outputs on ONNX Runtime's
CPU provider, whether the range check ran, and whether ONNX Runtime loads it at its default
optimizations. The random graphs themselves are ``models/fuzzgraphs.py``'s."""

from __future__ import annotations

import numpy as np
import onnx

from amp_rewrite import Report
from amp_rewrite.runtime import instrument
from amp_rewrite.runtime.isolate import NativeFailure, isolated

NOTHING_TO_MEASURE = "skipped: no value could change precision"
"""The range check's report when every node stays float32: it ran and had nothing to watch."""


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return instrument.session(model).run(None, feeds)


CRASHES = "crashes"
"""How ``load_failure`` says that ONNX Runtime crashed creating the session."""


def load_failure(model: onnx.ModelProto) -> str | None:
    """Why ONNX Runtime creates no session at its default optimizations, tried in a child process
    (``CRASHES (...)`` where it crashes there: ONNX Runtime 1.31.1's CPU provider segfaults
    optimizing some float16 Transpose -> MatMul pairs, which CUDA loads; ``refused (...)``);
    None where it loads."""
    try:
        isolated(lambda progress: instrument.session(model, optimize="all") and None, "onnxruntime (load check)")
    except NativeFailure as exc:
        return f"{CRASHES} ({exc})"
    except Exception as exc:  # e.g. ONNX Runtime's LayerNormFusion takes an integer Cast into a LayerNormalization
        return f"refused ({str(exc).splitlines()[0][:100]})"
    return None


def range_check_ran(report: Report) -> bool:
    return report.range_check.startswith("measured") or report.range_check == NOTHING_TO_MEASURE
