"""Summary of bench/checkpoint.sh: what saving costs the training loop, sync against async.

Reads D/bench_meta.json (WARMUP), D/runs/{none,sync,async}_rK/metrics.jsonl (the arms that ran;
the others' fields are left out or null) and the async arm's
logs (D/runs/async_rK.log: "staged in X ms (Y MiB on rank 0)"). Per arm, all rounds pooled, the
iterations after WARMUP:
  ordinary_step_ms   median step_time_ms of the iterations that do not save
  after_save_step_ms median step_time_ms of the iteration right after a save (the async writer
                     runs during it: this is what the background write costs the compute)
  stall_ms           median checkpoint_stall_ms of the save iterations (the time a save held
                     training up after its step)
The JSON (last line) adds the async arm's staging_ms / staged_mib (rank 0's copy into the staging
buffers), checkpoint_mib (one checkpoint on disk), async_stall_over_sync_stall (target < 0.10) and
async_stall_over_staging (1.0 when a save iteration waits for nothing but the copy).
"""
from __future__ import annotations

import argparse
import json
import os
import re

from arm_runs import median, metrics, rounds


def _arm(d: str, arm: str, warmup: int, interval: int) -> dict:
    ordinary, after_save, stall = [], [], []
    for run in rounds(d, arm):
        for m in metrics(run):
            if m["iteration"] <= warmup:
                continue
            saves_here = m["iteration"] % interval == 0
            if "checkpoint_stall_ms" in m:
                stall.append(m["checkpoint_stall_ms"])
            if (m["iteration"] - 1) % interval == 0 and m["iteration"] > interval:
                after_save.append(m["step_time_ms"])
            elif not saves_here:
                ordinary.append(m["step_time_ms"])
    return {"ordinary_step_ms": median(ordinary), "after_save_step_ms": median(after_save),
            "stall_ms": median(stall), "saves": len(stall)}


def _staging(d: str) -> tuple[float | None, float | None]:
    pattern = re.compile(r"staged in ([0-9.]+) ms \(([0-9.]+) MiB on rank 0\)")
    ms, mib = [], []
    for run in rounds(d, "async"):
        with open(run + ".log") as f:
            for match in pattern.finditer(f.read()):
                ms.append(float(match.group(1)))
                mib.append(float(match.group(2)))
    return median(ms), median(mib)


def _checkpoint_mib(d: str) -> float | None:
    runs = rounds(d, "sync") or rounds(d, "async")
    if not runs:
        return None
    ckpt = os.path.join(runs[-1], "ckpt")
    latest = os.path.join(ckpt, open(os.path.join(ckpt, "latest")).read().strip())
    total = sum(os.path.getsize(os.path.join(latest, f)) for f in os.listdir(latest))
    return round(total / 2**20, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--save-interval", type=int, required=True)
    args = parser.parse_args()
    meta = json.load(open(os.path.join(args.dir, "bench_meta.json")))
    arms = {arm: _arm(args.dir, arm, meta["WARMUP"], args.save_interval)
            for arm in ("none", "sync", "async") if rounds(args.dir, arm)}
    staging_ms, staged_mib = _staging(args.dir) if "async" in arms else (None, None)
    sync_stall, async_stall = (arms.get(arm, {}).get("stall_ms") for arm in ("sync", "async"))
    result = {"bench": "checkpoint", "save_interval": args.save_interval, **{k: meta[k] for k in meta},
              "arms": arms, "staging_ms": staging_ms, "staged_mib": staged_mib,
              "checkpoint_mib": _checkpoint_mib(args.dir),
              "async_stall_over_sync_stall": round(async_stall / sync_stall, 3) if sync_stall and async_stall else None,
              "async_stall_over_staging": round(async_stall / staging_ms, 2) if staging_ms and async_stall else None}
    for arm, row in arms.items():
        print(f"{arm:6s} ordinary step {row['ordinary_step_ms']} ms, step after a save {row['after_save_step_ms']} ms, "
              f"save stall {row['stall_ms']} ms over {row['saves']} saves")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
