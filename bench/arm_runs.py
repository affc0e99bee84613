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


def run_logged(label: str, cmd: list, log, env: dict) -> str:
    """Runs cmd with its output in LOG and returns that output; on failure shows its tail and stops."""
    import subprocess
    import sys
    from pathlib import Path
    print(f"bench: {label} (log {log})", file=sys.stderr)
    with open(log, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        sys.stderr.write(Path(log).read_text()[-4000:])
        raise SystemExit(f"bench: {label} failed")
    return Path(log).read_text()


def interleaved(arms: list[str], rounds_count: int, one_run) -> dict:
    """one_run(arm, round) for every arm in every round, A B C then C B A ... (drift hits every arm
    alike); {arm: [its results, round by round]}."""
    runs = {arm: [] for arm in arms}
    for r in range(1, rounds_count + 1):
        for arm in arms if r % 2 else list(reversed(arms)):
            runs[arm].append(one_run(arm, r))
    return runs


def bench_each_model(name: str, binary: str, bench_dir, models: list[str], bench_model, **header) -> None:
    """The bench scripts' main: checks the binary, runs bench_model(m) for each model in turn, and
    prints the last line, {"bench": name, **header, "models": [...]}."""
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"bench: no mmtrain binary at {binary} (build first: make build)")
    bench_dir.mkdir(parents=True, exist_ok=True)
    results = [bench_model(m) for m in models]
    print(json.dumps({"bench": name, **header, "models": results}))
