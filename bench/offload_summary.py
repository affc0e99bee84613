"""Summary of bench/offload.sh: each offload feature against none.

Reads D/bench_meta.json (WARMUP), D/plans/ARM.json (`mmtrain plan` with the arm's overrides) and
D/runs/ARM_rK/metrics.jsonl with the logs beside them ("rank 0 holds params X MiB": the fp32 shard
of rank 0, 4 bytes per parameter). Per arm, all rounds pooled, the iterations after WARMUP:
step_ms (median step_time_ms), optimizer_ms (median of the optimizer phase), peak_rss_mb (max over
ranks and steps), the allocated peaks of tools.memory_profile (max over ranks; the largest over
steps, per phase and for the step), and the median per-step traffic of each tier. Against the arm
`none`: step time ratio, allocated and RSS change, and next to them the planner's device / host /
disk bytes for the arm and its predicted device change. The JSON (last line) adds
rss_saved_bytes_per_param_per_rank of the disk arm (target >= 7: the moments are 8) and
disk_over_none_step (target <= 1.3).
"""
from __future__ import annotations

import json
import os
import re

from arm_runs import arm_summary_args, median, metrics, rounds

PHASES = ("forward", "backward", "optimizer")


def _arm(d: str, arm: str, warmup: int) -> dict:
    steps, optimizer, rss, step_peaks, traffic = [], [], [], [], {}
    phase_peaks = {p: [] for p in PHASES}
    for run in rounds(d, arm):
        for m in metrics(run):
            rss.append(m["peak_rss_mb"])
            if m["iteration"] <= warmup:
                continue
            steps.append(m["step_time_ms"])
            optimizer.append(m["phases_ms"].get("optimizer", 0.0))
            if "memory" in m:
                step_peaks.append(m["memory"]["step_peak_mb"])
                for p in PHASES:
                    phase_peaks[p].append(m["memory"].get(f"{p}_peak_mb", 0.0))
            for tier, counters in m.get("offload", {}).items():
                for name, value in counters.items():
                    traffic.setdefault(f"{tier}.{name}", []).append(value)
    row = {"step_ms": median(steps), "optimizer_ms": median(optimizer), "peak_rss_mb": max(rss) if rss else None,
           "allocated_peak_mb": max(step_peaks) if step_peaks else None,
           "allocated_phase_peak_mb": {p: max(v) for p, v in phase_peaks.items() if v}}
    row["offload_per_step"] = {k: round(median(v), 3) for k, v in traffic.items()}
    plan_path = os.path.join(d, "plans", f"{arm}.json")
    if os.path.exists(plan_path):
        plan = json.load(open(plan_path))
        chosen = next(v for k, v in plan["offload"].items() if _plan_name(arm) == k)
        row["plan_mib"] = {tier.replace("_bytes", ""): round(b / 2**20, 1) for tier, b in chosen.items()}
    return row


def _plan_name(arm: str) -> str:
    return {"none": "none", "activations": "activations", "cpu_offload": "cpu_offload",
            "swap_host": "adamw_swap(host)", "disk": "adamw_swap(disk)",
            "shards_disk": "cpu_offload(disk)+adamw_swap(disk)",
            "all_three": "activations+cpu_offload(disk)+adamw_swap(disk)"}[arm]


def _params_per_rank(d: str) -> int | None:
    runs = rounds(d, "none")
    if not runs:
        return None
    match = re.search(r"rank 0 holds params ([0-9.]+) MiB", open(runs[0] + ".log").read())
    return int(float(match.group(1)) * 2**20 / 4) if match else None


def main() -> None:
    args, meta = arm_summary_args(__doc__)
    arms = {arm: _arm(args.dir, arm, meta["WARMUP"]) for arm in args.arms}
    result = {"bench": "offload", **meta, "arms": arms, "params_per_rank": _params_per_rank(args.dir)}
    none = arms.get("none")
    if none:
        print(f"{'arm':12s} {'step ms':>8s} {'x none':>7s} {'alloc MiB':>10s} {'plan device MiB':>16s} "
              f"{'plan host MiB':>14s} {'RSS MB':>8s}")
        for arm, row in arms.items():
            row["step_over_none"] = round(row["step_ms"] / none["step_ms"], 3)
            if row["allocated_peak_mb"] is not None and none["allocated_peak_mb"]:
                row["allocated_change_mb"] = round(row["allocated_peak_mb"] - none["allocated_peak_mb"], 1)
            if "plan_mib" in row and "plan_mib" in none:
                row["plan_device_change_mb"] = round(row["plan_mib"]["device"] - none["plan_mib"]["device"], 1)
            plan = row.get("plan_mib", {})
            print(f"{arm:12s} {row['step_ms']:8.0f} {row['step_over_none']:7.3f} {row['allocated_peak_mb'] or 0:10.1f} "
                  f"{plan.get('device', 0):16.1f} {plan.get('host', 0):14.1f} {row['peak_rss_mb']:8.0f}")
        params = result["params_per_rank"]
        for arm, key in (("disk", "rss_saved_bytes_per_param_per_rank"),
                         ("shards_disk", "shards_disk_rss_saved_bytes_per_param_per_rank")):
            if arm in arms and params:
                saved = (none["peak_rss_mb"] - arms[arm]["peak_rss_mb"]) * 2**20 / params
                result[key] = round(saved, 2)
                result[f"{arm}_over_none_step"] = arms[arm]["step_over_none"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
