"""python -m models OUTDIR: write every sample model (and one with external data) to OUTDIR."""

import sys
from pathlib import Path

import onnx

from .builders import SAMPLES, save_with_external_data, transformer

out = Path(sys.argv[1] if len(sys.argv) > 1 else "out/models")
out.mkdir(parents=True, exist_ok=True)
for name, build in SAMPLES.items():
    onnx.save(build(), out / f"{name}.onnx")
save_with_external_data(transformer(blocks=2), out / "transformer_external.onnx")
print(f"wrote {len(SAMPLES) + 1} sample models to {out}")
