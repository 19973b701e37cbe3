"""Every conversion decision on the bundled models and the external suites, to compare two
versions of amp-rewrite ("the decisions are unchanged or better"):

    python benchmarks/decisions.py --out before.json      (on one commit)
    python benchmarks/decisions.py --out after.json       (on another)
    python benchmarks/decisions.py --compare before.json after.json

The snapshot and the compare are ``models/decisions.py``'s (which models, what each holds).
``--compare`` prints the models whose decisions differ (precisions first) and exits 1 when any do.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from models import decisions  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(path.read_text()) for path in args.compare)
        lines = decisions.compare(before, after)
        print("\n".join(lines) or "no differences", f"({len(before)} models before, {len(after)} after)", sep="\n")
        return 1 if lines else 0
    if args.out is None:
        parser.error("give --out FILE or --compare BEFORE AFTER")
    snapshot = decisions.snapshot()
    args.out.write_text(json.dumps(snapshot, indent=0, sort_keys=True))
    print(f"wrote the decisions on {len(snapshot)} models to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
