#!/usr/bin/env python3
"""The PyTorch peer of bench/dpo.py: TRL's DPO loss on HF transformers + peft under FSDP2, on exactly
mmtrain's DPO micro-batches (`mmtrain debug collate` of each step, rank and micro-batch).

The bench-size Magistral as Mistral3ForConditionalGeneration in fp32 (the same HF weights mmtrain's
arms load, sdpa attention), peft LoRA on the text decoder's q/k/v/o/gate/up/down (rank 8, alpha 16:
mmtrain's default targets), FSDP2 (fully_shard on every decoder layer, then the root) over the
torchrun ranks (gloo), one intra-op thread each. Each micro-batch goes through TRL 1.16's
`DPOTrainer._compute_loss` (its fused LM head, the reference as the adapters turned off by peft, as
TRL does for a PEFT model), backward of loss / micro-batches, then grad clip 1.0 and AdamW (fused)
at a constant 1e-4. The Trainer loop around it (accelerate, logging, data collation) is left out:
the peer gets only the loss, backward and optimizer work, its best case.

Usage (under torchrun): trl_dpo_peer.py --weights HF_DIR --batches DIR --steps N --accum A --out
METRICS.jsonl; DIR/s{step}_r{rank}_m{micro}.safetensors. Writes one JSON line a step:
{"iteration", "step_time_ms", "loss", "peak_rss_mb", "tokens"} (tokens: every rank's rows x columns, padding
included).
"""
import types
from collections import defaultdict

import torch

import peer_steps


def main():
    args = peer_steps.parse_args(__doc__.splitlines()[0])
    from transformers import Mistral3ForConditionalGeneration
    from trl.trainer.dpo_trainer import DPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    model = Mistral3ForConditionalGeneration.from_pretrained(args.weights, dtype=torch.float32)
    for sub in (model, model.model.vision_tower, model.model.language_model):
        sub.config._attn_implementation = "sdpa"
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    model, trainable = peer_steps.peft_under_fsdp2(model)
    accelerator = types.SimpleNamespace(device=torch.device("cpu"), unwrap_model=lambda m: m,
                                        gather=lambda t: t, gather_for_metrics=lambda t: t)
    trainer = types.SimpleNamespace(
        model=model, ref_model=None, accelerator=accelerator, aux_loss_enabled=False, precompute_ref_logps=False,
        args=types.SimpleNamespace(gradient_checkpointing_kwargs=None), ld_alpha=None, f_divergence_type="reverse_kl",
        loss_types=["sigmoid"], loss_weights=[1.0], beta=0.1, label_smoothing=0.0, use_weighting=False, _tp_size=1,
        _total_train_tokens=0, _metrics={"train": defaultdict(list), "eval": defaultdict(list)})

    def micro_loss(b):
        inputs = {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"],
                  "completion_mask": (b["labels"] != -100).long()}
        if "pixel_values" in b:
            inputs.update(pixel_values=b["pixel_values"], image_sizes=b["image_sizes"])
        return DPOTrainer._compute_loss(trainer, model, inputs, False)

    peer_steps.run_steps(args, model, trainable, micro_loss)


if __name__ == "__main__":
    main()
