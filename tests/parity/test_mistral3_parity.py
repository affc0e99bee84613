"""mistral3 (Magistral-Small-2509 architecture) against HF transformers' Mistral3ForConditionalGeneration.

A tiny random model keeps every code path of the 24B one: Pixtral with 2
layers, SiLU-gated MLP, 2D RoPE and per-image block-diagonal attention; the projector with
PatchMerger (odd patch grids drop their last row/column); a Mistral LM with GQA 4:2 and
head_dim (24) != hidden/heads (16); an untied lm_head; [IMG]/[IMG_BREAK]/[IMG_END] = 10/12/13.
One batch: sample 0 holds two images of different sizes, sample 1 a third one; labels use -100.

  1. fp32 `mmtrain debug step` vs HF eager fp32 forward + backward with vision tower and projector
     frozen: vision-tower output, projector output, logits, loss and every trainable gradient
     within 1e-5 relative L2 (per tensor); frozen params get no grad.
  2. The same with freeze_vision: false (vision and projector grads too).
  3. Both checkpoint name schemes (model.language_model.* and legacy language_model.model.*,
     vision_tower.*, ...) and save_pretrained's directory load to the same step.
  3b. bf16: mmtrain is as close to HF fp32 as HF bf16 is (within 2x per tensor).
  4. Vision attention is per image: the two images of sample 0 encoded in one batch equal each
     encoded alone (HF), mmtrain's features equal those, and image A's features do not change when
     only image B's pixels do (so no gradient crosses images either).
  5. The two samples packed into one row (cu_seqlens) equal HF on the unpacked batch.
  6. An [IMG] count mismatch and config values that would change the math are errors.

Skips when the binary (MMTRAIN_BIN, default build/bin/mmtrain) or transformers is missing.
"""
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
import mmtrain_util as mu  # noqa: E402
_e2e = mu.e2e_helpers()
run_mmtrain, write_config, mmtrain_bin = _e2e.run_mmtrain, _e2e.write_config, _e2e.mmtrain_bin

# fp32 on both sides; only summation orders differ (patch conv as a matmul, SDPA vs eager).
RTOL = 1e-5
BF16_FACTOR, BF16_FLOOR = 2.0, 1e-3
IMG, IMG_BREAK, IMG_END = 10, 12, 13

TEXT = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=24, intermediate_size=96, rms_norm_eps=1e-5, rope_theta=1000.0, hidden_act="silu",
            max_position_embeddings=512, sliding_window=None, tie_word_embeddings=False)
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48, patch_size=4,
              image_size=64, num_channels=3, hidden_act="silu", rope_theta=10000.0)
# (H, W) per image: A 28x20 -> 7x5 patches (odd: drops a row and a column) -> 3x2 = 6 tokens;
# B 16x32 -> 4x8 -> 2x4 = 8 tokens (in sample 0 with A); C 12x12 -> 3x3 -> 1x1 = 1 token (sample 1).
IMAGE_SIZES = [(28, 20), (16, 32), (12, 12)]
SEQ = 40


def hf_config(freeze=True):
    from transformers import Mistral3Config
    return Mistral3Config(text_config=dict(model_type="mistral", **TEXT), vision_config=dict(model_type="pixtral", **VISION),
                          image_token_index=IMG, spatial_merge_size=2, projector_hidden_act="gelu",
                          multimodal_projector_bias=False, vision_feature_layer=-1, tie_word_embeddings=False)


def make_hf_model(seed=0):
    from transformers import Mistral3ForConditionalGeneration
    torch.manual_seed(seed)
    model = Mistral3ForConditionalGeneration(hf_config()).float().eval()
    model.config._attn_implementation = "eager"
    for sub in (model.model.vision_tower, model.model.language_model):
        sub.config._attn_implementation = "eager"
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms: around 1, so a wrong or missing gamma shows
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
    assert model.lm_head.weight.data_ptr() != model.model.language_model.embed_tokens.weight.data_ptr(), "lm_head got tied"
    return model


def image_tokens(h, w):
    rows, cols = h // 8, w // 8  # patch 4 x merge 2
    toks = ([IMG] * cols + [IMG_BREAK]) * rows
    toks[-1] = IMG_END
    return toks


