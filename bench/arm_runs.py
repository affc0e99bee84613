"""The runs bench/bench_arms.sh's run_rounds leaves: D/runs/ARM_rK/metrics.jsonl and D/runs/ARM_rK.log."""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics


def rounds(d: str, arm: str) -> list[str]:
    """The run directories of one arm, round by round."""
    runs = os.path.join(d, "runs")
    names = sorted(n for n in os.listdir(runs) if re.fullmatch(rf"{arm}_r\d+", n))
    return [os.path.join(runs, n) for n in names]


def metrics(run: str) -> list[dict]:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def arm_summary_args(doc: str) -> tuple[argparse.Namespace, dict]:
    """An arm summary's command line (--dir D --arms ARM...; doc's first line is its description)
    and D/bench_meta.json, the knobs its bench script wrote."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--arms", nargs="+", required=True)
    args = parser.parse_args()
    with open(os.path.join(args.dir, "bench_meta.json")) as f:
        return args, json.load(f)


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None
