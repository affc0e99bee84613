"""DPO on mistral3 under LoRA against TRL's DPOTrainer (trl, PyPI) on HF transformers + peft, fp32.

A tiny HF Mistral3 (test_lora_peft's) is the base; peft puts rank-4 adapters on its text decoder
(lora_B drawn nonzero, so that the policy starts away from the reference) and `convert mistral3
peft-to-ckpt` hands them to mmtrain. mmtrain trains 3 steps of training.objective dpo over
`fixture mistral3-preferences` (4 pairs a step, micro-batches of 2 pairs), its reference the base
with the adapters off. TRL's side runs on the very micro-batches mmtrain's loader made (`debug
collate`, every rank and micro-batch of each step): DPOTrainer's own loss and metric code
(`DPOTrainer._compute_loss`, TRL's fused LM head, `use_adapter` turning the adapters off for the
reference) through peft, each micro-batch's loss / micro-batches backward, then torch's AdamW as
mmtrain's. Compared, at rtol 1e-5: every step's loss and TRL's metrics (rewards/chosen, rejected,
accuracies, margins, logps/chosen, rejected), and the adapters after the 3 steps (mmtrain's
`lora-to-peft` export against peft's parameters); on 1 rank for each loss_type and on 2 ranks.
Full fine-tuning likewise, on 1 and 2 ranks: mmtrain's reference a frozen sharded copy of the
base, TRL's a `ref_model`; every trained weight after 3 steps (`ckpt-to-hf`) against TRL's.
"""
import json
import re
import types
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
trl = pytest.importorskip("trl")

from test_lora_peft import TEXT, hf_model, rel_l2  # noqa: E402
from test_mistral3_parity import run_mmtrain, write_config  # noqa: E402

RTOL = 1e-5
STEPS, PAIRS_PER_STEP, PAIRS_PER_MICRO = 3, 4, 2
TARGETS = r"model\.language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"
METRICS = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
           "logps/rejected"]
LR = 1e-2
# Full fine-tuning at a full fine-tuning rate. At 1e-2 every value agreed within 1e-5 but lm_head
# (1.06e-5 relative L2 after 3 steps): Adam turns the rounding of its rarely-hit vocabulary rows'
# tiny gradients into whole lr-sized steps, so the weights' agreement scales with lr.
FULL_LR = 1e-3


def dpo_yaml(tmp: Path, data: Path, dpo: dict, tag: str, full: bool = False) -> str:
    """LoRA from peft's initial adapters; full: full fine-tuning of the base (vision frozen, as
    Magistral's default freeze_vision), the reference a frozen copy of it."""
    model_config = json.loads((tmp / "base" / "config.json").read_text())
    lora = "" if full else "features:\n  enable_lora: true\n  lora: {rank: 4, alpha: 8}\n"
    load = "" if full else f"load: {tmp / 'init_ckpt'}, "
    return f"""parallel:
  fsdp_plan:
    apply_modules: ["model.vision_tower.transformer.layers.{{*}}", "model.language_model.layers.{{*}}"]
    param_dtype: fp32
    reduce_dtype: fp32
model:
  model_id: mistral3
  checkpoint_path: {tmp / 'base'}
  config: {json.dumps(model_config)}
{lora}data:
  dataset_param:
    dataset_type: preference
    preprocess_parameters: {{model_name_or_path: {data / 'tekken.json'}}}
    basic_parameters: {{template: mistral, dataset: {data / 'preferences.json'}, cutoff_len: 512}}
  dataloader_param: {{collator_id: preference, shuffle: false}}
training: {{train_iters: {STEPS}, global_batch_size: {PAIRS_PER_STEP}, micro_batch_size: {PAIRS_PER_MICRO}, lr: {FULL_LR if full else LR},
  lr_decay_style: constant, seed: 5, objective: dpo, dpo: {json.dumps(dpo)},
  {load}save: {tmp / ('ckpt_' + tag)}}}
logging: {{output_dir: {tmp / ('run_' + tag)}}}
"""