def make_batch(seed=0):
    g = torch.Generator().manual_seed(seed + 7)
    text = lambda n: torch.randint(20, 128, (n,), generator=g).tolist()
    a, b, c = (image_tokens(*s) for s in IMAGE_SIZES)
    prompt0 = [1, 3] + a + text(3) + b + text(2) + [4]
    prompt1 = [1, 3] + text(4) + c + text(3) + [4]
    rows, labels = [], []
    for prompt in (prompt0, prompt1):
        answer = text(SEQ - len(prompt) - 1) + [2]
        ids = prompt + answer
        rows.append(ids)
        labels.append([-100] * len(prompt) + answer)
    labels[1][-3:] = [-100] * 3  # an ignored span inside a supervised part too
    hmax, wmax = max(s[0] for s in IMAGE_SIZES), max(s[1] for s in IMAGE_SIZES)
    pixels = torch.zeros(len(IMAGE_SIZES), 3, hmax, wmax)
    for i, (h, w) in enumerate(IMAGE_SIZES):
        pixels[i, :, :h, :w] = torch.randn(3, h, w, generator=g)
    return {
        "input_ids": torch.tensor(rows, dtype=torch.long),
        "labels": torch.tensor(labels, dtype=torch.long),
        "position_ids": torch.arange(SEQ, dtype=torch.long).unsqueeze(0).repeat(2, 1),
        "pixel_values": pixels,
        "image_sizes": torch.tensor(IMAGE_SIZES, dtype=torch.long),
    }


def hf_step(model, batch, freeze):
    """HF fp32 forward + backward; returns loss, named outputs and grads by HF key."""
    model.zero_grad(set_to_none=True)
    for p in model.parameters():
        p.requires_grad_(True)
    if freeze:
        model.model.vision_tower.requires_grad_(False)
        model.model.multi_modal_projector.requires_grad_(False)
    captured = {}
    h1 = model.model.vision_tower.register_forward_hook(
        lambda m, i, o: captured.__setitem__("vision_features", o.last_hidden_state.squeeze(0)))
    h2 = model.model.multi_modal_projector.register_forward_hook(
        lambda m, i, o: captured.__setitem__("projected_features", o))
    try:
        out = model(input_ids=batch["input_ids"], labels=batch["labels"], position_ids=batch["position_ids"],
                    pixel_values=batch["pixel_values"], image_sizes=batch["image_sizes"])
    finally:
        h1.remove()
        h2.remove()
    out.loss.backward()
    result = {"loss": out.loss.detach(), "logits": out.logits.detach()}
    result.update({k: v.detach() for k, v in captured.items()})
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return result, grads


def rel_l2(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()


LEGACY = [("model.language_model.", "language_model.model."), ("lm_head.", "language_model.lm_head."),
          ("model.vision_tower.", "vision_tower."), ("model.multi_modal_projector.", "multi_modal_projector.")]


def legacy_name(key):
    for new, old in LEGACY:
        if key.startswith(new):
            return old + key[len(new):]
    raise AssertionError(key)


def config_yaml(tmp, weights, freeze):
    model_config = json.loads(Path(weights, "config.json").read_text()) if Path(weights).is_dir() else None
    if model_config is None:  # a single legacy file: the config of the HF directory next to it
        model_config = json.loads(Path(tmp, "hf", "config.json").read_text())
    model_config["freeze_vision"] = freeze
    return f"""parallel:
  fully_shard_parallel_size: auto
  fsdp_plan:
    apply_modules: ["model.vision_tower.transformer.layers.{{*}}", "model.language_model.layers.{{*}}"]
    param_dtype: fp32
    reduce_dtype: fp32
model:
  model_id: mistral3
  checkpoint_path: {weights}
  config: {json.dumps(model_config)}
data:
  dataset_param:
    dataset_type: token_file
    path: unused.safetensors
  dataloader_param:
    collate_param:
      model_name: causal_lm
training:
  micro_batch_size: 2
  gradient_accumulation_steps: 1
  seed: 42
  lr: 1.0e-4
  train_iters: 1
  save: ""
logging:
  output_dir: {tmp / 'run'}
  progress: false
"""


@pytest.fixture(scope="module")
def m3(tmp_path_factory):
    mmtrain_bin()
    tmp = tmp_path_factory.mktemp("mistral3")
    model = make_hf_model()
    # save_pretrained's own names (transformers 5.24 writes the legacy ones), plus one file per scheme.
    model.save_pretrained(tmp / "hf", safe_serialization=True)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / "new.safetensors"))
    save_file({legacy_name(k): v for k, v in state.items()}, str(tmp / "legacy.safetensors"))
    batch = make_batch()
    save_file({k: v.contiguous() for k, v in batch.items()}, str(tmp / "batch.safetensors"))

    def step(weights, freeze, tag, extra=()):
        cfg = write_config(tmp / f"{tag}.yaml", config_yaml(tmp, weights, freeze))
        out = tmp / f"{tag}.out.safetensors"
        run_mmtrain(["debug", "step", str(cfg), "--batch", str(tmp / "batch.safetensors"), "--out", str(out), *extra])
        return load_file(str(out))

    return dict(tmp=tmp, model=model, state=state, batch=batch, step=step)


