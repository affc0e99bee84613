"""Mistral3 (Magistral architecture, tiny) trained end to end on `fixture mistral3` image-text
conversations through the "huggingface" dataset and the "pixtral" collator, under torchrun:
  * 2 ranks equal 1 rank at the same global batch (per-step loss and final params within 1e-5);
  * resume from a mid-run checkpoint equals the uninterrupted run bitwise (loss, grad norm);
  * 200 steps: the loss falls (last-20 mean below half the first-20 mean), no NaN;
  * bad records are dropped and counted by reason in the log, training goes on;
  * packed rows (packing: true, micro_batch_size 1) train with finite loss;
  * an image whose pixels do not decode is skipped with one warning naming the file; training goes on.
"""
import math
import shutil
import sys
from pathlib import Path

import pytest

from conftest import read_metrics, run_mmtrain, write_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parity"))
from mmtrain_util import load_mmtrain_params  # noqa: E402

MODEL = """
    image_token_index: 10
    spatial_merge_size: 2
    freeze_vision: true
    text_config: {vocab_size: 288, hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4,
                  num_key_value_heads: 2, head_dim: 16, intermediate_size: 128, rope_theta: 10000.0}
    vision_config: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2, intermediate_size: 64,
                    patch_size: 4, image_size: 32, hidden_act: silu}"""


