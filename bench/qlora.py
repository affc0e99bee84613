#!/usr/bin/env python3
"""Benchmark: QLoRA (features.lora.base_quant) against LoRA over a bf16 base (issue 58), both models at
the bench size of bench/bench_models.py (MagiHuman: 3 layers of width 384; Magistral: a 4-layer
width-384 decoder and a 2-layer Pixtral tower), on 2 ranks (torchrun, FSDP over both), one intra-op
thread each, param_dtype bf16 (the base LoRA keeps), random init, the same data and seed.

Arms, interleaved over ROUNDS rounds (A B C D, then D C B A, ...):
  lora        LoRA (rank 8, alpha 16, the default targets) over the bf16 base
  nf4, int8   the same with features.lora.base_quant
  lora2       LoRA again: the control, whose spread against `lora` is the noise floor
and for Magistral the PyTorch peers (bench/torch_qlora_peer.py: HF transformers + peft + FSDP2 on the
same HF weights and exactly the same micro-batches, `mmtrain debug collate` of each step and rank):
  torch_peft  FSDP2 + peft LoRA, the peer of `lora`
  torch_nf4   the same with torchao NF4Tensor base weights (torchtune's QLoRA), the peer of `nf4`
Magistral's arms all load one HF weights directory (`fixture mistral3-weights`); MagiHuman's start
from the random init.

Reported per model and arm (medians over rounds):
  params_mib      rank 0's parameter shards (the run's log line): the frozen base and the fp32 adapters
  quantized_mb    what the quantized weights hold on rank 0, and the same weights in bf16 (its log line)
  peak_rss_mib    rank 0's peak RSS (metrics.jsonl peak_rss_mb)
  gather_mib      what rank 0's FSDP all-gathers received per step (fsdp_gather_mib)
  step_ms         median step time over the steps after the first two
and the ratios arm / lora, with lora2 / lora as the noise floor, and mmtrain / its peer.

Usage: .venv/bin/python bench/qlora.py [BUILD_DIR]   (binary BUILD_DIR/bin/mmtrain or $MMTRAIN_BIN)
Knobs (environment): MODELS (magihuman mistral3), ARMS (lora nf4 int8 lora2), STEPS (8), GLOBAL (8),
ROUNDS (2), BENCH_DIR (default BUILD_DIR/bench_qlora). The last line of stdout is one JSON object.
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

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build").resolve()
BIN = os.environ.get("MMTRAIN_BIN", str(BUILD / "bin" / "mmtrain"))
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
BENCH = Path(os.environ.get("BENCH_DIR", BUILD / "bench_qlora"))
MODELS = os.environ.get("MODELS", "magihuman mistral3").split()
ARMS = os.environ.get("ARMS", "lora nf4 int8 lora2").split()
PEERS = os.environ.get("PEERS", "torch_peft torch_nf4").split()  # Magistral only
PEER_OF = {"torch_peft": "lora", "torch_nf4": "nf4"}
STEPS, GLOBAL, ROUNDS = int(os.environ.get("STEPS", 8)), int(os.environ.get("GLOBAL", 8)), int(os.environ.get("ROUNDS", 2))
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

PARAMS = re.compile(r"rank 0 holds params ([\d.]+) MiB")
QUANTIZED = re.compile(r"base_quant \w+: (\d+) frozen weights as rows of codes and scales, ([\d.]+) MB on this rank "
                       r"\(([\d.]+) MB in their gather dtype\)")


def run(label, cmd, log):
    return run_logged(label, cmd, log, ENV)


def lora_config(model, data, out, quant="none", weights=None):
    text = bench_models.config(model, data, out, STEPS, GLOBAL,
                               features=f"enable_lora: true, lora: {{rank: 8, alpha: 16, base_quant: {quant}}}")
    if weights:
        text = text.replace("  model_id: mistral3\n", f"  model_id: mistral3\n  model_name_or_path: {weights}\n", 1)
    return text


def peer_inputs(root, data):
    """Magistral's HF weights and every micro-batch of the run, as mmtrain's data path gives them."""
    weights, batches = root / "weights", root / "batches"
    cfg = root / "peer_inputs.yaml"
    cfg.write_text(lora_config("mistral3", data, root / "peer_inputs"))
    if not weights.exists():
        run("mistral3 weights", [BIN, "fixture", "mistral3-weights", "--config", str(cfg), "--out", str(weights), "--seed", "1"],
            root / "weights.log")
    accum = GLOBAL // 2  # micro-batch 1 on each of 2 ranks
    if not (batches / f"s{STEPS - 1}_r1_m{accum - 1}.safetensors").exists():
        batches.mkdir(exist_ok=True)
        for s in range(STEPS):
            for rank in range(2):
                for m in range(accum):
                    run(f"mistral3 batch s{s} r{rank} m{m}", [BIN, "debug", "collate", str(cfg), "--step", str(s), "--rank",
                                                             str(rank), "--world", "2", "--micro", str(m), "--out",
                                                             str(batches / f"s{s}_r{rank}_m{m}.safetensors")],
                        root / "collate.log")
    return weights, batches, accum


def peer_run(arm, r, root, weights, batches, accum):
    out = root / f"{arm}_r{r}.jsonl"
    run(f"mistral3 {arm} r{r}", [TORCHRUN, "--nproc-per-node", "2", str(Path(__file__).parent / "torch_qlora_peer.py"),
                                 "--arm", arm.removeprefix("torch_"), "--weights", str(weights),
                                 "--batches", str(batches), "--steps", str(STEPS), "--accum", str(accum), "--out", str(out)],
        str(out) + ".log")
    steps = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return {"peak_rss_mib": max(s["peak_rss_mb"] for s in steps),
            "step_ms": statistics.median(s["step_time_ms"] for s in steps if 2 < s["iteration"] <= STEPS),
            "quantized_weights": steps[0]["quantized"], "left_bf16": steps[0]["left_bf16"]}


def one_run(model, arm, r, data, root, weights=None):
    out = root / f"{arm}_r{r}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    cfg = out.with_suffix(".yaml")
    quant = arm if arm in ("nf4", "int8", "fp8_e4m3") else "none"
    cfg.write_text(lora_config(model, data, out, quant, weights))
    log = run(f"{model} {arm} r{r}", [TORCHRUN, "--nproc-per-node", "2", "--no-python", BIN, "train", str(cfg),
                                       "--set", "parallel.fsdp_plan.param_dtype=bf16"], str(out) + ".log")
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = [s["step_time_ms"] for s in steps if 2 < s["iteration"] <= STEPS]
    result = {"params_mib": float(PARAMS.search(log).group(1)), "peak_rss_mib": max(s["peak_rss_mb"] for s in steps),
              "gather_mib": statistics.median(s["fsdp_gather_mib"] for s in steps), "step_ms": statistics.median(timed)}
    if quant != "none":
        weights, stored, bf16 = QUANTIZED.search(log).groups()
        result.update(quantized_weights=int(weights), quantized_mb=float(stored), quantized_bf16_mb=float(bf16))
    return result


def bench_model(model):
    root = BENCH / model
    data = root / "data"
    root.mkdir(parents=True, exist_ok=True)
    if not data.exists():
        run(f"{model} data", [BIN, *bench_models.fixture_args(model, data, 32)], root / "fixture.log")
    peers = [p for p in PEERS if model == "mistral3" and PEER_OF[p] in ARMS]
    if peers:
        weights, batches, accum = peer_inputs(root, data)
        runs = interleaved(ARMS + peers, ROUNDS, lambda arm, r: peer_run(arm, r, root, weights, batches, accum)
                           if arm in peers else one_run(model, arm, r, data, root, weights))
    else:
        runs = interleaved(ARMS, ROUNDS, lambda arm, r: one_run(model, arm, r, data, root))
    med = {arm: {k: statistics.median(x[k] for x in runs[arm]) for k in runs[arm][0]} for arm in runs}
    base = med["lora"]
    keys = ("params_mib", "peak_rss_mib", "gather_mib", "step_ms")
    out = {"model": model, "arms": {arm: {k: round(v, 2) for k, v in med[arm].items()} for arm in med},
           "over_lora": {arm: {k: round(med[arm][k] / base[k], 3) for k in keys} for arm in ARMS if arm != "lora"}}
    if peers:  # mmtrain's arm over its PyTorch peer's, on the same weights and micro-batches
        out["mmtrain_over_peer"] = {f"{PEER_OF[p]}/{p}": {k: round(med[PEER_OF[p]][k] / med[p][k], 3)
                                                          for k in ("step_ms", "peak_rss_mib")} for p in peers}
    for arm in ARMS:
        if "quantized_mb" in med[arm]:
            out["over_lora"][arm]["quantized_over_bf16"] = round(med[arm]["quantized_mb"] / med[arm]["quantized_bf16_mb"], 3)
    print(f"bench: {model}: over lora {out['over_lora']}", file=sys.stderr)
    return out


def main():
    bench_each_model("qlora", BIN, BENCH, MODELS, bench_model, ranks=2, steps=STEPS, global_batch=GLOBAL, rounds=ROUNDS,
                     param_dtype="bf16")


if __name__ == "__main__":
    main()
