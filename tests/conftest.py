import functools
import warnings

import pytest

from amp_rewrite.runtime import instrument

warnings.filterwarnings("ignore", category=RuntimeWarning, module="onnx.backend.test.case.node")


@pytest.fixture(autouse=True)
def _one_onnxruntime_thread(monkeypatch):
    """Sessions run single-threaded: the suite runs one worker per core, and ONNX Runtime's
    thread pools, spinning beside the other worker's, slowed it several-fold."""
    monkeypatch.setattr(instrument, "session", functools.partial(instrument.session, threads=1))
