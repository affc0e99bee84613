"""GRPO on mistral3 against TRL's GRPOTrainer (trl, PyPI) on HF transformers (+ peft), fp32.

mmtrain trains 3 steps (4 with num_iterations 2) of training.objective grpo over `fixture mistral3-prompts` from the tiny HF
Mistral3 of test_lora_peft: it generates the completions itself (its KV-cache generator), scores
them (regex_match and overlong_penalty, weighted) and writes every rollout to
rollouts/iter_N.jsonl. TRL's side takes those completions and rewards as they are (TRL would sample
its own; GRPO's loss is what is compared) and runs its own code on them:
  * the advantages: GRPOTrainer's sum_then_normalize lines (trl 1.16), from the per-function
    rewards, for each scale_rewards (checked against mmtrain's advantages in the file);
  * the old policy's log-probs (num_iterations 2) and the reference's (beta > 0), with
    `GRPOTrainer._get_per_token_logps_and_entropies` through TRL's fused LM head at the sampling
    temperature: under LoRA the model with its adapters off, under full fine-tuning a frozen copy;
  * the loss and its metrics: `GRPOTrainer._compute_loss` on each rank's micro-batch (its padded
    layout: prompts left-padded, completions right-padded), the loss backward divided by the ranks
    (DDP's mean), then torch's AdamW as mmtrain's.
Compared at rtol 1e-5: every step's loss and metrics (kl, entropy, clip ratios, reward and its std,
each reward function's mean and std, completion lengths) and what the steps changed in the trained weights (AdamW with eps 1: about lr x the gradients)
(LoRA: the `lora-to-peft` export against peft's adapters; full: `ckpt-to-hf` against the model),
for each loss_type, scale_rewards, num_iterations 1 and 2, beta 0 and > 0, LoRA and full, 1 and 2
ranks.
"""
import contextlib
import json
import types
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
trl = pytest.importorskip("trl")

from test_dpo_trl import write_initial_peft  # noqa: E402
from test_lora_peft import hf_model, rel_l2  # noqa: E402
from test_mistral3_parity import run_mmtrain, write_config  # noqa: E402

RTOL = 1e-5
G, PROMPTS_PER_MICRO, MAX_LEN, TEMPERATURE = 4, 2, 6, 0.9
REWARDS = {"reward_funcs": ["regex_match", "overlong_penalty"], "reward_weights": [1.0, 0.5],
           "reward_regex": "[a-j]", "overlong_buffer": 3}
