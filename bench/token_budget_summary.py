"""Summary of bench/token_budget.sh: fixed-size against token-budget micro-batches, one row per arm.

Reads D/bench_meta.json (WARMUP) and D/runs/ARM_rK/metrics.jsonl. Per arm, all rounds pooled, the
iterations after WARMUP: step_ms (median step_time_ms), comm_wait_ms (median of the step's
comm_wait, max over ranks: the rank that waited longest for the others), compute_ms (forward +
backward less comm_wait, from the per-phase maxima over ranks), peak_rss_mb (the run's, max over
ranks and rounds), dp_work_imbalance and
dp_compute_imbalance (medians, max / mean over ranks), dp_work_imbalance_bound (the best any
split reaches: samples for token-budget arms, micro-batches for fixed ones), budget_fill and
micro_batches (token-budget arms). Gains over each fixed-size arm that ran ("fixed", "fixed_wide"):
comm_wait and step time reductions of the other arms; fixed_repeat against fixed is the noise floor.
"""
from __future__ import annotations

import json
import statistics

from arm_runs import arm_summary_args, median, metrics, rounds


def _median_of(measured: list[dict], key: str) -> float | None:
    values = [m[key] for m in measured if key in m]
    return round(statistics.median(values), 3) if values else None


def _arm(d: str, arm: str, warmup: int) -> dict:
    runs = [metrics(run) for run in rounds(d, arm)]
    if not runs:
        raise SystemExit(f"no runs of arm {arm!r} under {d}/runs")
    measured = [m for run in runs for m in run if m["iteration"] > warmup]
    row = {"step_ms": median([m["step_time_ms"] for m in measured]),
           "comm_wait_ms": median([m["phases_max_ms"]["comm_wait"] for m in measured]),
           "compute_ms": median([m["phases_max_ms"]["forward"] + m["phases_max_ms"]["backward"]
                                 - m["phases_max_ms"]["comm_wait"] for m in measured]),
           "peak_rss_mb": max(m["peak_rss_mb"] for run in runs for m in run)}
    for key in ("dp_work_imbalance", "dp_compute_imbalance", "dp_work_imbalance_bound", "budget_fill", "micro_batches"):
        row[key] = _median_of(measured, key)
    row["losses"] = [m["loss"] for m in runs[0]]
    return row


def _reduction(control: float, arm: float) -> float:
    return round(1.0 - arm / control, 3) if control else 0.0


def main() -> None:
    args, meta = arm_summary_args(__doc__)
    rows = {arm: _arm(args.dir, arm, meta["WARMUP"]) for arm in args.arms}
    gains = {}
    for control_arm in ("fixed", "fixed_wide"):
        if control_arm not in rows:
            continue
        control = rows[control_arm]
        gains[control_arm] = {
            arm: {"comm_wait_reduction": _reduction(control["comm_wait_ms"], row["comm_wait_ms"]),
                  "step_time_reduction": _reduction(control["step_ms"], row["step_ms"])}
            for arm, row in rows.items() if arm != control_arm}
    print(f"{meta['MODEL']}: {meta['GLOBAL']} samples per step on {meta['WORLD']} ranks, budget {meta['BUDGET']} tokens")
    for arm, row in rows.items():
        extra = (f"  fill {row['budget_fill']:.2f}  micro-batches {row['micro_batches']:.0f}"
                 if row["budget_fill"] is not None else "")
        print(f"{arm:13s} step {row['step_ms']:8.1f} ms  comm_wait {row['comm_wait_ms']:8.1f} ms  "
              f"work imbalance {row['dp_work_imbalance']:.3f} (bound {row['dp_work_imbalance_bound']:.3f})  "
              f"compute imbalance {row['dp_compute_imbalance']:.3f}  RSS {row['peak_rss_mb']:.0f} MB{extra}")
    for control_arm, against in gains.items():
        for arm, gain in against.items():
            print(f"{arm:13s} vs {control_arm}: comm_wait {-100 * gain['comm_wait_reduction']:+.1f} %, "
                  f"step time {-100 * gain['step_time_reduction']:+.1f} %")
    for row in rows.values():
        row.pop("losses")
    print(json.dumps({"bench": "token_budget", **meta, "arms": rows, "gains": gains}, separators=(",", ":")))


if __name__ == "__main__":
    main()