def compare(m3, freeze, parity_report):
    ref, ref_grads = hf_step(m3["model"], m3["batch"], freeze)
    got = m3["step"](m3["tmp"] / "hf", freeze, f"hf_freeze{int(freeze)}")
    tag = "frozen vision" if freeze else "trained vision"
    worst = {}
    for name in ("loss", "vision_features", "projected_features", "logits"):
        assert got[name].shape == ref[name].shape, (name, got[name].shape, ref[name].shape)
        worst[name] = rel_l2(got[name], ref[name])
    got_grads = {k[len("grad."):]: v for k, v in got.items() if k.startswith("grad.")}
    assert set(got_grads) == set(ref_grads), (sorted(set(got_grads) ^ set(ref_grads)))
    if freeze:
        assert not any(k.startswith(("model.vision_tower.", "model.multi_modal_projector.")) for k in got_grads)
    groups = {}
    for key, want in ref_grads.items():
        group = key.split(".")[1] if key.startswith("model.") else key.split(".")[0]
        groups[group] = max(groups.get(group, 0.0), rel_l2(got_grads[key], want))
    for name, value in list(worst.items()) + [(f"grad[{g}] (max)", v) for g, v in groups.items()]:
        parity_report(f"mistral3 fp32 vs HF ({tag}): {name} rel L2 {value:.2e}")
    bad = {k: v for k, v in list(worst.items()) + list(groups.items()) if not v <= RTOL}
    assert not bad, bad
    return got


def test_fp32_frozen_vision_matches_hf(m3, parity_report):
    compare(m3, True, parity_report)


def test_fp32_trained_vision_matches_hf(m3, parity_report):
    compare(m3, False, parity_report)


def test_bf16_as_close_to_fp32_as_hf_bf16(m3, parity_report):
    """param_dtype bf16: mmtrain's distance to HF fp32 is within BF16_FACTOR of HF bf16's own
    distance (measured ratios 0.85-1.1 on this config; bf16 rounding differs between valid
    implementations, so no tighter bound is meaningful), and bf16 is really in effect."""
    model, batch = m3["model"], m3["batch"]
    ref32, grads32 = hf_step(model, batch, True)
    model16 = make_hf_model().to(torch.bfloat16)
    batch16 = dict(batch, pixel_values=batch["pixel_values"].to(torch.bfloat16))
    ref16, grads16 = hf_step(model16, batch16, True)
    got = m3["step"](m3["tmp"] / "hf", True, "bf16", ["--set", "parallel.fsdp_plan.param_dtype=bf16",
                                                       "--set", "parallel.fsdp_plan.reduce_dtype=bf16"])
    pairs = [(k, got[k], ref16[k], ref32[k]) for k in ("loss", "vision_features", "projected_features", "logits")]
    pairs += [("grad." + k, got["grad." + k], grads16[k], grads32[k]) for k in grads32]
    worst = 0.0
    for name, cpp, hf16, hf32 in pairs:
        mine, theirs = rel_l2(cpp, hf32), rel_l2(hf16.float(), hf32)
        assert mine <= max(BF16_FLOOR, BF16_FACTOR * theirs), (name, mine, theirs)
        worst = max(worst, mine / max(theirs, 1e-12))
    parity_report(f"mistral3 bf16: max over tensors of |mmtrain bf16 - HF fp32| / |HF bf16 - HF fp32| = {worst:.2f}")
    assert rel_l2(got["logits"], ref32["logits"]) > 1e-4  # bf16 really applied


