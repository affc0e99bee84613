#!/usr/bin/env python3
"""Benchmark: what held-out evaluation costs against training (issue 48), both models at the bench
size of bench/token_budget.sh (MagiHuman: 3 layers of width 384 on a `fixture magihuman --mix` set,
samples of ~200-2600 tokens; Magistral: a 4-layer width-384 decoder and a 2-layer Pixtral tower
on `fixture mistral3 --mix`, 0-4 images per sample), on one rank with one intra-op thread.

The validation set is the training set itself (data.validation names the same samples), so that
both sides average over the same samples (their lengths span ~10x): training runs two epochs of
SAMPLES / GLOBAL steps and its per-sample time is taken over the second (every sample once); an
evaluation reads every sample (at K timesteps for MagiHuman).

Arms, interleaved over ROUNDS rounds (A B C, then C B A, ...):
  train_eval  training with an evaluation after each epoch: the steps' and the evaluations'
              times come from the same process, one after the other
  train       the same training without evaluation (saves its last step): the process's peak RSS
  eval        `mmtrain eval` of that checkpoint: the peak RSS of evaluation alone

Reported per model:
  eval_forward_ms      one forward of evaluation: eval_time_ms / (eval_samples x K timesteps)
  train_ms_per_sample  the second epoch's mean step time / its samples (GLOBAL)
  ratio                eval_forward_ms / train_ms_per_sample (target <= 0.4: a forward is about a
                       third of forward + backward)
  eval_in_steps        one evaluation of the whole validation set in training steps (sizes eval_interval)
  peak RSS (MiB)       of the train, train_eval and eval processes (wait4's ru_maxrss)

Usage: .venv/bin/python bench/validation.py [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
Knobs (environment): MODELS (magihuman mistral3), GLOBAL (8), SAMPLES (32, a multiple of GLOBAL),
ROUNDS (2), BENCH_DIR (default BUILD_DIR/bench_validation).
The last line of stdout is one JSON object.
"""
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import bench_models
from arm_runs import bench_each_model

REPO = Path(__file__).resolve().parent.parent
BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build").resolve()
BIN = os.environ.get("MMTRAIN_BIN", str(BUILD / "bin" / "mmtrain"))
BENCH = Path(os.environ.get("BENCH_DIR", BUILD / "bench_validation"))
MODELS = os.environ.get("MODELS", "magihuman mistral3").split()
GLOBAL, SAMPLES, ROUNDS = int(os.environ.get("GLOBAL", 8)), int(os.environ.get("SAMPLES", 32)), int(
    os.environ.get("ROUNDS", 2))
if SAMPLES % GLOBAL:
    raise SystemExit(f"bench: SAMPLES {SAMPLES} must be a multiple of GLOBAL {GLOBAL} (an epoch of whole steps)")
EPOCH = SAMPLES // GLOBAL  # steps
STEPS = 2 * EPOCH
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def run(label, args, log):
    """Runs mmtrain ARGS (one rank) and returns its peak RSS in MiB; on failure shows the log's tail."""
    print(f"bench: {label} (log {log})", file=sys.stderr)
    with open(log, "w") as out:
        proc = subprocess.Popen([BIN, *args], stdout=out, stderr=subprocess.STDOUT, env=ENV)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.stderr.write(Path(log).read_text()[-4000:])
        raise SystemExit(f"bench: {label} failed")
    return usage.ru_maxrss / 1024.0  # KiB -> MiB


def records(out):
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in lines if r.get("kind") != "eval"], [r for r in lines if r.get("kind") == "eval"]


def bench_model(model):
    root = BENCH / model
    data = root / "data"
    root.mkdir(parents=True, exist_ok=True)
    if not data.exists():
        run(f"{model} data", bench_models.fixture_args(model, data, SAMPLES), root / "fixture.log")
    arms = ["train_eval", "train", "eval"]
    results = {arm: [] for arm in arms}
    for r in range(1, ROUNDS + 1):
        order = arms if r % 2 else list(reversed(arms))
        for arm in order:
            out = root / f"{arm}_r{r}"
            subprocess.run(["rm", "-rf", str(out)], check=True)
            cfg = out.with_suffix(".yaml")
            extra = ""
            if arm == "train_eval":
                extra = f", eval_interval: {EPOCH}"
            elif arm == "train":
                extra = f", save: {root / f'ckpt_r{r}'}"
                subprocess.run(["rm", "-rf", str(root / f"ckpt_r{r}")], check=True)
            cfg.write_text(bench_models.config(model, data, out, STEPS, GLOBAL, training=extra, validation=True))
            if arm == "eval":
                # The checkpoint of this round's train arm, or the last round's when eval runs first.
                ckpt = root / f"ckpt_r{r}" if (root / f"ckpt_r{r}").exists() else root / f"ckpt_r{r - 1}"
                rss = run(f"{model} {arm} r{r}", ["eval", str(cfg), "--load", str(ckpt), "--out",
                                                  str(out / "eval.json")], str(out) + ".log")
                results[arm].append({"rss": rss, "eval": json.loads((out / "eval.json").read_text())})
            else:
                rss = run(f"{model} {arm} r{r}", ["train", str(cfg)], str(out) + ".log")
                steps, evals = records(out)
                results[arm].append({"rss": rss, "steps": steps, "evals": evals})
    # The second epoch: every sample once, after the first epoch's warm-up.
    step_ms = [s["step_time_ms"] for run_ in results["train_eval"] + results["train"] for s in run_["steps"]
               if s["iteration"] > EPOCH]
    evals = [e for run_ in results["train_eval"] for e in run_["evals"]]
    k = len(evals[0].get("eval_sigmas", [])) or 1
    forward_ms = statistics.median(e["eval_time_ms"] / (e["eval_samples"] * k) for e in evals)
    eval_ms = statistics.median(e["eval_time_ms"] for e in evals)
    step_median = statistics.median(step_ms)
    per_sample = statistics.mean(step_ms) / GLOBAL
    out = {
        "model": model,
        "validation_samples": evals[0]["eval_samples"],
        "timesteps": k,
        "train_step_ms": round(step_median, 2),
        "train_ms_per_sample": round(per_sample, 2),
        "eval_forward_ms": round(forward_ms, 2),
        "ratio": round(forward_ms / per_sample, 3),
        "eval_ms": round(eval_ms, 1),
        "eval_in_steps": round(eval_ms / step_median, 2),
        "peak_rss_mb": {arm: round(max(r_["rss"] for r_ in results[arm]), 1) for arm in arms},
    }
    print(f"bench: {model}: one evaluation forward {forward_ms:.2f} ms against {per_sample:.2f} ms of a training "
          f"step per sample (ratio {out['ratio']}); the whole validation set ({out['validation_samples']} samples x "
          f"{k} timestep(s)) {eval_ms:.0f} ms = {out['eval_in_steps']} training steps; peak RSS (MiB) "
          f"{out['peak_rss_mb']}", file=sys.stderr)
    return out


def main():
    bench_each_model("validation", BIN, BENCH, MODELS, bench_model, steps=STEPS, samples=SAMPLES, global_batch=GLOBAL,
                     rounds=ROUNDS)


if __name__ == "__main__":
    main()