TOKEN_METRICS = ["entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]
# AdamW with eps 1 moves each weight by about lr x its gradient (the gradients here are well under
# 1): the weights' change after 3 steps compares the gradients themselves, where eps 1e-8 would turn
# every gradient into a ±lr step by its sign and blow the rounding of the smallest ones up.
LR, ADAM_EPS = 1.0, 1.0


def steps_of(grpo: dict) -> int:
    """3 steps, or two rollouts of num_iterations 2."""
    return 4 if grpo.get("num_iterations", 1) == 2 else 3


def grpo_yaml(tmp: Path, grpo: dict, tag: str, world: int, full: bool) -> str:
    model_config = json.loads((tmp / "base" / "config.json").read_text())
    lora = "" if full else "features:\n  enable_lora: true\n  lora: {rank: 4, alpha: 8}\n"
    load = "" if full else f"load: {tmp / f'init_ckpt_{world}'}, "
    settings = {**dict(num_generations=G, max_completion_length=MAX_LEN, temperature=TEMPERATURE, **REWARDS), **grpo}
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
    dataset_type: prompts
    preprocess_parameters: {{model_name_or_path: {tmp / 'data' / 'tekken.json'}}}
    basic_parameters: {{template: mistral, dataset: {tmp / 'data' / 'prompts.jsonl'}, cutoff_len: 512}}
  dataloader_param: {{collator_id: prompts, shuffle: false}}
training: {{train_iters: {steps_of(grpo)}, global_batch_size: {PROMPTS_PER_MICRO * world},
  micro_batch_size: {PROMPTS_PER_MICRO}, lr: {LR}, adam_eps: {ADAM_EPS}, lr_decay_style: constant, seed: 5,
  objective: grpo, grpo: {json.dumps(settings)}, {load}save: {tmp / ('ckpt_' + tag)}}}
logging: {{output_dir: {tmp / ('run_' + tag)}}}
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The base, the prompts and peft's initial adapters (lora_B nonzero, handed to mmtrain)."""
    tmp = tmp_path_factory.mktemp("grpo_trl")
    hf_model().save_pretrained(tmp / "base", safe_serialization=True)
    run_mmtrain(["fixture", "mistral3-prompts", "--out", str(tmp / "data"), "--prompts", "8", "--seed", "3"])
    write_initial_peft(tmp / "init_peft")
    for world in (1, 2):  # a checkpoint records its global batch: one for each world's runs
        cfg = write_config(tmp / f"init_{world}.yaml", grpo_yaml(tmp, {}, "init", world, False))
        run_mmtrain(["convert", "mistral3", "peft-to-ckpt", "--peft_dir", str(tmp / "init_peft"), "--config", str(cfg),
                     "--save_dir", str(tmp / f"init_ckpt_{world}")])
    return tmp


def trl_advantages(rewards_per_func: torch.Tensor, weights: list, scale_rewards: str) -> torch.Tensor:
    """GRPOTrainer._generate_and_score_completions' sum_then_normalize lines (trl 1.16)."""
    from trl.trainer.utils import nanstd
    rewards = (rewards_per_func * torch.tensor(weights, dtype=torch.float32).unsqueeze(0)).nansum(dim=1)
    mean = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    if scale_rewards in ["group", "none"]:
        std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    else:
        std = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    return advantages


def micro_batch_inputs(rows: list, prompts: dict, mask_truncated: bool) -> dict:
    """TRL's layout of one micro-batch: prompts left-padded, completions right-padded, each
    completion with its prompt's images (from mmtrain's prompt micro-batch, `debug collate`)."""
    B = len(rows)
    prompt_len = max(len(r["prompt_ids"]) for r in rows)
    completion_len = max(len(r["completion_ids"]) for r in rows)
    prompt_ids, prompt_mask = torch.zeros(B, prompt_len, dtype=torch.long), torch.zeros(B, prompt_len, dtype=torch.long)
    completion_ids = torch.zeros(B, completion_len, dtype=torch.long)
    completion_mask = torch.zeros(B, completion_len, dtype=torch.long)
    pixels, sizes, counts = [], [], []
    for i, r in enumerate(rows):
        p, c = r["prompt_ids"], r["completion_ids"]
        prompt_ids[i, prompt_len - len(p):] = torch.tensor(p)
        prompt_mask[i, prompt_len - len(p):] = 1
        completion_ids[i, :len(c)] = torch.tensor(c)
        completion_mask[i, :len(c)] = 0 if (mask_truncated and r["truncated"]) else 1
        batch = prompts[r["sample_index"]]
        pixels.append(batch["pixel_values"])
        sizes.append(batch["image_sizes"])
        counts.append(batch["pixel_values"].size(0))
    h = max(x.size(2) for x in pixels)
    w = max(x.size(3) for x in pixels)
    pixel_values = torch.cat([torch.nn.functional.pad(x, (0, w - x.size(3), 0, h - x.size(2))) for x in pixels])
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "pixel_values": pixel_values, "image_sizes": torch.cat(sizes),
            "num_images": counts}


