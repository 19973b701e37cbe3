"""Run a peer float16 converter the way its users do: load, convert (keep_io_types), save.

    python benchmarks/peer_convert.py occ|ort IN.onnx OUT.onnx

``occ`` is onnxconverter_common.float16.convert_float_to_float16, ``ort`` is
onnxruntime.transformers.float16.convert_float_to_float16. Neither writes a
model over 2 GB itself, so such output is saved here with external data.
"""

from __future__ import annotations

import sys

import onnx


def main(tool: str, source: str, target: str) -> None:
    model = onnx.load(source)
    if tool == "occ":
        from onnxconverter_common import float16
    else:
        from onnxruntime.transformers import float16
    converted = float16.convert_float_to_float16(model, keep_io_types=True)
    try:
        onnx.save(converted, target)
    except Exception as exc:  # noqa: BLE001 (over 2 GB protobuf refuses to serialize)
        print(f"saving with external data: {type(exc).__name__}", file=sys.stderr)
        onnx.save(converted, target, save_as_external_data=True, location=target.rsplit("/", 1)[-1] + ".data")


if __name__ == "__main__":
    main(*sys.argv[1:4])
