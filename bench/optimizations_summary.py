"""Summary of bench/magihuman_optimizations.sh: the seed's optimization table, one row per arm.

Reads D/bench_meta.json (WARMUP), D/gemm.json (`mmtrain measure gemm`) and D/runs/ARM_rK/metrics.jsonl.
Per arm, all rounds pooled, the iterations after WARMUP: step_ms (median step_time_ms), flops per
rank and step (the model's, from tflops_per_device x step time), mfu (those FLOPs over the step
time, against the GEMM peak), speedup over the first arm (its step_ms over this arm's), peak_rss_mb,
phases_ms (median per phase) and loss_rel_diff: the first round's loss curve against the first
arm's, sum|a-b|/sum|b|.
"""
from __future__ import annotations

import json
import os
import statistics
import sys

from arm_runs import arm_summary_args, median, metrics, rounds

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "parity"))

import mmtrain_util as mu  # noqa: E402


def _arm(d: str, arm: str, warmup: int, peak: float) -> dict:
    runs = [metrics(run) for run in rounds(d, arm)]
    if not runs:
        raise SystemExit(f"no runs of arm {arm!r} under {d}/runs")
    measured = [m for run in runs for m in run if m["iteration"] > warmup]
    step_ms = statistics.median(m["step_time_ms"] for m in measured)
    flops = statistics.median(m["tflops_per_device"] * 1e12 * m["step_time_ms"] / 1000.0 for m in measured)
    return {"step_ms": round(step_ms, 1), "flops_per_rank_step": round(flops), "mfu": round(flops / (step_ms / 1000.0) / peak, 4),
            "peak_rss_mb": max(m["peak_rss_mb"] for run in runs for m in run),
            "phases_ms": {p: median([m["phases_ms"][p] for m in measured]) for p in measured[0]["phases_ms"]},
            "losses": [m["loss"] for m in runs[0]]}


def main() -> None:
    args, meta = arm_summary_args(__doc__)
    peak = json.load(open(os.path.join(args.dir, "gemm.json")))["gemm_flops"]
    rows = {arm: _arm(args.dir, arm, meta["WARMUP"], peak) for arm in args.arms}
    base_ms, base_losses = rows[args.arms[0]]["step_ms"], rows[args.arms[0]]["losses"]
    for row in rows.values():
        row["speedup"] = round(base_ms / row["step_ms"], 3)
        row["loss_rel_diff"] = mu.curve_rel_diff(row.pop("losses"), base_losses)
    print(f"GEMM peak {peak / 1e9:.1f} GFLOP/s ({meta['PARAM_DTYPE']}, 1 thread)")
    for arm, row in rows.items():
        print(f"{arm:20s} step {row['step_ms']:9.1f} ms  MFU {100 * row['mfu']:5.1f} %  x{row['speedup']:.3f}  "
              f"RSS {row['peak_rss_mb']:.0f} MB  loss vs {args.arms[0]} {row['loss_rel_diff']:.2e}")
    print(json.dumps({"bench": "magihuman_optimizations", **meta, "gemm_peak_flops": peak, "arms": rows},
                     separators=(",", ":")))


if __name__ == "__main__":
    main()
