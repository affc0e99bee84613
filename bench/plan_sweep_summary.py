"""Summary of bench/plan_sweep.sh: the plan's predictions against the runs they predicted.

Reads D/runs/NAME/metrics.jsonl (measured step times after the first, warm-up iteration; the
largest peak RSS and its prediction), D/runs/NAME/plan.json (the uncalibrated prediction) and
D/runs/NAME.calibrated_plan.json (`mmtrain plan --device calibrated.json` for the same overrides).
Runs 1, 3, 5, ... calibrated the profile; 2, 4, 6, ... are held out. Prints a table and one JSON
line: spearman (calibrated predictions against measured, all runs; target >= 0.8),
held_out_median_abs_error (target <= 0.2), worst_peak_rss_ratio (measured / predicted, the one
furthest from 1; target within 10 %).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var > 0 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--runs", nargs="+", required=True)
    args = parser.parse_args()
    rows = []
    for i, name in enumerate(args.runs):
        run = os.path.join(args.dir, "runs", name)
        records = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl")) if line.strip()]
        steps = [r["step_time_ms"] for r in records if r["iteration"] > 1]
        plan = json.load(open(os.path.join(run, "plan.json")))
        calibrated = json.load(open(run + ".calibrated_plan.json"))["step_time"]["total_ms"]
        peak = max(r["peak_rss_mb"] for r in records)
        rows.append({"run": name, "held_out": i % 2 == 1, "measured_ms": statistics.median(steps),
                     "predicted_ms": plan["step_time"]["total_ms"], "calibrated_ms": calibrated,
                     "peak_rss_mb": peak, "predicted_peak_rss_mb": plan["predicted_peak_rss_mb"]})
    print(f"{'run':24s} {'measured':>9s} {'predicted':>10s} {'calibrated':>11s} {'peak RSS':>9s} {'predicted':>10s}")
    for r in rows:
        print(f"{r['run'] + (' *' if r['held_out'] else ''):24s} {r['measured_ms']:9.0f} {r['predicted_ms']:10.0f} "
              f"{r['calibrated_ms']:11.0f} {r['peak_rss_mb']:9.0f} {r['predicted_peak_rss_mb']:10.0f}")
    print("(* held out of the calibration; ms and MB)")
    held = [r for r in rows if r["held_out"]]
    out = {
        "runs": len(rows),
        "spearman": spearman([r["calibrated_ms"] for r in rows], [r["measured_ms"] for r in rows]),
        "held_out_median_abs_error": statistics.median(
            abs(r["calibrated_ms"] - r["measured_ms"]) / r["measured_ms"] for r in held) if held else None,
        "uncalibrated_median_abs_error": statistics.median(
            abs(r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"] for r in rows),
        "worst_peak_rss_ratio": max((r["peak_rss_mb"] / r["predicted_peak_rss_mb"] for r in rows),
                                    key=lambda x: abs(x - 1.0)),
        "rows": rows,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
