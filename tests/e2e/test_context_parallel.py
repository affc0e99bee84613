"""Context parallelism and HSDP equal plain FSDP, end to end through torchrun: Ulysses 2, ring 2,
ring 4, hybrid ring 2 x Ulysses 2 (4 ranks) and HSDP 2 x 2 (4 ranks) against one rank, for 8 steps
in fp32 with recompute on, at the same global batch and sample order: per-step loss and final
parameters within 1e-5 relative.

  * tiny MagiHuman: every micro-batch packs two samples of different lengths (21 and 14 rows: 35,
    which divides by no CP degree, so padding rows are exercised);
  * tiny Magistral: frozen Pixtral tower on images of different sizes (every CP rank runs it
    whole), packing on (several conversations per row), causal LM split zigzag over the ring.
"""
import json
import shutil
import sys
from pathlib import Path

import pytest

from conftest import read_metrics, run_mmtrain, write_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parity"))
from mmtrain_util import load_mmtrain_params  # noqa: E402

ITERS = 8  # a wrong split shows in the first loss already; 8 steps carry any drift into the weights
# AdamW's first steps move each element by about lr * sign(grad): an element whose true grad is
# ~0 moves by +-lr on fp32 summation-order noise of ~1e-9 (CP sums a sample's grads over ranks).
# eps 1e-6 keeps such elements' updates proportional to their grads, so the comparison sees the
# math, not the sign of rounding noise (at eps 1e-8 the losses still agree to 1e-7, but single
# elements of a weight differ by 2 lr and the tensors' relative L2 reaches ~5e-5).
ADAM_EPS = 1.0e-6
ACCUM = 4  # micro-batches per step at data-parallel size 1; HSDP's 4 data-parallel ranks take 1 each

# name -> (world, keys of the parallel section)
LAYOUTS = {
    "ulysses2": (2, {"ulysses_parallel_size": 2}),
    "ring2": (2, {"ring_attention_size": 2}),
    "ring4": (4, {"ring_attention_size": 4}),
    "hybrid2x2": (4, {"ring_attention_size": 2, "ulysses_parallel_size": 2}),
    "hsdp2x2": (4, {"fully_shard_parallel_size": 2}),
}


def data_parallel(world: int, parallel: dict) -> int:
    return world // (parallel.get("ring_attention_size", 1) * parallel.get("ulysses_parallel_size", 1))


def parallel_yaml(parallel: dict) -> str:
    return "\n  ".join(f"{key}: {value}" for key, value in parallel.items())


def compare(tag: str, runs: dict):
    base_metrics, base_params = runs.pop("base")
    for name, (metrics, params) in runs.items():
        assert len(metrics) == len(base_metrics) == ITERS, (name, len(metrics))
        worst = 0.0
        for a, b in zip(metrics, base_metrics):
            rel = abs(a["loss"] - b["loss"]) / abs(b["loss"])
            worst = max(worst, rel)
            assert rel <= 1e-5, (tag, name, a["iteration"], a["loss"], b["loss"])
            assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * abs(b["grad_norm"]), (tag, name, a, b)
        worst_param = 0.0
        for key, ref in base_params.items():
            rel = ((params[key] - ref).norm() / ref.norm().clamp_min(1e-12)).item()
            worst_param = max(worst_param, rel)
            assert rel <= 1e-5, (tag, name, key, rel)
        print(f"[{tag} {name} vs 1 rank] max loss rel {worst:.2e}, max param rel {worst_param:.2e}")


# ------------------------------------------------------------------------------------ MagiHuman

MAGIHUMAN = ("{num_layers: 3, hidden_size: 64, head_dim: 16, num_query_groups: 2, video_in_channels: 16, "
             "audio_in_channels: 8, text_in_channels: 24, mm_layers: [0, 2], gelu7_layers: [0]}")


def magihuman_config(tmp: Path, data: Path, weights: Path, parallel: dict, accum: int) -> str:
    return f"""
parallel:
  {parallel_yaml(parallel)}
  fsdp_plan: {{apply_modules: ["dit.block.layers.{{*}}"]}}
model:
  model_id: magihuman
  model_name_or_path: {weights}
  config: {MAGIHUMAN}
data:
  dataset_param: {{dataset_type: magihuman_precomputed, data_root: {data}}}
  dataloader_param: {{collate_param: {{model_name: magihuman}}}}
features:
  recompute: true
  recompute_plan: {{apply_modules: ["dit.block.layers.{{*}}"]}}
training: {{micro_batch_size: 2, gradient_accumulation_steps: {accum}, train_iters: {ITERS}, lr: 2.0e-3,
           lr_decay_style: constant, clip_grad: 1.0, weight_decay: 0.01, adam_eps: {ADAM_EPS},
           save: {tmp / 'ckpt'}}}
logging: {{output_dir: {tmp / 'run'}}}
"""


@pytest.fixture(scope="module")
def magihuman_inputs(tmp_path_factory):
    """Samples of two shapes, interleaved by name (sample_N, sample_Nb) so that each micro-batch
    of 2 packs one of each; and random weights in the HF layout."""
    root = tmp_path_factory.mktemp("cp_magihuman")
    shapes = {"": ("2,2,3", "5", "4"), "b": ("1,2,3", "3", "5")}
    data = root / "data"
    for suffix, (grid, audio, text) in shapes.items():
        out = root / f"raw{suffix}"
        run_mmtrain(["fixture", "magihuman", "--out", str(out), "--samples", "8", "--seed", "3" if suffix else "4",
                     "--video-grid", grid, "--audio-tokens", audio, "--text-tokens", text, "--video-channels", "16",
                     "--audio-channels", "8", "--text-channels", "24"])
        for sub in ("latents", "audio_latents", "conditions"):
            (data / sub).mkdir(parents=True, exist_ok=True)
            for f in (out / sub).iterdir():
                shutil.copy(f, data / sub / f"{f.stem}{suffix}{f.suffix}")
    cfg = write_config(root / "w.yaml", magihuman_config(root, data, root / "unused", {}, 1))
    run_mmtrain(["fixture", "magihuman-weights", "--config", str(cfg), "--out", str(root / "base"), "--shards", "2"])
    return data, root / "base"