def write_initial_peft(out: Path) -> None:
    """peft's rank-4 adapters on the tiny model's text decoder, lora_B drawn nonzero so that the
    policy starts away from the reference (the base), saved to OUT."""
    model = peft.get_peft_model(hf_model(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(out)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The base, the preference set and peft's initial adapters (handed to mmtrain as a checkpoint)."""
    tmp = tmp_path_factory.mktemp("dpo_trl")
    hf_model().save_pretrained(tmp / "base", safe_serialization=True)
    run_mmtrain(["fixture", "mistral3-preferences", "--out", str(tmp / "data"), "--pairs", "8", "--seed", "3"])
    write_initial_peft(tmp / "init_peft")
    cfg = write_config(tmp / "init.yaml", dpo_yaml(tmp, tmp / "data", {"beta": 0.1}, "init"))
    run_mmtrain(["convert", "mistral3", "peft-to-ckpt", "--peft_dir", str(tmp / "init_peft"), "--config", str(cfg),
                 "--save_dir", str(tmp / "init_ckpt")])
    return tmp


def micro_batches(tmp: Path, cfg: Path, step: int, world: int) -> list[dict]:
    """Every rank's micro-batches of `step`, as mmtrain's loader makes them (the data settings are
    every run's: written once per world size and step)."""
    out = []
    for rank in range(world):
        for micro in range(PAIRS_PER_STEP // (PAIRS_PER_MICRO * world)):
            path = tmp / f"batch_w{world}_{step}_{rank}_{micro}.safetensors"
            if not path.exists():
                run_mmtrain(["debug", "collate", str(cfg), "--out", str(path), "--step", str(step), "--micro",
                             str(micro), "--rank", str(rank), "--world", str(world)])
            out.append(load_file(str(path)))
    return out


def trl_reference(tmp: Path, cfg: Path, dpo: dict, world: int, full: bool = False):
    """TRL's DPOTrainer loss and metrics on mmtrain's micro-batches; returns per-step metrics and the
    trained adapters (full: every trained parameter, the reference a frozen copy of the base)."""
    from trl.trainer.dpo_trainer import DPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    def fused(model):
        for sub in (model, model.model.vision_tower, model.model.language_model):
            sub.config._attn_implementation = "eager"
        add_fused_lm_head(model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
        return model

    ref_model = None
    if full:
        model = fused(hf_model())
        for name, p in model.named_parameters():  # freeze_vision: the tower and the projector stay
            p.requires_grad = not name.startswith(("model.vision_tower.", "model.multi_modal_projector."))
        ref_model = fused(hf_model()).requires_grad_(False)
    else:
        model = peft.PeftModel.from_pretrained(fused(hf_model()), str(tmp / "init_peft"), is_trainable=True).float()
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=FULL_LR if full else LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    loss_types = dpo.get("loss_type", ["sigmoid"])
    accelerator = types.SimpleNamespace(device=torch.device("cpu"), unwrap_model=lambda m: m,
                                        gather=lambda t: t, gather_for_metrics=lambda t: t)
    trainer = types.SimpleNamespace(
        model=model, ref_model=ref_model, accelerator=accelerator, aux_loss_enabled=False, precompute_ref_logps=False,
        args=types.SimpleNamespace(gradient_checkpointing_kwargs=None), ld_alpha=None, f_divergence_type="reverse_kl",
        loss_types=loss_types, loss_weights=dpo.get("loss_weights", [1.0] * len(loss_types)), beta=dpo["beta"],
        label_smoothing=dpo.get("label_smoothing", 0.0), use_weighting=False, _tp_size=1, _total_train_tokens=0,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    steps = []
    for step in range(STEPS):
        batches = micro_batches(tmp, cfg, step, world)
        trainer._metrics["train"] = defaultdict(list)
        optimizer.zero_grad()
        total = 0.0
        for b in batches:
            inputs = {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"], "pixel_values": b["pixel_values"],
                      "image_sizes": b["image_sizes"], "completion_mask": (b["labels"] != -100).long()}
            assert torch.equal(inputs["input_ids"].masked_fill(inputs["completion_mask"] == 0, -100), b["labels"])
            loss = DPOTrainer._compute_loss(trainer, model, inputs, False)
            (loss / len(batches)).backward()
            total += loss.item() / len(batches)
        optimizer.step()
        record = {"loss": total}
        for key in METRICS:
            values = trainer._metrics["train"][key]
            record[key] = sum(values) / len(values)  # micro-batches of equal pair counts: the mean over pairs
        steps.append(record)
    if full:
        return steps, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    adapters = {n.removeprefix("base_model.model.").replace(".default.", "."): p.detach().clone()
                for n, p in model.named_parameters() if "lora_" in n}
    return steps, adapters


def compare(setup, parity_report, dpo: dict, world: int, tag: str, full: bool = False):
    tmp = setup
    cfg = write_config(tmp / f"{tag}.yaml", dpo_yaml(tmp, tmp / "data", dpo, tag, full))
    run_mmtrain(["train", str(cfg)], world=world, timeout=1800)
    got = [json.loads(line) for line in (tmp / f"run_{tag}" / "metrics.jsonl").read_text().splitlines()
           if line.strip() and '"kind"' not in line]
    want_steps, want_adapters = trl_reference(tmp, cfg, dpo, world, full)
    if full:
        run_mmtrain(["convert", "mistral3", "ckpt-to-hf", "--load_dir", str(tmp / f"ckpt_{tag}"), "--save_dir",
                     str(tmp / f"hf_{tag}"), "--model_assets_dir", str(tmp / "base")])
        # transformers reads its own saved layout back under the module names TRL's parameters have.
        exported = dict(transformers.Mistral3ForConditionalGeneration.from_pretrained(
            str(tmp / f"hf_{tag}"), dtype=torch.float32).named_parameters())
        mine = {k: exported[k].detach() for k in want_adapters if k in exported}
    else:
        run_mmtrain(["convert", "mistral3", "lora-to-peft", "--load_dir", str(tmp / f"ckpt_{tag}"), "--save_dir",
                     str(tmp / f"peft_{tag}")])
        mine = {k.removeprefix("base_model.model."): v
                for k, v in load_file(str(tmp / f"peft_{tag}" / "adapter_model.safetensors")).items()}
    assert len(got) == STEPS
    worst = {}
    for step, (g, w) in enumerate(zip(got, want_steps)):
        for key in ["loss", *METRICS]:
            # A reward is β x a difference of log-probs of about -20: its rounding is that of the terms
            # (fp32 on both sides), so it is measured against β |logps| where it is itself smaller.
            scale = abs(w[key])
            if key.startswith("rewards/") and key != "rewards/accuracies":
                scale = max(scale, dpo["beta"] * abs(w["logps/chosen"]))
            worst[f"step {step + 1} {key}"] = abs(g[key] - w[key]) / max(scale, 1e-12)
    assert set(mine) == set(want_adapters), sorted(set(mine) ^ set(want_adapters))[:4]
    for key, want in want_adapters.items():
        worst[key] = rel_l2(mine[key], want)
    top = max(worst.items(), key=lambda kv: kv[1])
    accuracies = [round(w["rewards/accuracies"], 3) for w in want_steps]
    peer = "TRL DPOTrainer (full, frozen reference copy)" if full else "TRL DPOTrainer + peft"
    parity_report(f"mistral3 DPO ({tag}, {world} rank{'s' if world > 1 else ''}) vs {peer}: worst "
                  f"{top[0]} {top[1]:.2e} over {len(worst)} values; losses {[round(w['loss'], 5) for w in want_steps]}, "
                  f"reward accuracies {accuracies}")
    bad = {k: v for k, v in worst.items() if not v <= RTOL}
    assert not bad, bad


# Each loss type once (TRL's list form sums the types, each term compared through the total).
@pytest.mark.parametrize("tag,dpo", [
    ("sigmoid", {"beta": 0.1}),
    ("hinge_ipo", {"beta": 0.1, "loss_type": ["hinge", "ipo"], "loss_weights": [1.0, 0.3]}),
    ("robust_rpo", {"beta": 0.2, "loss_type": ["robust", "sft"], "loss_weights": [1.0, 0.5], "label_smoothing": 0.1}),
])
def test_dpo_equals_trl_on_one_rank(setup, parity_report, tag, dpo):
    compare(setup, parity_report, dpo, 1, tag)


def test_dpo_equals_trl_on_two_ranks(setup, parity_report):
    compare(setup, parity_report, {"beta": 0.1}, 2, "sigmoid_2ranks")


@pytest.mark.parametrize("world", [1, 2])
def test_full_fine_tuning_dpo_equals_trl_with_a_frozen_reference(setup, parity_report, world):
    compare(setup, parity_report, {"beta": 0.1, "loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5]}, world,
            f"full_{world}ranks", full=True)


def test_the_reference_is_the_base_with_the_adapters_off(setup):
    """`debug step` with the LoRA checkpoint's adapters zeroed (lora_B = 0: the policy is the base) gives
    rewards 0 and a loss of log 2 exactly: the adapters-off reference equals the base bitwise."""
    tmp = setup
    cfg = write_config(tmp / "ref.yaml", dpo_yaml(tmp, tmp / "data", {"beta": 0.1}, "ref").replace(
        f"save: {tmp / 'ckpt_ref'}", "save: ''"))
    run_mmtrain(["debug", "collate", str(cfg), "--out", str(tmp / "ref_batch.safetensors")])
    model = peft.PeftModel.from_pretrained(hf_model(), str(tmp / "init_peft"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.zero_()
    model.save_pretrained(tmp / "zero_peft")
    run_mmtrain(["convert", "mistral3", "peft-to-ckpt", "--peft_dir", str(tmp / "zero_peft"), "--config", str(cfg),
                 "--save_dir", str(tmp / "zero_ckpt")])
    step_cfg = write_config(tmp / "ref_step.yaml", cfg.read_text().replace(str(tmp / "init_ckpt"), str(tmp / "zero_ckpt")))
    run_mmtrain(["debug", "step", str(step_cfg), "--batch", str(tmp / "ref_batch.safetensors"), "--out",
                 str(tmp / "ref_step.safetensors")])
    out = load_file(str(tmp / "ref_step.safetensors"))
    assert out["metric.rewards/chosen"].item() == 0.0 and out["metric.rewards/rejected"].item() == 0.0
    assert out["loss"].item() == pytest.approx(torch.log(torch.tensor(2.0)).item(), abs=1e-7)
    # With the adapters on, the same batch moves away from the reference.
    run_mmtrain(["debug", "step", str(cfg), "--batch", str(tmp / "ref_batch.safetensors"), "--out",
                 str(tmp / "ref_step_on.safetensors")])
    assert load_file(str(tmp / "ref_step_on.safetensors"))["metric.rewards/chosen"].item() != 0.0