def test_both_key_schemes_load(m3):
    """transformers >= 4.52 names, legacy names and save_pretrained's directory: the same step."""
    new = m3["step"](m3["tmp"] / "new.safetensors", True, "new_names")
    old = m3["step"](m3["tmp"] / "legacy.safetensors", True, "legacy_names")
    hf_dir = m3["step"](m3["tmp"] / "hf", True, "hf_dir")
    for other in (old, hf_dir):
        assert set(new) == set(other)
        for k in new:
            assert torch.equal(new[k], other[k]), k


def test_vision_attention_is_per_image(m3):
    """HF: images of one batch encoded together equal each alone. mmtrain: image A's features do
    not change when image B's pixels do (no cross-image attention), and the grid order holds."""
    model, batch = m3["model"], m3["batch"]
    vt = model.model.vision_tower
    with torch.no_grad():
        together = vt(batch["pixel_values"][:2], image_sizes=batch["image_sizes"][:2]).last_hidden_state.squeeze(0)
        alone = [vt(batch["pixel_values"][i:i + 1], image_sizes=batch["image_sizes"][i:i + 1]).last_hidden_state.squeeze(0)
                 for i in range(2)]
    assert rel_l2(together, torch.cat(alone)) < RTOL

    base = m3["step"](m3["tmp"] / "hf", True, "per_image_base")
    changed = dict(batch)
    changed["pixel_values"] = batch["pixel_values"].clone()
    changed["pixel_values"][1] += 1.0  # image B only
    path = m3["tmp"] / "batch_changed.safetensors"
    save_file({k: v.contiguous() for k, v in changed.items()}, str(path))
    cfg = m3["tmp"] / "per_image_base.yaml"
    out = m3["tmp"] / "changed.out.safetensors"
    run_mmtrain(["debug", "step", str(cfg), "--batch", str(path), "--out", str(out)])
    got = load_file(str(out))
    pa = (IMAGE_SIZES[0][0] // 4) * (IMAGE_SIZES[0][1] // 4)
    pb = (IMAGE_SIZES[1][0] // 4) * (IMAGE_SIZES[1][1] // 4)
    assert torch.equal(got["vision_features"][:pa], base["vision_features"][:pa])
    assert not torch.equal(got["vision_features"][pa:pa + pb], base["vision_features"][pa:pa + pb])
    assert torch.equal(got["vision_features"][pa + pb:], base["vision_features"][pa + pb:])
    assert rel_l2(base["vision_features"], torch.cat([alone[0], alone[1], base["vision_features"][pa + pb:]])) < RTOL



def test_image_token_mismatch_is_an_error(m3):
    """One [IMG] fewer than the images give: an error naming both counts, as HF's ValueError."""
    bad = dict(m3["batch"])
    bad["input_ids"] = bad["input_ids"].clone()
    bad["input_ids"][0, 2] = 50  # the first [IMG] of image A
    path = m3["tmp"] / "batch_mismatch.safetensors"
    save_file({k: v.contiguous() for k, v in bad.items()}, str(path))
    m3["step"](m3["tmp"] / "new.safetensors", True, "mismatch_cfg")  # writes the config
    proc = run_mmtrain(["debug", "step", str(m3["tmp"] / "mismatch_cfg.yaml"), "--batch", str(path),
                        "--out", str(m3["tmp"] / "mismatch.out.safetensors")], check=False)
    assert proc.returncode != 0
    assert "14 [IMG] tokens" in proc.stderr + proc.stdout and "15 features" in proc.stderr + proc.stdout


@pytest.mark.parametrize("path,value,message", [
    (("tie_word_embeddings",), True, "tie_word_embeddings"),
    (("text_config", "tie_word_embeddings"), True, "tie_word_embeddings"),
    (("text_config", "sliding_window"), 4096, "sliding_window"),
    (("text_config", "rope_parameters"), {"rope_theta": 1e6, "rope_type": "yarn"}, "rope_type"),
    (("vision_config", "hidden_act"), "relu", "hidden_act"),
    (("text_config", "bogus_key"), 1, "text_config.bogus_key: unknown key for mistral3"),
])
def test_config_values_that_change_the_math_are_refused(m3, path, value, message):
    config = json.loads(Path(m3["tmp"], "hf", "config.json").read_text())
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    text = config_yaml(m3["tmp"], m3["tmp"] / "new.safetensors", True)
    text = "\n".join(f"  config: {json.dumps(config)}" if line.startswith("  config:") else line
                     for line in text.splitlines())
    cfg = write_config(m3["tmp"] / "bad_config.yaml", text)
    proc = run_mmtrain(["debug", "step", str(cfg), "--batch", str(m3["tmp"] / "batch.safetensors"),
                        "--out", str(m3["tmp"] / "bad.out.safetensors")], check=False)
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout, proc.stderr[-2000:]


def test_packed_row_matches_hf_unpacked(m3, parity_report):
    """The batch's two samples packed into one row (cu_seqlens, positions restarting) give HF's
    unpacked logits, loss and grads: the label crossing the boundary is prompt (-100)."""
    ref, ref_grads = hf_step(m3["model"], m3["batch"], True)
    b = m3["batch"]
    packed = {
        "input_ids": b["input_ids"].reshape(1, -1), "labels": b["labels"].reshape(1, -1),
        "position_ids": b["position_ids"].reshape(1, -1), "cu_seqlens": torch.tensor([0, SEQ, 2 * SEQ], dtype=torch.int32),
        "pixel_values": b["pixel_values"], "image_sizes": b["image_sizes"],
    }
    assert packed["labels"][0, SEQ] == -100
    path = m3["tmp"] / "batch_packed.safetensors"
    save_file({k: v.contiguous() for k, v in packed.items()}, str(path))
    m3["step"](m3["tmp"] / "new.safetensors", True, "packed_cfg")
    out = m3["tmp"] / "packed.out.safetensors"
    run_mmtrain(["debug", "step", str(m3["tmp"] / "packed_cfg.yaml"), "--batch", str(path), "--out", str(out)])
    got = load_file(str(out))
    figures = {"loss": rel_l2(got["loss"], ref["loss"]),
               "logits": rel_l2(got["logits"].reshape(ref["logits"].shape), ref["logits"])}
    figures["grads (max)"] = max(rel_l2(got["grad." + k], v) for k, v in ref_grads.items())
    for name, value in figures.items():
        parity_report(f"mistral3 packed row vs HF unpacked: {name} rel L2 {value:.2e}")
    assert all(v <= RTOL for v in figures.values()), figures


def test_hf_round_trip_through_a_checkpoint(m3, tmp_path, parity_report):
    """`convert Mistral3Converter hf_to_dcp` (model config from the directory's config.json), then
    `convert mistral3 ckpt-to-hf` with that directory as reference: the same shard files, keys,
    dtypes and values, and transformers loads the result to the original model's state."""
    hf = m3["tmp"] / "hf"
    run_mmtrain(["convert", "Mistral3Converter", "hf_to_dcp", "--hf_dir", str(hf), "--save_dir", str(tmp_path / "ckpt")])
    run_mmtrain(["convert", "mistral3", "ckpt-to-hf", "--load_dir", str(tmp_path / "ckpt"),
                 "--save_dir", str(tmp_path / "out"), "--model_assets_dir", str(hf)])
    shards = sorted(p.name for p in hf.glob("*.safetensors"))
    assert shards and shards == sorted(p.name for p in (tmp_path / "out").glob("*.safetensors"))
    identical = 0
    for name in shards:
        a, b = load_file(str(hf / name)), load_file(str(tmp_path / "out" / name))
        assert list(a) == list(b) or set(a) == set(b)
        for k in a:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        identical += (hf / name).read_bytes() == (tmp_path / "out" / name).read_bytes()
    reloaded = transformers.Mistral3ForConditionalGeneration.from_pretrained(str(tmp_path / "out"))
    original = m3["model"].state_dict()
    for k, v in reloaded.state_dict().items():
        assert torch.equal(v, original[k]), k
    parity_report(f"mistral3 HF -> checkpoint -> HF: {len(shards)} shard(s), all tensors equal, "
                  f"{identical} byte-identical file(s), transformers reloads the same state")