def test_magihuman_context_parallel_and_hsdp_equal_one_rank(tmp_path, magihuman_inputs):
    data, weights = magihuman_inputs
    runs = {}
    for name, (world, parallel) in {"base": (1, {}), **LAYOUTS}.items():
        tmp = tmp_path / name
        tmp.mkdir()
        accum = ACCUM // data_parallel(world, parallel)
        cfg = write_config(tmp / "c.yaml", magihuman_config(tmp, data, weights, parallel, accum))
        proc = run_mmtrain(["train", str(cfg)], world=world, timeout=600)
        if world > 1:
            assert "device mesh" in proc.stdout, proc.stdout
        runs[name] = read_metrics(tmp / "run"), load_mmtrain_params(str(tmp / "ckpt" / f"iter_{ITERS:07d}"))
    compare("magihuman", runs)

    # HSDP writes one set of shards: only the first replica (world ranks 0 and 1) holds rows.
    hsdp = tmp_path / "hsdp2x2" / "ckpt" / f"iter_{ITERS:07d}"
    index = json.loads((hsdp / "index.json").read_text())
    holders = {shard["rank"] for entry in index["tensors"].values() for shard in entry["shards"]
               if shard.get("rows", [0, 1])[0] < shard.get("rows", [0, 1])[1]}
    assert holders == {0, 1}, holders
    # ... and reshards on load: plain FSDP on 2 ranks (the same global batch) continues from it.
    tmp = tmp_path / "resume"
    tmp.mkdir()
    text = magihuman_config(tmp, data, weights, {}, ACCUM // 2).replace(f"train_iters: {ITERS}", f"train_iters: {ITERS + 1}")
    cfg = write_config(tmp / "c.yaml", text)
    proc = run_mmtrain(["train", str(cfg), "--set", f"training.load={hsdp}"], world=2, timeout=600)
    assert f"at iteration {ITERS} (saved on 4 ranks, now 2)" in proc.stdout, proc.stdout
    assert [m["iteration"] for m in read_metrics(tmp / "run")] == [ITERS + 1]


# ------------------------------------------------------------------------------------ Magistral

MISTRAL3 = """
    image_token_index: 10
    spatial_merge_size: 2
    freeze_vision: true
    text_config: {vocab_size: 288, hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4,
                  num_key_value_heads: 2, head_dim: 16, intermediate_size: 128, rope_theta: 10000.0}
    vision_config: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2, intermediate_size: 64,
                    patch_size: 4, image_size: 32, hidden_act: silu}"""


def mistral3_config(tmp: Path, data: Path, parallel: dict, accum: int) -> str:
    return f"""
parallel:
  {parallel_yaml(parallel)}
  fsdp_plan:
    apply_modules: ["model.vision_tower.transformer.layers.{{*}}", "model.language_model.layers.{{*}}"]
model:
  model_id: mistral3
  config:{MISTRAL3}
data:
  dataset_param:
    dataset_type: huggingface
    preprocess_parameters: {{model_name_or_path: {data / 'tekken.json'}}}
    basic_parameters: {{template: mistral, dataset: {data / 'conversations.json'}, cutoff_len: 192, packing: true}}
  dataloader_param: {{collator_id: pixtral}}
features:
  recompute: true
  recompute_plan: {{apply_modules: ["model.language_model.layers.{{*}}"]}}
training: {{micro_batch_size: 1, gradient_accumulation_steps: {accum}, train_iters: {ITERS}, lr: 2.0e-3,
           lr_decay_style: constant, clip_grad: 1.0, weight_decay: 0.01, adam_eps: {ADAM_EPS},
           save: {tmp / 'ckpt'}}}
logging: {{output_dir: {tmp / 'run'}}}
"""


def test_magistral_context_parallel_and_hsdp_equal_one_rank(tmp_path_factory, tmp_path):
    data = tmp_path_factory.mktemp("cp_magistral") / "data"
    run_mmtrain(["fixture", "mistral3", "--out", str(data), "--samples", "40", "--seed", "7", "--min-side", "8",
                 "--max-side", "24"])
    runs = {}
    for name, (world, parallel) in {"base": (1, {}), **LAYOUTS}.items():
        tmp = tmp_path / name
        tmp.mkdir()
        accum = ACCUM // data_parallel(world, parallel)
        cfg = write_config(tmp / "c.yaml", mistral3_config(tmp, data, parallel, accum))
        run_mmtrain(["train", str(cfg)], world=world, timeout=600)
        runs[name] = read_metrics(tmp / "run"), load_mmtrain_params(str(tmp / "ckpt" / f"iter_{ITERS:07d}"))
    compare("magistral", runs)


def test_ulysses_degree_must_divide_the_heads(tmp_path, magihuman_inputs):
    data, weights = magihuman_inputs
    cfg = write_config(tmp_path / "c.yaml", magihuman_config(tmp_path, data, weights, {"ulysses_parallel_size": 2}, 4))
    proc = run_mmtrain(["train", str(cfg), "--set", "model.config.hidden_size=48", "--set",
                        "model.config.num_query_groups=1"], world=2, check=False, timeout=300)
    assert proc.returncode != 0
    assert "parallel.ulysses_parallel_size: 2 does not divide the 3 query heads" in proc.stderr, proc.stderr[-2000:]
