#!/usr/bin/env python3
"""Benchmark: a DPO step against an SFT step on the same tokens (issue 67), Magistral at the bench
size of bench/bench_models.py (a 4-layer width-384 decoder, a 2-layer Pixtral tower), under LoRA
(rank 8, alpha 16), on 2 ranks (torchrun, FSDP over both), one intra-op thread each.

The data: `fixture mistral3-preferences` (PAIRS pairs) for DPO, and the very same sequences as an
SFT set: each pair's prompt + chosen answer and prompt + rejected answer as two conversation records,
in pair order, so that with shuffle off SFT step s trains on exactly DPO step s's tokens (GLOBAL pairs
= 2 x GLOBAL records, the micro-batches doubled alike).

Arms, interleaved over ROUNDS rounds (A B C D, then D C B A, ...):
  sft       training.objective sft on the 2 x GLOBAL sequences
  dpo       training.objective dpo on the GLOBAL pairs: a no-grad reference forward with the adapters
            off, then the policy's forward and backward, over the same sequences
  trl       the peer (bench/trl_dpo_peer.py): TRL's DPOTrainer loss on HF transformers + peft under
            FSDP2, fused AdamW, on exactly the dpo arm's micro-batches (`debug collate`)
  sft2      sft again: the control, whose spread against `sft` is the noise floor

Reported (medians over rounds): step_ms (median step time over the steps after the first two) and
peak_rss_mib (the peak RSS over ranks), and the ratios dpo / sft (targets: step <= 2.3, peak <= 1.15)
and dpo / trl, with sft2 / sft as the noise floor.

Usage: .venv/bin/python bench/dpo.py [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
Knobs (environment): STEPS (8), GLOBAL (4 pairs), MICRO (2 pairs), PAIRS (32), ROUNDS (2), BENCH_DIR
(default BUILD_DIR/bench_dpo). The last line of stdout is one JSON object.
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
BENCH = Path(os.environ.get("BENCH_DIR", BUILD / "bench_dpo"))
STEPS, GLOBAL, MICRO = int(os.environ.get("STEPS", 8)), int(os.environ.get("GLOBAL", 4)), int(os.environ.get("MICRO", 2))
PAIRS, ROUNDS = int(os.environ.get("PAIRS", 32)), int(os.environ.get("ROUNDS", 2))
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
ARMS = ["sft", "dpo", "trl", "sft2"]


def run(label, cmd, log):
    return run_logged(label, cmd, log, ENV)


def text_of(content) -> str:
    """A TRL message's content as the conversation data's text (data/conversation/preference_dataset.h)."""
    if isinstance(content, str):
        return content
    return "".join("<image>" if part["type"] == "image" else part["text"] for part in content)


def sft_records(pairs: list) -> list:
    """Each pair as two conversation records, chosen then rejected: the DPO sequences, one by one."""
    out = []
    for pair in pairs:
        for side in ("chosen", "rejected"):
            if "prompt" in pair:
                messages = pair["prompt"] + pair[side]
            else:
                messages = pair[side]
            out.append({"messages": [{"role": m["role"], "content": text_of(m["content"])} for m in messages],
                        "images": pair["images"]})
    return out


def config(data: Path, out: Path, objective: str) -> str:
    dpo = objective == "dpo"
    dataset = (f"{{dataset_type: {'preference' if dpo else 'huggingface'}, preprocess_parameters: "
               f"{{model_name_or_path: {data}/tekken.json}}, basic_parameters: {{template: mistral, dataset: "
               f"{data}/{'preferences.json' if dpo else 'sequences.json'}, cutoff_len: 1024}}}}")
    scale = 1 if dpo else 2  # SFT counts sequences, DPO pairs of two
    return (bench_models.MODELS["mistral3"] + f"  checkpoint_path: {data.parent / 'base'}\n"
            "features: {enable_lora: true, lora: {rank: 8, alpha: 16}}\n"
            f"data:\n  dataset_param: {dataset}\n"
            f"  dataloader_param: {{collator_id: {'preference' if dpo else 'pixtral'}, shuffle: false}}\n"
            f"training: {{train_iters: {STEPS}, global_batch_size: {GLOBAL * scale}, micro_batch_size: {MICRO * scale}, "
            f"lr: 1.0e-4, lr_decay_style: constant, clip_grad: 1.0, seed: 5, objective: {objective}}}\n"
            f"logging: {{output_dir: {out}}}\n")


def one_run(arm, r, data, root):
    out = root / f"{arm}_r{r}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    cfg = out.with_suffix(".yaml")
    cfg.write_text(config(data, out, "dpo" if arm == "dpo" else "sft"))
    run(f"mistral3 {arm} r{r}", [TORCHRUN, "--nproc-per-node", "2", "--no-python", BIN, "train", str(cfg)],
        str(out) + ".log")
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = [s["step_time_ms"] for s in steps if s["iteration"] > 2]
    return {"step_ms": statistics.median(timed), "peak_rss_mib": max(s["peak_rss_mb"] for s in steps),
            "tokens_per_step": statistics.median(s["tokens"] for s in steps)}


def peer_batches(root: Path) -> tuple[Path, int]:
    """Every micro-batch of the dpo arm's run on 2 ranks, as mmtrain's loader makes them."""
    batches, accum = root / "batches", GLOBAL // (2 * MICRO)
    cfg = root / "peer_batches.yaml"
    cfg.write_text(config(root / "data", root / "peer_batches", "dpo"))
    if not (batches / f"s{STEPS - 1}_r1_m{accum - 1}.safetensors").exists():
        batches.mkdir(exist_ok=True)
        for s in range(STEPS):
            for rank in range(2):
                for m in range(accum):
                    run(f"mistral3 batch s{s} r{rank} m{m}", [BIN, "debug", "collate", str(cfg), "--step", str(s),
                                                             "--rank", str(rank), "--world", "2", "--micro", str(m),
                                                             "--out", str(batches / f"s{s}_r{rank}_m{m}.safetensors")],
                        root / "collate.log")
    return batches, accum


def peer_run(r, root):
    out = root / f"trl_r{r}.jsonl"
    batches, accum = peer_batches(root)
    run(f"mistral3 trl r{r}", [TORCHRUN, "--nproc-per-node", "2", str(Path(__file__).parent / "trl_dpo_peer.py"),
                               "--weights", str(root / "base"), "--batches", str(batches), "--steps", str(STEPS),
                               "--accum", str(accum), "--out", str(out)], str(out) + ".log")
    steps = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return {"step_ms": statistics.median(s["step_time_ms"] for s in steps if s["iteration"] > 2),
            "peak_rss_mib": max(s["peak_rss_mb"] for s in steps),
            "tokens_per_step": statistics.median(s["tokens"] for s in steps)}


def bench_model(model):
    root = BENCH / model
    data = root / "data"
    root.mkdir(parents=True, exist_ok=True)
    if not data.exists():
        run("mistral3 preferences", [BIN, "fixture", "mistral3-preferences", "--out", str(data), "--pairs", str(PAIRS),
                                     "--seed", "3"], root / "fixture.log")
        pairs = json.loads((data / "preferences.json").read_text())
        (data / "sequences.json").write_text(json.dumps(sft_records(pairs)))
        (root / "weights.yaml").write_text(config(data, root / "unused", "sft"))
        run("mistral3 base", [BIN, "fixture", "mistral3-weights", "--config", str(root / "weights.yaml"), "--out",
                              str(root / "base")], root / "base.log")
    runs = interleaved(ARMS, ROUNDS, lambda arm, r: peer_run(r, root) if arm == "trl" else one_run(arm, r, data, root))
    med = {arm: {k: statistics.median(x[k] for x in runs[arm]) for k in runs[arm][0]} for arm in ARMS}
    sft, dpo, trl, control = med["sft"], med["dpo"], med["trl"], med["sft2"]
    ratio = lambda a, k, b=sft: round(a[k] / b[k], 3)  # noqa: E731
    out = {
        "model": model,
        "arms": {arm: {k: round(v, 2) for k, v in med[arm].items()} for arm in ARMS},
        "dpo_over_sft": {k: ratio(dpo, k) for k in ("step_ms", "peak_rss_mib", "tokens_per_step")},
        "control_over_sft": {k: ratio(control, k) for k in ("step_ms", "peak_rss_mib")},
        "dpo_over_trl": {k: ratio(dpo, k, trl) for k in ("step_ms", "peak_rss_mib", "tokens_per_step")},
        "targets": {"step_ms": 2.3, "peak_rss_mib": 1.15},
    }
    print(f"bench: dpo / sft {out['dpo_over_sft']} (control {out['control_over_sft']}), dpo / trl "
          f"{out['dpo_over_trl']}", file=sys.stderr)
    return out


def main():
    bench_each_model("dpo", BIN, BENCH, ["mistral3"], bench_model, ranks=2, steps=STEPS, global_pairs=GLOBAL,
                     rounds=ROUNDS)


if __name__ == "__main__":
    main()
