"""LoRA on mistral3 against HF transformers + peft, fp32.

A tiny HF Mistral3 (the fixture tokenizer's vocabulary, GQA, Pixtral with silu) is saved with
save_pretrained; mmtrain trains LoRA adapters over it for two steps (features.lora, rank 4, alpha
8, the default targets: the text decoder's q/k/v/o and gate/up/down, plus the projector trained in
full through modules_to_save), saves a checkpoint, and exports it with `convert mistral3
lora-to-peft`. Then:

  1. peft.PeftModel.from_pretrained loads the export onto the HF model (every key used, none
     missing), and HF + peft's loss, logits and the gradient of every lora_A / lora_B equal
     `mmtrain debug step` on the LoRA checkpoint within 1e-5 relative L2;
  2. the export's files are peft's: metadata format pt, adapter_config.json's r, lora_alpha,
     target_modules, modules_to_save, base_model_name_or_path;
  3. `convert mistral3 merge-lora` writes full weights that HF loads as a plain Mistral3 whose
     forward equals HF + peft (merge_and_unload's) within 1e-5, and that mmtrain loads as its base.
"""
import json
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from test_mistral3_parity import make_batch, rel_l2, run_mmtrain, write_config  # noqa: E402

RTOL = 1e-5
TEXT = dict(vocab_size=288, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=128, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
            max_position_embeddings=512, sliding_window=None, tie_word_embeddings=False)
VISION = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, patch_size=4,
              image_size=40, num_channels=3, hidden_act="silu", rope_theta=10000.0)
# One layer of each tower at Magistral-Small-2509's widths (the fixture tokenizer's vocabulary and
# the batch's 4-pixel patches kept): opt-in with MMTRAIN_REAL_WIDTH=1, ~6 GB and ~80 s on a CPU.
TEXT_REAL = dict(TEXT, hidden_size=5120, num_hidden_layers=1, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, intermediate_size=32768)
VISION_REAL = dict(VISION, hidden_size=1024, num_attention_heads=16, intermediate_size=4096)


def hf_model(text=TEXT, vision=VISION):
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration
    config = Mistral3Config(text_config=dict(model_type="mistral", **text), vision_config=dict(model_type="pixtral", **vision),
                            image_token_index=10, spatial_merge_size=2, projector_hidden_act="gelu",
                            multimodal_projector_bias=False, vision_feature_layer=-1, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Mistral3ForConditionalGeneration(config).float().eval()
    for sub in (model, model.model.vision_tower, model.model.language_model):
        sub.config._attn_implementation = "eager"
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g) if p.dim() == 1 else
                    torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
    return model


def yaml(tmp: Path, base: Path, data: Path, extra_training="", iters=2, global_batch=4) -> str:
    model_config = json.loads((base / "config.json").read_text())
    model_config["freeze_vision"] = False  # the projector trains (modules_to_save); LoRA keeps the tower frozen
    return f"""parallel:
  fsdp_plan:
    apply_modules: ["model.vision_tower.transformer.layers.{{*}}", "model.language_model.layers.{{*}}"]
    param_dtype: fp32
    reduce_dtype: fp32
model:
  model_id: mistral3
  checkpoint_path: {base}
  config: {json.dumps(model_config)}
features:
  enable_lora: true
  lora: {{rank: 4, alpha: 8, modules_to_save: [model.multi_modal_projector]}}
data:
  dataset_param:
    dataset_type: huggingface
    preprocess_parameters: {{model_name_or_path: {data / 'tekken.json'}}}
    basic_parameters: {{template: mistral, dataset: {data / 'conversations.json'}, cutoff_len: 512}}
  dataloader_param: {{collator_id: pixtral, shuffle: true}}
training: {{train_iters: {iters}, global_batch_size: {global_batch}, lr: 2.0e-2, lr_decay_style: constant, seed: 5{extra_training}}}
logging: {{output_dir: {tmp / 'run'}}}
"""


def lora_run_at(tmp: Path, text=TEXT, vision=VISION, iters=2, global_batch=4):
    """mmtrain trains LoRA over an HF base of these dims, exports the adapters to peft and runs
    `debug step` on the checkpoint over make_batch()."""
    model = hf_model(text, vision)
    model.save_pretrained(tmp / "base", safe_serialization=True)
    del model
    data = tmp / "data"
    run_mmtrain(["fixture", "mistral3", "--out", str(data), "--samples", "16", "--seed", "3", "--mix"])
    cfg = write_config(tmp / "train.yaml", yaml(tmp, tmp / "base", data, f", save: {tmp / 'ckpt'}", iters, global_batch))
    run_mmtrain(["train", str(cfg)], timeout=3600)
    run_mmtrain(["convert", "mistral3", "lora-to-peft", "--load_dir", str(tmp / "ckpt"), "--save_dir", str(tmp / "peft")])
    batch = make_batch()
    save_file({k: v.contiguous() for k, v in batch.items()}, str(tmp / "batch.safetensors"))
    step_cfg = write_config(tmp / "step.yaml", cfg.read_text().replace(f"save: {tmp / 'ckpt'}", f"load: {tmp / 'ckpt'}"))
    run_mmtrain(["debug", "step", str(step_cfg), "--batch", str(tmp / "batch.safetensors"), "--out",
                 str(tmp / "step.safetensors")], timeout=3600)
    return dict(tmp=tmp, batch=batch, step=load_file(str(tmp / "step.safetensors")), text=text, vision=vision)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    return lora_run_at(tmp_path_factory.mktemp("lora_peft"))


