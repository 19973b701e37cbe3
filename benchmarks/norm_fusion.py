"""Which ops ONNX Runtime runs of a written-out RMSNorm, float32 and as amp-rewrite converts it,
for each way exporters write its scaling (``models.builders.rms_decoder``, two blocks): the
optimized model ONNX Runtime saves, its op types counted. A diagnosis for a GPU machine:

    python benchmarks/norm_fusion.py [PROVIDER]     # default CUDAExecutionProvider
"""

from __future__ import annotations

import collections
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from amp_rewrite import convert  # noqa: E402
from models import builders  # noqa: E402

provider = sys.argv[1] if len(sys.argv) > 1 else "CUDAExecutionProvider"
for scaling in sorted(builders.RMS_SCALINGS):
    m = builders.rms_decoder(scaling)
    for label, model in (("float32", m), ("amp-rewrite", convert(m, range_check="off")[0])):
        path = tempfile.mktemp(suffix=".onnx")
        so = ort.SessionOptions()
        so.optimized_model_filepath = path
        s = ort.InferenceSession(model.SerializeToString(), so, providers=[provider])
        x = np.random.default_rng(0).normal(size=(2, 8, 16)).astype(np.float32)
        s.run(None, {"inp": x})
        ops = collections.Counter(n.op_type for n in onnx.load(path).graph.node)
        print(provider, scaling, label, dict(sorted(ops.items())))
