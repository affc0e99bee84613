"""What one sample costs against a training step, at the bench size (bench/bench_models.py), on this
machine: MagiHuman, one clip of 1 s at 128x192 (video grid 7 x 4 x 6, 26 audio and 20 text tokens:
214 packed tokens) at 32 steps with guidance (64 forwards), against the median training step on
samples of that shape (micro-batch 1); Magistral, 64 greedy tokens after one fixture prompt, against
the median training step on the fixture's records. Each figure is a median over its own repeats (a
sample's time is the sampler's own, without the process start); the report is their ratio.

    .venv/bin/python bench/sample_cost.py        # about 2 minutes on 2 cores; the last line is JSON
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_models import MODELS  # noqa: E402

MMTRAIN = str(REPO / "build" / "bin" / "mmtrain")
ENV = dict(os.environ, OMP_NUM_THREADS="2")


def mmtrain(*args):
    subprocess.run([MMTRAIN, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)


def median_step_ms(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return statistics.median(r["step_time_ms"] for r in records[2:] if "step_time_ms" in r)


def magihuman(tmp):
    data = tmp / "mh_data"
    mmtrain("fixture", "magihuman", "--out", str(data), "--samples", "16", "--video-grid", "7,4,6", "--audio-tokens", "26",
            "--text-tokens", "20", "--video-channels", "64", "--audio-channels", "32", "--text-channels", "64",
            "--format", "safetensors")
    config = tmp / "mh.yaml"
    config.write_text(MODELS["magihuman"] + f"""data:
  dataset_param: {{dataset_type: magihuman_precomputed, data_root: {data}}}
  dataloader_param: {{collate_param: {{model_name: magihuman}}}}
training: {{micro_batch_size: 1, train_iters: 8, seed: 5, lr: 1.0e-4, save: {tmp / 'mh_ckpt'}, save_interval: 8}}
logging: {{output_dir: {tmp / 'mh_run'}}}
""")
    mmtrain("train", str(config))
    step_ms = median_step_ms(tmp / "mh_run")
    gen = torch.Generator().manual_seed(0)
    for name, rows in (("p", 20), ("n", 24)):
        save_file({"prompt_embeds": torch.randn(rows, 64, generator=gen)}, str(tmp / f"{name}.safetensors"))
    (tmp / "prompts.jsonl").write_text('{"conditions": "p.safetensors", "seed": 1}\n')
    times = []
    for repeat in range(3):
        mmtrain("sample", "magihuman", str(config), "--load", str(tmp / "mh_ckpt"), "--prompts", str(tmp / "prompts.jsonl"),
                "--out", str(tmp / f"mh_samples{repeat}"), "--negative-conditions", str(tmp / "n.safetensors"),
                "--seconds", "1", "--resolution", "128x192", "--steps", "32")
        record = json.loads((tmp / f"mh_samples{repeat}" / "0000.json").read_text())
        times.append(record["sampling_s"] * 1000)
    return {"training_step_ms": round(step_ms, 1), "sample_ms": round(statistics.median(times), 1),
            "sample_over_step": round(statistics.median(times) / step_ms, 2)}


def mistral3(tmp):
    data = tmp / "m3_data"
    mmtrain("fixture", "mistral3", "--out", str(data), "--samples", "16", "--seed", "1")
    config = tmp / "m3.yaml"
    config.write_text(MODELS["mistral3"] + f"""data:
  dataset_param: {{dataset_type: huggingface, preprocess_parameters: {{model_name_or_path: {data}/tekken.json}},
                  basic_parameters: {{template: mistral, dataset: {data}/conversations.json, cutoff_len: 1024}}}}
  dataloader_param: {{collator_id: pixtral}}
training: {{micro_batch_size: 1, train_iters: 8, seed: 5, lr: 1.0e-4, save: {tmp / 'm3_ckpt'}, save_interval: 8}}
logging: {{output_dir: {tmp / 'm3_run'}}}
""")
    mmtrain("train", str(config))
    step_ms = median_step_ms(tmp / "m3_run")
    records = json.loads((data / "conversations.json").read_text())
    (data / "prompts.jsonl").write_text(json.dumps(records[0]) + "\n")
    times = []
    for repeat in range(3):
        out = tmp / f"m3_samples{repeat}"
        mmtrain("sample", "mistral3", str(config), "--load", str(tmp / "m3_ckpt"), "--prompts", str(data / "prompts.jsonl"),
                "--out", str(out), "--max-new-tokens", "64")
        line = json.loads((out / "completions.jsonl").read_text().splitlines()[0])
        times.append(line["seconds"] * 1000 / len(line["token_ids"]))
    layers, kv_heads, head_dim = 4, 2, 64
    return {"training_step_ms": round(step_ms, 1), "ms_per_token": round(statistics.median(times), 2),
            "kv_cache_bytes_per_token_fp32": 2 * layers * kv_heads * head_dim * 4,
            "magistral_small_kv_cache_bytes_per_token_bf16": 2 * 40 * 8 * 128 * 2}


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        result = {"bench": "sample_cost", "magihuman": magihuman(tmp), "mistral3": mistral3(tmp)}
    print(f"MagiHuman: one 32-step guided sample {result['magihuman']['sample_ms']} ms = "
          f"{result['magihuman']['sample_over_step']} training steps; Magistral: "
          f"{result['mistral3']['ms_per_token']} ms a token, a training step {result['mistral3']['training_step_ms']} ms")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
