#!/usr/bin/env python3
"""Benchmark: what training.ema costs a step (issue 69; docs/optimizer.md). MagiHuman at the bench
size of bench/bench_models.py (a 3-layer width-384 DiT), full fine-tuning, 2 ranks (torchrun, FSDP
over both), one intra-op thread each, on `fixture magihuman --mix`.

Arms, interleaved over ROUNDS rounds (A B C, then C B A, ...):
  none    AdamW alone
  ema     training.ema on (decay 0.9999, an update every step): one pass over the fp32 shards after
          each optimizer step
  ema_host, ema_disk
          the same with training.ema.offload host / disk (under BENCH_DIR/offload): the shadows
          streamed through three chunk windows past the shards at every update
  none2   AdamW alone again: the control, whose spread against `none` is the noise floor

Reported (medians over rounds): step_ms (median step time over the steps after the first two),
optimizer_ms (the step's optimizer phase, where the EMA update runs) and peak_rss_mib; the ratios
ema / none (target: step <= 1.03), and each offloaded arm's, with none2 / none as the noise floor.

Usage: .venv/bin/python bench/ema.py [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
Knobs (environment): STEPS (10), GLOBAL (4), ROUNDS (3), BENCH_DIR (default BUILD_DIR/bench_ema).
The last line of stdout is one JSON object.
"""
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import bench_models
from arm_runs import bench_each_model, interleaved, run_logged

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build").resolve()
BIN = os.environ.get("MMTRAIN_BIN", str(BUILD / "bin" / "mmtrain"))
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
BENCH = Path(os.environ.get("BENCH_DIR", BUILD / "bench_ema"))
STEPS, GLOBAL, ROUNDS = int(os.environ.get("STEPS", 10)), int(os.environ.get("GLOBAL", 4)), int(os.environ.get("ROUNDS", 3))
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
ARMS = ["none", "ema", "ema_host", "ema_disk", "none2"]


def one_run(arm, r, data, root):
    out = root / f"{arm}_r{r}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    cfg = out.with_suffix(".yaml")
    offload = {"ema": "none", "ema_host": "host", "ema_disk": "disk"}.get(arm)
    training = f", ema: {{enable: true, decay: 0.9999, offload: {offload}}}" if offload else ""
    if offload == "disk":
        (root / "offload").mkdir(exist_ok=True)
        training += f", offload_dir: {root / 'offload'}"
    cfg.write_text(bench_models.config("magihuman", data, out, STEPS, GLOBAL, training=training))
    run_logged(f"magihuman {arm} r{r}", [TORCHRUN, "--nproc-per-node", "2", "--no-python", BIN, "train", str(cfg)],
               str(out) + ".log", ENV)
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = [s for s in steps if s["iteration"] > 2]
    return {"step_ms": statistics.median(s["step_time_ms"] for s in timed),
            "optimizer_ms": statistics.median(s["phases_ms"]["optimizer"] for s in timed),
            "peak_rss_mib": max(s["peak_rss_mb"] for s in steps)}


def bench_model(model):
    root = BENCH / model
    data = root / "data"
    root.mkdir(parents=True, exist_ok=True)
    if not data.exists():
        run_logged("magihuman data", [BIN, *bench_models.fixture_args(model, data, 32)], root / "fixture.log", ENV)
    runs = interleaved(ARMS, ROUNDS, lambda arm, r: one_run(arm, r, data, root))
    med = {arm: {k: statistics.median(x[k] for x in runs[arm]) for k in runs[arm][0]} for arm in ARMS}
    ratio = lambda arm, k: round(med[arm][k] / med["none"][k], 3)  # noqa: E731
    out = {"model": model,
           "arms": {arm: {k: round(v, 2) for k, v in med[arm].items()} for arm in ARMS},
           **{f"{arm}_over_none": {k: ratio(arm, k) for k in ("step_ms", "optimizer_ms", "peak_rss_mib")}
              for arm in ("ema", "ema_host", "ema_disk")},
           "control_over_none": {k: ratio("none2", k) for k in ("step_ms", "optimizer_ms", "peak_rss_mib")},
           "targets": {"step_ms": 1.03}}
    for arm in ("ema", "ema_host", "ema_disk"):
        print(f"bench: {arm} / none {out[arm + '_over_none']} (control {out['control_over_none']})", file=sys.stderr)
    return out


def main():
    bench_each_model("ema", BIN, BENCH, ["magihuman"], bench_model, ranks=2, steps=STEPS, global_batch=GLOBAL,
                     rounds=ROUNDS)


if __name__ == "__main__":
    main()
