#!/usr/bin/env python3
"""Benchmark: a GRPO step (issue 68), Magistral at the bench size of bench/bench_models.py (a 4-layer
width-384 decoder, a 2-layer Pixtral tower), LoRA rank 8, one process with the machine's threads.

Every step: PROMPTS prompts of `fixture mistral3-prompts`, G completions each of MAX_NEW tokens
(the random model almost never ends early, so both sides generate about G x PROMPTS x MAX_NEW
tokens), loss_type dapo with beta 0.04 (the reference forward counted), AdamW.

Arms, interleaved over ROUNDS rounds (A B C, then C B A, ...):
  mmtrain   `mmtrain train` with training.objective grpo: the KV-cache generator (one completion
            at a time), the reference's no-grad forward with the adapters off, the training step
  trl       the peer (bench/trl_grpo_peer.py): HF transformers `generate` over the step's G x PROMPTS
            completions as one batch (its best batching), then TRL GRPOTrainer's own
            `_compute_loss` with peft's adapters off for the reference and torch's fused AdamW:
            what GRPOTrainer does with transformers generation (no vLLM), on the same prompts
  mmtrain2  mmtrain again: the control, whose spread against `mmtrain` is the noise floor

Reported (medians over rounds of the median over steps after the first): step_ms, rollout_ms (the
generation), rollout tokens/s, and the ratios mmtrain / trl; mmtrain's split (time/rollout_ms,
time/reference_ms, the training forward + backward + optimizer).

Usage: .venv/bin/python bench/grpo.py [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
Knobs (environment): STEPS (4), PROMPTS (2), G (8), MAX_NEW (32), ROUNDS (2), THREADS (2), BENCH_DIR
(default BUILD_DIR/bench_grpo). The last line of stdout is one JSON object.
"""
import json
import os
import statistics
import sys
from pathlib import Path

import bench_models
from arm_runs import interleaved, metrics, run_logged

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build").resolve()
BIN = os.environ.get("MMTRAIN_BIN", str(BUILD / "bin" / "mmtrain"))
BENCH = Path(os.environ.get("BENCH_DIR", BUILD / "bench_grpo"))
STEPS, PROMPTS, G = int(os.environ.get("STEPS", 4)), int(os.environ.get("PROMPTS", 2)), int(os.environ.get("G", 8))
MAX_NEW, ROUNDS, THREADS = int(os.environ.get("MAX_NEW", 32)), int(os.environ.get("ROUNDS", 2)), os.environ.get("THREADS", "2")
ENV = dict(os.environ, OMP_NUM_THREADS=THREADS, MKL_NUM_THREADS=THREADS)
ARMS = ["mmtrain", "trl", "mmtrain2"]
GRPO = {"num_generations": G, "max_completion_length": MAX_NEW, "temperature": 1.0, "loss_type": "dapo", "beta": 0.04,
        "reward_funcs": ["regex_match"], "reward_regex": "^[0-9]"}


def config(root: Path, out: Path) -> str:
    text = bench_models.MODELS["mistral3"].replace("model_id: mistral3", f"model_id: mistral3\n  checkpoint_path: {root / 'base'}")
    return text + f"""features: {{enable_lora: true, lora: {{rank: 8, alpha: 16}}}}
data:
  dataset_param: {{dataset_type: prompts, preprocess_parameters: {{model_name_or_path: {root / 'data' / 'tekken.json'}}},
                  basic_parameters: {{template: mistral, dataset: {root / 'data' / 'prompts.jsonl'}, cutoff_len: 1024}}}}
  dataloader_param: {{collator_id: prompts, shuffle: false}}
training: {{train_iters: {STEPS}, global_batch_size: {PROMPTS}, micro_batch_size: {PROMPTS}, lr: 1.0e-4,
  lr_decay_style: constant, seed: 5, objective: grpo, grpo: {json.dumps(GRPO)}}}
logging: {{output_dir: {out}}}
"""


def steady(values: list) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def one_run(arm, r):
    out = BENCH / f"{arm}_r{r}"
    run_logged(f"{arm} round {r}", ["rm", "-rf", str(out)], "/dev/null", ENV)
    if arm == "trl":
        run_logged(f"{arm} round {r}", [sys.executable, str(Path(__file__).parent / "trl_grpo_peer.py"),
                                        "--base", str(BENCH / "base"), "--config", str(BENCH / "config.yaml"),
                                        "--binary", BIN, "--steps", str(STEPS), "--prompts", str(PROMPTS), "--g", str(G),
                                        "--max-new", str(MAX_NEW), "--out", str(out)], BENCH / f"{arm}_r{r}.log", ENV)
        steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    else:
        cfg = BENCH / f"{arm}_r{r}.yaml"
        cfg.write_text(config(BENCH, out))
        run_logged(f"{arm} round {r}", [BIN, "train", str(cfg)], BENCH / f"{arm}_r{r}.log", ENV)
        steps = [s for s in metrics(str(out)) if "step_time_ms" in s]  # not the rollouts' texts records
    record = {"step_ms": steady([s["step_time_ms"] for s in steps]),
              "rollout_ms": steady([s["time/rollout_ms"] for s in steps]),
              "rollout_tokens_per_s": steady([s["rollout_tokens_per_s"] for s in steps])}
    if arm != "trl":
        record["reference_ms"] = steady([s["time/reference_ms"] for s in steps])
        record["train_ms"] = steady([s["phases_ms"]["forward"] + s["phases_ms"]["backward"] + s["phases_ms"]["optimizer"]
                                     for s in steps])
    return record


def main():
    if not os.access(BIN, os.X_OK):
        raise SystemExit(f"bench: no mmtrain binary at {BIN} (build first: make build)")
    BENCH.mkdir(parents=True, exist_ok=True)
    (BENCH / "config.yaml").write_text(config(BENCH, BENCH / "unused"))
    if not (BENCH / "base").exists():
        run_logged("base weights", [BIN, "fixture", "mistral3-weights", "--config", str(BENCH / "config.yaml"), "--out",
                                    str(BENCH / "base")], BENCH / "fixture.log", ENV)
        run_logged("prompts", [BIN, "fixture", "mistral3-prompts", "--out", str(BENCH / "data"), "--prompts", "16"],
                   BENCH / "fixture.log", ENV)
    runs = interleaved(ARMS, ROUNDS, one_run)
    med = {arm: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for arm, rs in runs.items()}
    out = {"bench": "grpo", "threads": int(THREADS), "steps": STEPS, "prompts": PROMPTS, "g": G, "max_new": MAX_NEW,
           "arms": med,
           "step_over_trl": round(med["mmtrain"]["step_ms"] / med["trl"]["step_ms"], 3),
           "rollout_tokens_per_s_over_hf_generate": round(med["mmtrain"]["rollout_tokens_per_s"] /
                                                          med["trl"]["rollout_tokens_per_s"], 3),
           "control_step_over_mmtrain": round(med["mmtrain2"]["step_ms"] / med["mmtrain"]["step_ms"], 3)}
    print(f"bench: step mmtrain / trl {out['step_over_trl']} (control {out['control_step_over_mmtrain']}), rollout "
          f"tokens/s mmtrain / HF generate {out['rollout_tokens_per_s_over_hf_generate']}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
