"""`python -m soak [--duration S] [--seed N] [--json FILE]`: the soak; exit 1 when a check fails.

The table is printed either way (stdout); `--json FILE` writes the whole report too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from soak.chaos import TARGETS
from soak.report import table
from soak.run import Options, soak


def parse(argv: list[str] | None) -> tuple[Options, Path | None]:
    parser = argparse.ArgumentParser(prog="python -m soak", description=__doc__)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load and kills (default 300)")
    parser.add_argument("--seed", type=int, default=1, help="the random choices' seed")
    parser.add_argument("--workers", type=int, default=4, help="concurrent writing/reading clients")
    parser.add_argument("--subscriptions", type=int, default=20, help="push subscriptions recording events")
    parser.add_argument("--kill-interval", type=float, default=5.0, help="mean seconds between kills")
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"what to kill (of {','.join(TARGETS)})")
    parser.add_argument("--space", default="hashing-16", help="the indexer's default space (minilm loads a model)")
    parser.add_argument("--json", type=Path, help="write the report as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary dir (run.log) after the soak")
    args = parser.parse_args(argv)
    targets = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    if unknown := sorted(set(targets) - set(TARGETS)):
        parser.error(f"unknown targets {unknown}")
    return Options(duration=args.duration, seed=args.seed, workers=args.workers, subscriptions=args.subscriptions,
                   kill_interval=args.kill_interval, targets=targets, space=args.space, keep=args.keep), args.json


def main(argv: list[str] | None = None) -> int:
    options, json_path = parse(argv)
    report = asyncio.run(soak(options))
    print(table(report), flush=True)
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