def peft_model(run):
    model = peft.PeftModel.from_pretrained(hf_model(run["text"], run["vision"]), str(run["tmp"] / "peft"), is_trainable=True)
    for sub in model.modules():  # eager attention, as the base
        if hasattr(sub, "config") and hasattr(sub.config, "_attn_implementation"):
            sub.config._attn_implementation = "eager"
    return model.float()


def forward(model, batch):
    return model(input_ids=batch["input_ids"], labels=batch["labels"], position_ids=batch["position_ids"],
                 pixel_values=batch["pixel_values"], image_sizes=batch["image_sizes"])


def compare_with_peft(run, parity_report, label):
    batch, got = run["batch"], run["step"]
    model = peft_model(run)
    adapters = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert len(adapters) == 2 * 7 * run["text"]["num_hidden_layers"], sorted(adapters)[:4]
    assert any(p.abs().max() > 0 for n, p in adapters.items() if "lora_B" in n), "the adapters did not train"
    out = forward(model, batch)
    out.loss.backward()
    worst = {"loss": rel_l2(got["loss"], out.loss.detach()), "logits": rel_l2(got["logits"], out.logits.detach())}
    for name, p in adapters.items():
        # base_model.model.<module>.lora_A.default.weight -> mmtrain debug's grad.<module>.lora_A.weight
        key = "grad." + name.removeprefix("base_model.model.").replace(".default.", ".")
        assert key in got, (key, sorted(k for k in got if "lora" in k)[:4])
        worst[key] = rel_l2(got[key], p.grad)
    top = max(worst.items(), key=lambda kv: kv[1])
    parity_report(f"mistral3 LoRA fp32 vs HF + peft ({label}): loss {worst['loss']:.2e}, logits {worst['logits']:.2e}, "
                  f"worst adapter grad {top[0]} {top[1]:.2e} over {len(adapters)} tensors")
    bad = {k: v for k, v in worst.items() if not v <= RTOL}
    assert not bad, bad


def test_peft_loads_the_export_and_equals_mmtrain(lora_run, parity_report):
    compare_with_peft(lora_run, parity_report, "tiny")


@pytest.mark.skipif(os.environ.get("MMTRAIN_REAL_WIDTH") != "1", reason="opt-in: MMTRAIN_REAL_WIDTH=1 (~6 GB, ~80 s)")
def test_one_layer_at_real_widths_equals_peft(tmp_path, parity_report):
    run = lora_run_at(tmp_path, TEXT_REAL, VISION_REAL, iters=1, global_batch=1)
    compare_with_peft(run, parity_report, "one layer at Magistral-Small-2509's widths")


