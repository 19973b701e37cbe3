"""python -m models OUTDIR: write every sample model (and one with external data) to OUTDIR, and
scikit-learn's digits as digits_train.npz / digits_test.npz when scikit-learn is installed."""

import sys
from pathlib import Path

import onnx

from . import digits
from .builders import SAMPLES, save_with_external_data, transformer

out = Path(sys.argv[1] if len(sys.argv) > 1 else "out/models")
out.mkdir(parents=True, exist_ok=True)
for name, build in SAMPLES.items():
    onnx.save(build(), out / f"{name}.onnx")
save_with_external_data(transformer(blocks=2), out / "transformer_external.onnx")
print(f"wrote {len(SAMPLES) + 1} sample models to {out}")
try:
    train, test = digits.write(out)
    Path(train).replace(out / "digits_train.npz")
    Path(test).replace(out / "digits_test.npz")
    print(f"wrote scikit-learn's digits to {out / 'digits_train.npz'} and {out / 'digits_test.npz'}")
except ImportError:
    print("scikit-learn is not installed: no digits data (pip install scikit-learn)")