def config(tmp: Path, data: Path, *, mbs=2, accum=1, iters=10, save_interval=0, exit_interval=0, load="",
           basic_extra="") -> str:
    return f"""
parallel:
  fsdp_plan:
    apply_modules: ["model.vision_tower.transformer.layers.{{*}}", "model.language_model.layers.{{*}}"]
    param_dtype: fp32
    reduce_dtype: fp32
model:
  model_id: mistral3
  config:{MODEL}
data:
  dataset_param:
    dataset_type: huggingface
    preprocess_parameters: {{model_name_or_path: {data / 'tekken.json'}}}
    basic_parameters: {{template: mistral, dataset: {data / 'conversations.json'}, cutoff_len: 256{basic_extra}}}
  dataloader_param: {{collator_id: pixtral}}
features:
  recompute: true
  recompute_plan: {{apply_modules: ["model.language_model.layers.{{*}}"]}}
training: {{micro_batch_size: {mbs}, gradient_accumulation_steps: {accum}, train_iters: {iters}, lr: 2.0e-3,
           lr_warmup_ratio: 0.05, lr_decay_style: cosine, clip_grad: 1.0, weight_decay: 0.01,
           save: {tmp / 'ckpt'}, save_interval: {save_interval}, exit_interval: {exit_interval}, load: "{load}"}}
logging: {{output_dir: {tmp / 'run'}}}
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mistral3_data") / "fx"
    run_mmtrain(["fixture", "mistral3", "--out", str(root), "--samples", "48", "--seed", "5", "--bad-records"])
    return root


def train(tmp: Path, data: Path, world: int = 1, **kw):
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = write_config(tmp / "c.yaml", config(tmp, data, **kw))
    proc = run_mmtrain(["train", str(cfg)], world=world, timeout=600)
    return read_metrics(tmp / "run"), proc


def test_two_ranks_equal_one(tmp_path, data):
    base, _ = train(tmp_path / "w1", data, 1, accum=2)
    two, _ = train(tmp_path / "w2", data, 2, accum=1)
    assert [m["iteration"] for m in two] == list(range(1, 11))
    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(two, base))
    assert worst <= 1e-5, worst
    p1 = load_mmtrain_params(str(tmp_path / "w1" / "ckpt" / "iter_0000010"))
    p2 = load_mmtrain_params(str(tmp_path / "w2" / "ckpt" / "iter_0000010"))
    worst_param = max(((p2[k] - v).norm() / v.norm().clamp_min(1e-12)).item() for k, v in p1.items())
    assert worst_param <= 1e-5, worst_param
    print(f"[mistral3 W=2 vs W=1] max loss rel {worst:.2e}, max param rel {worst_param:.2e}")


def test_resume_equals_uninterrupted(tmp_path, data):
    straight, _ = train(tmp_path / "straight", data, 2, iters=10)
    # Stop after step 5 of the same 10-step schedule, then resume from that checkpoint.
    train(tmp_path / "first", data, 2, iters=10, save_interval=5, exit_interval=5)
    resumed, proc = train(tmp_path / "second", data, 2, iters=10, load=str(tmp_path / "first" / "ckpt"))
    assert "resumed from" in proc.stdout
    assert [m["iteration"] for m in resumed] == list(range(6, 11))
    for a, b in zip(resumed, straight[5:]):
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"] and a["lr"] == b["lr"], (a, b)


def test_loss_falls_over_200_steps(tmp_path, data):
    metrics, _ = train(tmp_path / "long", data, 1, mbs=4, iters=200)
    losses = [m["loss"] for m in metrics]
    assert all(math.isfinite(x) for x in losses)
    first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    print(f"[mistral3 tiny, 200 steps] mean loss first 20 {first:.3f}, last 20 {last:.3f}")
    assert last < 0.5 * first, (first, last)


def test_bad_records_are_counted_and_skipped(tmp_path, data):
    _, proc = train(tmp_path / "bad", data, 1, iters=2)
    line = next(l for l in proc.stdout.splitlines() if "dataset huggingface" in l)
    assert "54 records, 48 kept, 6 dropped" in line, line
    for reason in ("1 image file missing", "1 image file unreadable", "1 no assistant turn",
                   "1 <image> count differs from the image list", "1 image tokens cut by truncation",
                   "1 malformed record"):
        assert reason in line, (reason, line)


def test_packed_rows_train(tmp_path, data):
    metrics, proc = train(tmp_path / "packed", data, 2, mbs=1, iters=6, basic_extra=", packing: true")
    assert "packed into" in proc.stdout
    assert all(math.isfinite(m["loss"]) for m in metrics) and len(metrics) == 6


def test_image_with_damaged_pixels_is_a_named_skip(tmp_path, data):
    """A PNG whose header reads but whose pixel data is cut passes the start-up check; when its
    sample is built it is skipped with one warning naming the file, and the run trains on."""
    damaged = tmp_path / "data"
    shutil.copytree(data, damaged)
    image = damaged / "images" / "img_0_0.png"
    image.write_bytes(image.read_bytes()[:60])
    cfg = write_config(tmp_path / "c.yaml", config(tmp_path, damaged, iters=2))
    proc = run_mmtrain(["train", str(cfg)], check=False)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    warnings = [line for line in proc.stderr.splitlines() if "skipped" in line]
    assert len(warnings) == 1, proc.stderr[-2000:]
    assert f"sample 0 skipped: image {image}: cannot decode" in warnings[0] and "(1 skipped so far)" in warnings[0]
    metrics = read_metrics(tmp_path / "run")
    assert [m["iteration"] for m in metrics] == [1, 2] and all(math.isfinite(m["loss"]) for m in metrics)


def test_chunked_loss_trains_like_full_logits(tmp_path, data):
    """model.config.loss_chunk_size: lm_head + cross-entropy 16 tokens at a time (no [tokens, vocab]
    logits kept) follows the full-logits run: per-step loss and grad norm within 1e-5 in fp32."""
    full, _ = train(tmp_path / "full", data, 1)
    cfg = write_config(tmp_path / "chunked.yaml", config(tmp_path / "chunked", data))
    run_mmtrain(["train", str(cfg), "--set", "model.config.loss_chunk_size=16"])
    chunked = read_metrics(tmp_path / "chunked" / "run")
    worst = max(max(abs(a["loss"] - b["loss"]) / abs(b["loss"]), abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"])
                for a, b in zip(chunked, full))
    print(f"[mistral3 chunked loss vs full logits, 10 steps] max rel diff {worst:.2e}")
    assert len(chunked) == len(full) == 10 and worst <= 1e-5, worst