def test_the_export_is_peft_format(lora_run):
    tmp = lora_run["tmp"]
    config = json.loads((tmp / "peft" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8 and not config["use_rslora"]
    # The Pixtral tower has q_proj ... too, unadapted: short names would put adapters there, so the
    # export names the adapted modules by a regex (peft's re.fullmatch).
    pattern = re.compile(config["target_modules"])
    matched = sorted(n for n, _ in hf_model().named_modules() if pattern.fullmatch(n))
    assert len(matched) == 7 * TEXT["num_hidden_layers"] and all(".language_model.layers." in n for n in matched), matched
    assert config["modules_to_save"] == ["model.multi_modal_projector"]
    assert config["base_model_name_or_path"] == str(tmp / "base")
    with safe_open(str(tmp / "peft" / "adapter_model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
        keys = set(f.keys())
    assert "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    assert "base_model.model.model.multi_modal_projector.linear_1.weight" in keys


def test_merged_weights_equal_the_adapted_model(lora_run, parity_report):
    tmp, batch = lora_run["tmp"], lora_run["batch"]
    run_mmtrain(["convert", "mistral3", "merge-lora", "--load_dir", str(tmp / "ckpt"), "--save_dir", str(tmp / "merged"),
                 "--dtype", "fp32"])
    from transformers import Mistral3ForConditionalGeneration
    merged = Mistral3ForConditionalGeneration.from_pretrained(str(tmp / "merged"), dtype=torch.float32).eval()
    for sub in (merged, merged.model.vision_tower, merged.model.language_model):
        sub.config._attn_implementation = "eager"
    with torch.no_grad():
        got = forward(merged, batch)
        want = forward(peft_model(lora_run).eval(), batch)
    hf = rel_l2(got.logits, want.logits)
    # mmtrain loads the merged weights as a plain base (no LoRA) and steps like its adapted model.
    plain = (tmp / "step.yaml").read_text().replace(str(tmp / "base"), str(tmp / "merged")) \
        .replace("enable_lora: true", "enable_lora: false").replace(f"load: {tmp / 'ckpt'}", "load: ")
    cfg = write_config(tmp / "merged.yaml", plain)
    run_mmtrain(["debug", "step", str(cfg), "--batch", str(tmp / "batch.safetensors"), "--out", str(tmp / "merged.safetensors")])
    mine = rel_l2(load_file(str(tmp / "merged.safetensors"))["logits"], lora_run["step"]["logits"])
    parity_report(f"mistral3 merge-lora (fp32): HF on the merged weights vs HF + peft logits rel L2 {hf:.2e}; "
                  f"mmtrain on them vs mmtrain's LoRA step {mine:.2e}")
    assert hf <= RTOL and mine <= RTOL, (hf, mine)


def tensors_of(path: Path, contains="lora_"):
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as handle:
            out.update({k: handle.get_tensor(k) for k in handle.keys() if contains in k})
    return out


def test_peft_round_trip_is_bitwise_and_continues_training(lora_run):
    """mmtrain -> PEFT -> mmtrain: the adapters and the projector bitwise; the converted checkpoint
    is one a LoRA run continues training from."""
    tmp = lora_run["tmp"]
    run_mmtrain(["convert", "mistral3", "peft-to-ckpt", "--peft_dir", str(tmp / "peft"), "--config", str(tmp / "train.yaml"),
                 "--save_dir", str(tmp / "from_peft")])
    for part in ("lora_", "multi_modal_projector"):
        original = {k: v for k, v in tensors_of(tmp / "ckpt" / "iter_0000002", part).items() if k.startswith("model.")}
        back = {k: v for k, v in tensors_of(tmp / "from_peft" / "iter_0000000", part).items() if k.startswith("model.")}
        assert original and set(original) == set(back), sorted(set(original) ^ set(back))[:4]
        assert all(torch.equal(original[k], back[k]) for k in original), part
    cfg = write_config(tmp / "continue.yaml", (tmp / "train.yaml").read_text().replace(
        f"save: {tmp / 'ckpt'}", f"load: {tmp / 'from_peft'}").replace(str(tmp / "run"), str(tmp / "run_continue")))
    proc = run_mmtrain(["train", str(cfg)])
    assert "resumed from" in proc.stdout and "at iteration 0" in proc.stdout, proc.stdout[-2000:]


def test_peft_to_ckpt_refuses_adapters_that_disagree_and_hostile_files(lora_run, tmp_path):
    tmp = lora_run["tmp"]
    good = json.loads((tmp / "peft" / "adapter_config.json").read_text())
    tensors = load_file(str(tmp / "peft" / "adapter_model.safetensors"))
    first = sorted(k for k in tensors if "lora_A" in k)[0]

    def case(name, config_text=None, tensors_=None):
        d = tmp_path / name
        d.mkdir()
        (d / "adapter_config.json").write_text(config_text if config_text is not None else json.dumps(good))
        save_file(tensors_ if tensors_ is not None else tensors, str(d / "adapter_model.safetensors"), {"format": "pt"})
        proc = run_mmtrain(["convert", "mistral3", "peft-to-ckpt", "--peft_dir", str(d), "--config", str(tmp / "train.yaml"),
                            "--save_dir", str(tmp_path / (name + "_out"))], check=False)
        assert proc.returncode != 0, name
        assert not (tmp_path / (name + "_out") / "latest").exists(), name  # nothing half-written
        return proc.stderr

    assert "r is 8, features.lora.rank" in case("rank", json.dumps(dict(good, r=8)))
    assert "'lora_alpha' must be" in case("alpha_type", json.dumps(dict(good, lora_alpha="8")))
    assert "use_rslora is true" in case("rslora", json.dumps(dict(good, use_rslora=True)))
    assert "only LORA adapters" in case("ia3", json.dumps(dict(good, peft_type="IA3")))
    assert "DoRA" in case("dora", json.dumps(dict(good, use_dora=True)))
    assert "nest" in case("deep", "[" * 100000 + "]" * 100000).lower()
    assert "over the 16777216 bytes this kind of file may hold" in case("huge", json.dumps(dict(good, padding="x" * (17 << 20))))
    assert f"'{first}' has shape" in case("shape", tensors_=dict(tensors, **{first: tensors[first][:2].clone()}))
    missing = dict(tensors)
    del missing[first]
    assert f"has no '{first}'" in case("missing", tensors_=missing)
    extra = dict(tensors, **{"base_model.model.lm_head.lora_A.weight": torch.zeros(4, 64)})
    assert "holds 'base_model.model.lm_head.lora_A.weight', which the model" in case("extra", tensors_=extra)
