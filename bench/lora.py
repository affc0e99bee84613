#!/usr/bin/env python3
"""Benchmark: LoRA fine-tuning against full fine-tuning (issue 49), both models at the bench size of
bench/validation.py (MagiHuman: 3 layers of width 384; Magistral: a 4-layer width-384 decoder and
a 2-layer Pixtral tower), on 2 ranks (torchrun, FSDP over both), one intra-op thread each, on the
same data and seed.

Arms, interleaved over ROUNDS rounds (A B C, then C B A, ...):
  full      full fine-tuning (every parameter trains)
  lora      features.enable_lora with the model's default targets (rank 8, alpha 16)
  full2     full fine-tuning again: the control, whose spread against `full` is the noise floor

Each run trains STEPS steps and saves its last one. Reported per model and arm (medians over rounds):
  state_mib       rank 0's training state: params + grads + optimizer state (the run's log line)
  peak_rss_mib    rank 0's peak RSS over the run (metrics.jsonl peak_rss_mb)
  predicted_mib   the plan's prediction of that peak (the first record's predicted_peak_rss_mb)
  step_ms         median step time over the steps after the first two, the save step left out
  ckpt_mib        the saved checkpoint's size on disk
  save_ms         the save's stall (checkpoint_stall_ms of the saving step)
and the ratios lora / full, with full2 / full as the noise floor.

Usage: .venv/bin/python bench/lora.py [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
Knobs (environment): MODELS (magihuman mistral3), STEPS (8), GLOBAL (8), ROUNDS (2), BENCH_DIR
(default BUILD_DIR/bench_lora). The last line of stdout is one JSON object.
"""
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import bench_models
from arm_runs import bench_each_model, interleaved, run_logged

REPO = Path(__file__).resolve().parent.parent
BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build").resolve()
BIN = os.environ.get("MMTRAIN_BIN", str(BUILD / "bin" / "mmtrain"))
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
BENCH = Path(os.environ.get("BENCH_DIR", BUILD / "bench_lora"))
MODELS = os.environ.get("MODELS", "magihuman mistral3").split()
STEPS, GLOBAL, ROUNDS = int(os.environ.get("STEPS", 8)), int(os.environ.get("GLOBAL", 8)), int(os.environ.get("ROUNDS", 2))
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
ARMS = ["full", "lora", "full2"]

STATE = re.compile(r"rank 0 holds params ([\d.]+) MiB, grads ([\d.]+) MiB, optimizer state ([\d.]+) MiB")


def run(label, cmd, log):
    return run_logged(label, cmd, log, ENV)


def du_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def one_run(model, arm, r, data, root):
    out, save = root / f"{arm}_r{r}", root / f"ckpt_{arm}_r{r}"
    subprocess.run(["rm", "-rf", str(out), str(save)], check=True)
    cfg = out.with_suffix(".yaml")
    cfg.write_text(bench_models.config(model, data, out, STEPS, GLOBAL, training=f", save: {save}, save_interval: {STEPS}",
                                       features=f"enable_lora: {'true' if arm == 'lora' else 'false'}"))
    log = run(f"{model} {arm} r{r}", [TORCHRUN, "--nproc-per-node", "2", "--no-python", BIN, "train", str(cfg)],
              str(out) + ".log")
    params, grads, optimizer = (float(x) for x in STATE.search(log).groups())
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = [s["step_time_ms"] for s in steps if 2 < s["iteration"] < STEPS]
    return {"state_mib": params + grads + optimizer, "peak_rss_mib": max(s["peak_rss_mb"] for s in steps),
            "predicted_mib": steps[0].get("predicted_peak_rss_mb"), "step_ms": statistics.median(timed),
            "ckpt_mib": du_mib(save / f"iter_{STEPS:07d}"), "save_ms": steps[-1].get("checkpoint_stall_ms", 0.0),
            "trainable_params": steps[0]["trainable_params"], "total_params": steps[0]["total_params"]}


def bench_model(model):
    root = BENCH / model
    data = root / "data"
    root.mkdir(parents=True, exist_ok=True)
    if not data.exists():
        run(f"{model} data", [BIN, *bench_models.fixture_args(model, data, 32)], root / "fixture.log")
    runs = interleaved(ARMS, ROUNDS, lambda arm, r: one_run(model, arm, r, data, root))
    med = {arm: {k: statistics.median(x[k] for x in runs[arm]) for k in runs[arm][0] if runs[arm][0][k] is not None}
           for arm in ARMS}
    full, lora, control = med["full"], med["lora"], med["full2"]
    ratio = lambda a, k: round(a[k] / full[k], 3)  # noqa: E731
    out = {
        "model": model,
        "arms": {arm: {k: round(v, 2) for k, v in med[arm].items()} for arm in ARMS},
        "lora_over_full": {k: ratio(lora, k) for k in ("state_mib", "peak_rss_mib", "step_ms", "ckpt_mib", "save_ms")},
        "control_over_full": {k: ratio(control, k) for k in ("peak_rss_mib", "step_ms", "save_ms")},
        "trained_share": round(lora["trainable_params"] / lora["total_params"], 4),
    }
    if "predicted_mib" in full and "predicted_mib" in lora:
        measured, predicted = full["peak_rss_mib"] - lora["peak_rss_mib"], full["predicted_mib"] - lora["predicted_mib"]
        out["peak_saving_mib"] = {"measured": round(measured, 1), "predicted": round(predicted, 1),
                                  "measured_over_predicted": round(measured / predicted, 3) if predicted else None}
    print(f"bench: {model}: lora / full {out['lora_over_full']} (control {out['control_over_full']}); "
          f"peak saving {out.get('peak_saving_mib')}", file=sys.stderr)
    return out


def main():
    bench_each_model("lora", BIN, BENCH, MODELS, bench_model, ranks=2, steps=STEPS, global_batch=GLOBAL, rounds=ROUNDS)


if __name__ == "__main__":
    main()