def prompt_batches(tmp: Path, cfg: Path, data_step: int, world: int) -> dict:
    """sample_index -> that prompt's pixel_values and image_sizes, from mmtrain's prompt micro-batches."""
    out = {}
    for rank in range(world):
        path = tmp / f"{cfg.stem}_prompts_{data_step}_{rank}.safetensors"
        run_mmtrain(["debug", "collate", str(cfg), "--out", str(path), "--step", str(data_step), "--micro", "0",
                     "--rank", str(rank), "--world", str(world)])
        b = load_file(str(path))
        image = 0
        for p, index in enumerate(b["sample_index"].tolist()):
            n = int(b["image_counts"][p])
            sizes = b["image_sizes"][image:image + n]
            h, w = int(sizes[:, 0].max()), int(sizes[:, 1].max())
            out[index] = {"pixel_values": b["pixel_values"][image:image + n, :, :h, :w], "image_sizes": sizes}
            image += n
    return out


def trl_reference(tmp: Path, cfg: Path, grpo: dict, world: int, full: bool):
    """TRL's GRPO loss and metrics on mmtrain's rollouts; returns per-step records and the trained
    parameters (adapters, or every trained weight)."""
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    def fused(model):
        for sub in (model, model.model.vision_tower, model.model.language_model):
            sub.config._attn_implementation = "eager"
        add_fused_lm_head(model, temperature=TEMPERATURE, outputs=("log_probs", "entropy"))
        return model

    ref_model = None
    if full:
        model = fused(hf_model())
        for name, p in model.named_parameters():
            p.requires_grad = not name.startswith(("model.vision_tower.", "model.multi_modal_projector."))
        ref_model = fused(hf_model()).requires_grad_(False)
    else:
        model = peft.PeftModel.from_pretrained(fused(hf_model()), str(tmp / "init_peft"), is_trainable=True).float()
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    initial = {id(p): p.detach().clone() for p in trainable}
    optimizer = torch.optim.AdamW(trainable, lr=LR, betas=(0.9, 0.999), eps=ADAM_EPS, weight_decay=0.0)
    mu, beta = grpo.get("num_iterations", 1), grpo.get("beta", 0.0)
    epsilon = grpo.get("epsilon", 0.2)
    accelerator = types.SimpleNamespace(num_processes=world, sync_gradients=True, is_main_process=True,
                                        autocast=contextlib.nullcontext,
                                        reduce=lambda t, reduction="sum": t, gather=lambda t: t,
                                        gather_for_metrics=lambda t: t)
    trainer = types.SimpleNamespace(
        model=model, accelerator=accelerator, beta=beta, loss_type=grpo.get("loss_type", "dapo"),
        epsilon_low=epsilon, epsilon_high=grpo.get("epsilon_high", epsilon), importance_sampling_level="token",
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, use_vllm=False,
        vllm_importance_sampling_correction=False, _entropy_bonus_enabled=False, aux_loss_enabled=False,
        max_completion_length=grpo.get("max_completion_length", MAX_LEN), current_gradient_accumulation_steps=1,
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    trainer._get_per_token_logps_and_entropies = types.MethodType(GRPOTrainer._get_per_token_logps_and_entropies, trainer)

    def logps(m, inputs):
        with torch.no_grad():
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
            mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
            out, _, _ = trainer._get_per_token_logps_and_entropies(
                m, ids, mask, inputs["completion_ids"].size(1), pixel_values=inputs["pixel_values"],
                num_images=inputs["num_images"], image_sizes=inputs["image_sizes"])
        return out

    steps, held, checks = [], None, {}
    for step in range(steps_of(grpo)):
        if step % mu == 0:  # a new rollout: mmtrain's completions and rewards, TRL's advantages
            rows = [json.loads(line) for line in
                    (tmp / f"run_{cfg.stem}" / "rollouts" / f"iter_{step + 1}.jsonl").read_text().splitlines()]
            names = REWARDS["reward_funcs"]
            per_func = torch.tensor([[r["rewards"][n] for n in names] for r in rows], dtype=torch.float32)
            advantages = trl_advantages(per_func, REWARDS["reward_weights"], grpo.get("scale_rewards", "group"))
            checks[f"step {step + 1} advantages"] = rel_l2(torch.tensor([r["advantage"] for r in rows]), advantages)
            prompts = prompt_batches(tmp, cfg, step // mu, world)
            held = []
            for rank in range(world):
                mine = [(i, r) for i, r in enumerate(rows) if r["rank"] == rank]
                inputs = micro_batch_inputs([r for _, r in mine], prompts, grpo.get("mask_truncated_completions", False))
                inputs["advantages"] = advantages[[i for i, _ in mine]]
                held.append(inputs)
            tokens = sum(b["completion_mask"].sum() for b in held)
            for inputs in held:
                inputs["num_items_in_batch"] = tokens.float()
                if mu > 1:
                    inputs["old_per_token_logps"] = logps(model, inputs)
                if beta != 0.0:
                    if full:
                        inputs["ref_per_token_logps"] = logps(ref_model, inputs)
                    else:
                        with model.disable_adapter():
                            inputs["ref_per_token_logps"] = logps(model, inputs)
            weighted = (per_func * torch.tensor(REWARDS["reward_weights"])).sum(1)
            record_rollout = {"reward": weighted.mean().item(), "reward_std": weighted.std().item()}
            for k, n in enumerate(names):
                record_rollout[f"rewards/{n}/mean"] = per_func[:, k].mean().item()
                record_rollout[f"rewards/{n}/std"] = per_func[:, k].std().item()
            lengths = torch.tensor([len(r["completion_ids"]) for r in rows], dtype=torch.float32)
            record_rollout["completions/mean_length"] = lengths.mean().item()
            record_rollout["completions/max_length"] = lengths.max().item()
        trainer._metrics["train"] = defaultdict(list)
        optimizer.zero_grad()
        record = dict(record_rollout, loss=0.0)
        masks = []
        for inputs in held:
            loss = GRPOTrainer._compute_loss(trainer, model, inputs)
            (loss / world).backward()
            record["loss"] += loss.item() / world
            masks.append(inputs["completion_mask"].sum().item())
        optimizer.step()
        # Each rank's metric is its own token mean; the step's is their token-weighted mean (what
        # TRL's accelerator.reduce makes of the ranks' sums).
        keys = TOKEN_METRICS + (["kl"] if beta != 0.0 else [])
        for key in keys:
            values = trainer._metrics["train"][key]
            record[key] = sum(v * n for v, n in zip(values, masks)) / max(sum(masks), 1)
        steps.append(record)
    # What the 3 steps changed (the trained weights and their start), by name.
    trained = {n: (p.detach().clone(), initial[id(p)]) for n, p in model.named_parameters() if p.requires_grad}
    if full:
        return steps, trained, checks
    return steps, {n.removeprefix("base_model.model.").replace(".default.", "."): v for n, v in trained.items()}, checks


def compare(setup, parity_report, grpo: dict, world: int, tag: str, full: bool = False):
    tmp = setup
    cfg = write_config(tmp / f"{tag}.yaml", grpo_yaml(tmp, grpo, tag, world, full))
    run_mmtrain(["train", str(cfg)], world=world, timeout=1800)
    got = [json.loads(line) for line in (tmp / f"run_{tag}" / "metrics.jsonl").read_text().splitlines()
           if line.strip() and '"kind"' not in line]
    want_steps, want_weights, worst = trl_reference(tmp, cfg, grpo, world, full)
    if full:
        run_mmtrain(["convert", "mistral3", "ckpt-to-hf", "--load_dir", str(tmp / f"ckpt_{tag}"), "--save_dir",
                     str(tmp / f"hf_{tag}"), "--model_assets_dir", str(tmp / "base")])
        exported = dict(transformers.Mistral3ForConditionalGeneration.from_pretrained(
            str(tmp / f"hf_{tag}"), dtype=torch.float32).named_parameters())
        mine = {k: exported[k].detach() for k in want_weights if k in exported}
    else:
        run_mmtrain(["convert", "mistral3", "lora-to-peft", "--load_dir", str(tmp / f"ckpt_{tag}"), "--save_dir",
                     str(tmp / f"peft_{tag}")])
        mine = {k.removeprefix("base_model.model."): v
                for k, v in load_file(str(tmp / f"peft_{tag}" / "adapter_model.safetensors")).items()}
    for step, w in enumerate(want_steps):
        g = got[step]
        for key, want in w.items():
            # The loss is a mean of advantage-weighted ratios, ~0 by construction: measured against
            # the mean |advantage| scale (1) rather than itself; the rest against themselves.
            scale = max(abs(want), 1.0) if key == "loss" else abs(want)
            worst[f"step {step + 1} {key}"] = abs(g[key] - want) / max(scale, 1e-12)
    assert set(mine) == set(want_weights), sorted(set(mine) ^ set(want_weights))[:4]
    for key, (want, start) in want_weights.items():
        worst[key] = rel_l2(mine[key] - start, want - start)
    top = max(worst.items(), key=lambda kv: kv[1])
    clipped = max(w["clip_ratio/region_mean"] for w in want_steps)
    peer = "TRL GRPOTrainer (full, frozen reference)" if full else "TRL GRPOTrainer + peft"
    parity_report(f"mistral3 GRPO ({tag}, {world} rank{'s' if world > 1 else ''}) vs {peer}: worst {top[0]} "
                  f"{top[1]:.2e} over {len(worst)} values; losses {[round(w['loss'], 6) for w in want_steps]}, "
                  f"rewards {[round(w['reward'], 3) for w in want_steps]}, most clipped {clipped:.3f}")
    bad = {k: v for k, v in worst.items() if not v <= RTOL}
    assert not bad, bad
    return want_steps


# Every loss_type, scale_rewards, num_iterations 1 and 2, beta 0 and > 0, LoRA and full, 1 and 2 ranks.
CASES = [
    ("grpo_group", {"loss_type": "grpo", "scale_rewards": "group"}, 1, False),
    ("bnpo_batch_mu2_kl", {"loss_type": "bnpo", "scale_rewards": "batch", "num_iterations": 2, "beta": 0.05,
                           "epsilon": 0.02}, 1, False),
    ("drgrpo_none_kl", {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.05}, 1, False),
    # Long enough that some completions end (EOS) and the truncated ones are masked.
    ("dapo_mu2_kl_2ranks", {"loss_type": "dapo", "num_iterations": 2, "beta": 0.05, "epsilon": 0.02,
                            "epsilon_high": 0.03, "mask_truncated_completions": True, "max_completion_length": 48},
     2, False),
    ("full_dapo_batch_kl", {"loss_type": "dapo", "scale_rewards": "batch", "beta": 0.05}, 1, True),
    ("full_grpo_mu2_2ranks", {"loss_type": "grpo", "num_iterations": 2, "epsilon": 0.02}, 2, True),
]


@pytest.mark.parametrize("tag,grpo,world,full", CASES, ids=[c[0] for c in CASES])
def test_grpo_equals_trl(setup, parity_report, tag, grpo, world, full):
    steps = compare(setup, parity_report, grpo, world, tag, full)
    if grpo.get("mask_truncated_completions"):  # both kinds are there, so the masking was exercised
        rows = [json.loads(line) for path in (setup / f"run_{tag}" / "rollouts").glob("iter_*.jsonl")
                for line in path.read_text().splitlines()]
        assert 0 < sum(r["truncated"] for r in rows) < len(rows)
    if grpo.get("num_iterations", 1) > 1:  # the reused rollout's second step: the ratios moved off 1
        assert steps[1]["clip_ratio/region_mean"] > 0, "no token was clipped: the ratio path went untested"
