"""Check a provider's kernel table against the installed ONNX Runtime (issue 10).

Each single-node case of the ONNX backend node tests is converted to the low type and run on
the provider, and the table's answer for its node compared with what the runtime ran
(``models/kernel_check.py``: how the runtime is asked, what counts as a fallback).

    python benchmarks/kernel_check.py --provider CPUExecutionProvider [--precision float16|bfloat16]
        [--out DIR] [--ops Op1,Op2]

Writes kernel_check-<provider>-<precision>.json and .md to --out (default
benchmarks/work/kernel_check/) and prints a summary last. The ops of one op type run in a
forked child, so an ONNX Runtime crash costs that op's cases ("fails"), not the run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import amp_rewrite  # noqa: E402
from amp_rewrite.ir.precision import Precision  # noqa: E402
from models.kernel_check import check, write  # noqa: E402

OUT = ROOT / "benchmarks" / "work" / "kernel_check"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", required=True, choices=["CPUExecutionProvider", "CUDAExecutionProvider"])
    parser.add_argument("--precision", default="float16", choices=[p.value for p in Precision])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--ops", default="", help="comma-separated op types (default: all)")
    parser.add_argument("--shard", default="0/1", metavar="K/N",
                        help="check only the K-th of every N op types (0-based), to run N processes side by side")
    args = parser.parse_args(argv)
    k, n = (int(part) for part in args.shard.split("/"))
    try:
        result = check(args.provider, args.precision, [op for op in args.ops.split(",") if op] or None,
                       shard=(k, n))
    except amp_rewrite.UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    json_path, md_path = write(result, args.out)
    for f in result.disagreements:
        print(f"disagree: {f.op} opset {f.opset} ({','.join(f.params)}): table says "
              f"{'low kernel' if f.table else 'no low kernel'}, runtime {f.runtime}: {f.case}: {f.seen}")
    print(f"written: {json_path}, {md_path}")
    print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
