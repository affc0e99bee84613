"""PyTorch FSDP2 side of bench/fsdp_vs_torch.sh, plus its fixture and its summary.

Contract:
  prepare --dir D     reads the size knobs from the environment (KNOBS below), writes
                      D/fixture/{model,tokens}.safetensors (reused when the knobs are unchanged),
                      D/bench.yaml (the one config every arm reads) and D/bench_meta.json; clears
                      old D/runs.
  torch --dir D --adamw {fused,single} --out O
                      PyTorch FSDP2 (tests/parity/reference_transformer.py) on WORLD gloo ranks,
                      one intra-op thread each, output O/metrics.jsonl.
The summary of a run: bench/bench_summary.py.
Step time on both sides spans forward + backward of every micro-batch, grad-norm/clip and the
optimizer step (the reference starts its clock before the first micro-batch's forward and stops
it after optimizer.step() and zero_grad()).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))

import config_io  # noqa: E402
import mmtrain_util as mu  # noqa: E402
import reference_transformer as rt  # noqa: E402

# knob -> default; the compute-dominated size of the brief. HIDDEN alone rescales FFN (x 2.75).
KNOBS = {"STEPS": 20, "WARMUP": 3, "LAYERS": 8, "HIDDEN": 1024, "HEADS": 16, "KV_HEADS": 4,
         "FFN": None, "VOCAB": 8192, "SEQ": 1024, "MBS": 1, "WORLD": 2, "SAMPLES": 64,
         "PARAM_DTYPE": "bf16", "SEED": 1234}


def knobs() -> dict:
    values = {}
    for name, default in KNOBS.items():
        raw = os.environ.get(name)
        if raw is None or raw == "":
            values[name] = default
        else:
            values[name] = raw if isinstance(default, str) else int(raw)
    if values["FFN"] is None:
        values["FFN"] = values["HIDDEN"] * 11 // 4  # 2816 at hidden 1024
    return values


def prepare(d: str) -> None:
    k = knobs()
    model_cfg = dict(vocab_size=k["VOCAB"], hidden_size=k["HIDDEN"], num_layers=k["LAYERS"],
                     num_heads=k["HEADS"], num_kv_heads=k["KV_HEADS"], ffn_hidden_size=k["FFN"],
                     rope_theta=10000.0, rms_norm_eps=1e-6)
    rt.ModelConfig.from_dict(model_cfg)  # validate before spending time on the fixture
    fixture_dir = os.path.join(d, "fixture")
    fixture_key = dict(model_cfg, samples=k["SAMPLES"], seq_len=k["SEQ"] + 1, seed=k["SEED"])
    key_path = os.path.join(fixture_dir, "fixture_key.json")
    model_path = os.path.join(fixture_dir, "model.safetensors")
    tokens_path = os.path.join(fixture_dir, "tokens.safetensors")
    if not (os.path.exists(key_path) and json.load(open(key_path)) == fixture_key):
        # seq_len + 1 tokens per sample: the model trains on SEQ positions.
        rt.make_fixture(fixture_dir, model_cfg, k["SAMPLES"], k["SEQ"] + 1, k["SEED"])
        json.dump(fixture_key, open(key_path, "w"))
    for run in ("mmtrain_run", "torch_run", "runs"):
        shutil.rmtree(os.path.join(d, run), ignore_errors=True)
    cfg = mu.mmtrain_config(model_path, tokens_path, model_cfg, os.path.join(d, "mmtrain_run"),
                            micro_batch_size=k["MBS"], gradient_accumulation_steps=1,
                            train_iters=k["WARMUP"] + k["STEPS"], lr=3e-4, lr_min=3e-5,
                            lr_warmup_ratio=0.1, clip_grad=1.0, param_dtype=k["PARAM_DTYPE"],
                            reduce_dtype="fp32", prefetch=1)
    config_io.write_yaml(cfg, os.path.join(d, "bench.yaml"))
    json.dump(k, open(os.path.join(d, "bench_meta.json"), "w"))
    print(json.dumps({"bench_dir": d, **k}))


def run_torch(d: str, adamw: str, out: str) -> None:
    k = json.load(open(os.path.join(d, "bench_meta.json")))
    cfg = config_io.apply_overrides(config_io.load_yaml(os.path.join(d, "bench.yaml")),
                                    [f"logging.output_dir={out}"])
    result = rt.train(cfg, k["WORLD"], fsdp=True, threads=1, adamw=adamw)
    print(json.dumps({"torch_iterations": len(result.metrics), "final_loss": result.metrics[-1]["loss"]}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cmd", choices=["prepare", "torch"])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--adamw", choices=rt.ADAMW_KINDS, default="fused", help="torch: AdamW implementation")
    parser.add_argument("--out", help="torch: output directory (metrics.jsonl)")
    args = parser.parse_args()
    d = os.path.abspath(args.dir)
    os.makedirs(d, exist_ok=True)
    if args.cmd == "prepare":
        prepare(d)
    else:
        run_torch(d, args.adamw, os.path.abspath(args.out or os.path.join(d, "torch_run")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
