"""Summary of bench/offload.sh: AdamW moments on disk against in RAM.

Reads D/bench_meta.json (WARMUP), D/runs/{ram,disk}_rK/metrics.jsonl and the logs beside them
("rank 0 holds params X MiB": the fp32 shard of rank 0, 4 bytes per parameter). Per arm, all rounds
pooled, the iterations after WARMUP: step_ms (median step_time_ms), optimizer_ms (median of the
optimizer phase), peak_rss_mb (max over ranks and steps). The JSON (last line) adds
disk_over_ram_step (target <= 1.3), rss_saved_bytes_per_param_per_rank (target >= 7: the moments
are 8), and the disk arm's per-step traffic and the ms its optimizer waited for the disk.
"""
from __future__ import annotations

import argparse
import json
import os
import re

from arm_runs import median, metrics, rounds


def _arm(d: str, arm: str, warmup: int) -> dict:
    steps, optimizer, rss, read, written, wait = [], [], [], [], [], []
    for run in rounds(d, arm):
        for m in metrics(run):
            rss.append(m["peak_rss_mb"])
            if m["iteration"] <= warmup:
                continue
            steps.append(m["step_time_ms"])
            optimizer.append(m["phases_ms"].get("optimizer", 0.0))
            if "offload" in m:
                read.append(m["offload"]["disk"]["read_mib"])
                written.append(m["offload"]["disk"]["written_mib"])
                wait.append(m["offload"]["disk"]["wait_ms"])
    row = {"step_ms": median(steps), "optimizer_ms": median(optimizer), "peak_rss_mb": max(rss) if rss else None}
    if read:
        row.update(disk_read_mib_per_step=median(read), disk_written_mib_per_step=median(written),
                   disk_wait_ms_per_step=median(wait))
    return row


def _params_per_rank(d: str) -> int | None:
    runs = rounds(d, "ram")
    if not runs:
        return None
    match = re.search(r"rank 0 holds params ([0-9.]+) MiB", open(runs[0] + ".log").read())
    return int(float(match.group(1)) * 2**20 / 4) if match else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    meta = json.load(open(os.path.join(args.dir, "bench_meta.json")))
    arms = {arm: _arm(args.dir, arm, meta["WARMUP"]) for arm in ("ram", "disk")}
    params = _params_per_rank(args.dir)
    ram, disk = arms["ram"], arms["disk"]
    saved = (ram["peak_rss_mb"] - disk["peak_rss_mb"]) * 2**20 / params if params else None
    result = {"bench": "offload", **meta, "arms": arms, "params_per_rank": params,
              "disk_over_ram_step": round(disk["step_ms"] / ram["step_ms"], 3),
              "rss_saved_bytes_per_param_per_rank": round(saved, 2) if saved is not None else None}
    for arm, row in arms.items():
        print(f"{arm:5s} step {row['step_ms']} ms (optimizer {row['optimizer_ms']} ms), peak RSS {row['peak_rss_mb']} MB")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
