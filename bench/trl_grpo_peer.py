"""The peer of bench/grpo.py: what TRL's GRPOTrainer does in a step with transformers generation (no
vLLM), on HF transformers + peft, one process: the step's prompts (mmtrain's own prompt micro-batch,
`debug collate`) repeated G times and generated as one left-padded batch by `model.generate`
(sampling at temperature 1, MAX_NEW tokens), the reference's per-token log-probs with peft's
adapters off (no grad), then `GRPOTrainer._compute_loss` (dapo, beta 0.04) through TRL's fused LM
head, backward and torch's fused AdamW. The advantages are random (rewards cost nothing here).
One JSON line a step to OUT/steps.jsonl: step_time_ms, time/rollout_ms, rollout_tokens_per_s."""
import argparse
import contextlib
import json
import subprocess
import time
import types
from collections import defaultdict
from pathlib import Path

import peft
import torch
from safetensors.torch import load_file
from transformers import Mistral3ForConditionalGeneration
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

from peer_steps import ADAPTED


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--base", "--config", "--binary", "--out"):
        parser.add_argument(flag, required=True)
    for flag in ("--steps", "--prompts", "--g", "--max-new"):
        parser.add_argument(flag, type=int, required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True)
    torch.manual_seed(0)
    model = Mistral3ForConditionalGeneration.from_pretrained(args.base, dtype=torch.float32)
    add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=ADAPTED))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    accelerator = types.SimpleNamespace(num_processes=1, sync_gradients=True, is_main_process=True,
                                        autocast=contextlib.nullcontext, reduce=lambda t, reduction="sum": t,
                                        gather=lambda t: t, gather_for_metrics=lambda t: t)
    trainer = types.SimpleNamespace(
        model=model, accelerator=accelerator, beta=0.04, loss_type="dapo", epsilon_low=0.2, epsilon_high=0.2,
        importance_sampling_level="token", top_entropy_quantile=1.0, off_policy_mask_threshold=None, use_vllm=False,
        vllm_importance_sampling_correction=False, _entropy_bonus_enabled=False, aux_loss_enabled=False,
        max_completion_length=args.max_new, current_gradient_accumulation_steps=1,
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    trainer._get_per_token_logps_and_entropies = types.MethodType(GRPOTrainer._get_per_token_logps_and_entropies, trainer)
    lines = []
    for step in range(args.steps):
        path = out / f"prompts_{step}.safetensors"
        subprocess.run([args.binary, "debug", "collate", args.config, "--out", str(path), "--step", str(step)],
                       check=True, capture_output=True)
        b = load_file(str(path))
        lengths, counts = b["prompt_lengths"].tolist(), b["image_counts"].tolist()
        prompts, images, sizes, token, image = [], [], [], 0, 0
        for length, count in zip(lengths, counts):
            prompts.append(b["prompt_ids"][token:token + length])
            images.append(b["pixel_values"][image:image + count])
            sizes.append(b["image_sizes"][image:image + count])
            token, image = token + length, image + count
        rows = [i for i in range(len(prompts)) for _ in range(args.g)]
        width = max(len(p) for p in prompts)
        prompt_ids = torch.zeros(len(rows), width, dtype=torch.long)
        prompt_mask = torch.zeros(len(rows), width, dtype=torch.long)
        for r, i in enumerate(rows):
            prompt_ids[r, width - len(prompts[i]):] = prompts[i]
            prompt_mask[r, width - len(prompts[i]):] = 1
        pixel_values = torch.cat([images[i] for i in rows])
        image_sizes = torch.cat([sizes[i] for i in rows])
        began = time.perf_counter()
        with torch.no_grad():
            generated = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, pixel_values=pixel_values,
                                       image_sizes=image_sizes, do_sample=True, temperature=1.0, top_p=1.0,
                                       max_new_tokens=args.max_new, pad_token_id=11, eos_token_id=2,
                                       suppress_tokens=[10, 12, 13])  # the image tokens, as mmtrain
        rollout_s = time.perf_counter() - began
        completion_ids = generated[:, width:]
        is_eos = completion_ids == 2
        first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), torch.full((len(rows),), completion_ids.size(1)))
        completion_mask = (torch.arange(completion_ids.size(1)).unsqueeze(0) <= first_eos.unsqueeze(1)).long()
        tokens = int(completion_mask.sum())
        inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                  "completion_mask": completion_mask, "pixel_values": pixel_values, "image_sizes": image_sizes,
                  "num_images": [int(counts[i]) for i in rows], "advantages": torch.randn(len(rows)),
                  "num_items_in_batch": torch.tensor(float(tokens))}
        with torch.no_grad(), model.disable_adapter():
            ids = torch.cat([prompt_ids, completion_ids], 1)
            mask = torch.cat([prompt_mask, completion_mask], 1)
            inputs["ref_per_token_logps"], _, _ = trainer._get_per_token_logps_and_entropies(
                model, ids, mask, completion_ids.size(1), pixel_values=pixel_values, num_images=inputs["num_images"],
                image_sizes=image_sizes)
        optimizer.zero_grad()
        GRPOTrainer._compute_loss(trainer, model, inputs).backward()
        optimizer.step()
        step_s = time.perf_counter() - began
        lines.append(json.dumps({"iteration": step + 1, "step_time_ms": step_s * 1e3, "time/rollout_ms": rollout_s * 1e3,
                                 "rollout_tokens_per_s": tokens / rollout_s}))
        print(lines[-1], flush=True)
    (out / "steps.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
