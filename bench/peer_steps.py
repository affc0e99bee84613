"""What the PyTorch peers of the benches share (bench/torch_qlora_peer.py, bench/trl_dpo_peer.py):
their command line, peft LoRA on the bench Magistral's text decoder under FSDP2, and the timed step
loop over mmtrain's own micro-batches (`mmtrain debug collate` of each step, rank and micro-batch),
one JSON line a step: {"iteration", "step_time_ms", "loss", "peak_rss_mb", "tokens", **extra}, the
peak the maximum over ranks and the tokens every rank's rows x columns (padding included)."""
import argparse
import json
import os
import resource
import time

import torch
import torch.distributed as dist
from safetensors.torch import load_file

# mmtrain's default LoRA targets for mistral3: the text decoder's q/k/v/o/gate/up/down.
ADAPTED = r".*language_model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)"


def parse_args(description: str, extra=lambda parser: None):
    parser = argparse.ArgumentParser(description=description)
    extra(parser)
    parser.add_argument("--weights", required=True)
    parser.add_argument("--batches", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--accum", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    return args


def peft_under_fsdp2(model, before_sharding=lambda model: None):
    """peft LoRA (rank 8, alpha 16) on ADAPTED, then fully_shard on every decoder layer and the root
    (the Pixtral tower with the root: HF skips the tower on a micro-batch without images, and a unit
    of its own would be gathered on some ranks only). Returns the model and its trainable params."""
    import peft
    from torch.distributed.fsdp import fully_shard
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=ADAPTED))
    before_sharding(model)
    for layer in model.base_model.model.model.language_model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model, [p for p in model.parameters() if p.requires_grad]


def run_steps(args, model, trainable, micro_loss, extra=None):
    """args.steps optimizer steps of args.accum micro-batches each: micro_loss(batch) backward (over
    the accumulation), grad clip 1.0, AdamW (fused where torch has it) at a constant 1e-4."""
    try:
        optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
    except (RuntimeError, TypeError):
        optimizer = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
    model.train()
    rank = dist.get_rank()
    out = open(args.out, "w") if rank == 0 else None
    for step in range(args.steps):
        batches = [load_file(os.path.join(args.batches, f"s{step}_r{rank}_m{m}.safetensors")) for m in range(args.accum)]
        dist.barrier()
        began = time.perf_counter()
        total, tokens = 0.0, 0
        for b in batches:
            loss = micro_loss(b) / args.accum
            loss.backward()
            total += loss.item()
            tokens += b["input_ids"].numel()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        elapsed = (time.perf_counter() - began) * 1e3
        peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        step_tokens = torch.tensor([float(tokens)])
        dist.all_reduce(step_tokens)
        if out:
            out.write(json.dumps({"iteration": step + 1, "step_time_ms": elapsed, "loss": total,
                                  "peak_rss_mb": peak.item(), "tokens": int(step_tokens.item()), **(extra or {})}) + "\n")
            out.flush()
    dist.destroy_process_group()
