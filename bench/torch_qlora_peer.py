#!/usr/bin/env python3
"""The PyTorch peers of bench/qlora.py: the bench-size Magistral as HF transformers'
Mistral3ForConditionalGeneration (bf16, the same HF weights mmtrain's arms load), peft LoRA on the
text decoder's q/k/v/o/gate/up/down (rank 8, alpha 16: mmtrain's default targets), FSDP2
(fully_shard on every decoder layer, then the root) over the torchrun ranks (gloo), one
intra-op thread each, AdamW (fused) at a constant 1e-4, grad clip 1.0, on exactly mmtrain's
micro-batches (`mmtrain debug collate` of each step, rank and micro-batch).

Arms:
  peft   FSDP2 + peft LoRA over the bf16 base (the peer of mmtrain's LoRA)
  nf4    the same with every adapted base weight a torchao NF4Tensor and its matmul torchao's
         linear_nf4, as torchtune's QLoRA runs it (the peer of mmtrain's nf4)

Usage (under torchrun): torch_qlora_peer.py --arm peft|nf4 --weights HF_DIR --batches DIR --steps N
--accum A --out METRICS.jsonl; DIR/s{step}_r{rank}_m{micro}.safetensors. Writes one JSON line a step:
{"iteration", "step_time_ms", "loss", "peak_rss_mb", "tokens"}.
"""
import torch
import torch.distributed as dist

import peer_steps


def quantize_base_nf4(model, world):
    """torchtune's QLoRA: each adapted Linear's frozen weight as an NF4Tensor (blocks of 64, scalers in
    blocks of 256), its forward torchao's linear_nf4 (dequantize to bf16, then the matmul). FSDP2 shards
    an NF4Tensor's scaler blocks, so a weight whose 64 x 256-element groups do not divide by the world
    size stays bf16 (the bench model's 128-row k/v projections: 3 groups on 2 ranks)."""
    from peft.tuners.lora import Linear as LoraLinear
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4, to_nf4
    quantized, kept = 0, 0
    for module in model.modules():
        if isinstance(module, LoraLinear):
            base = module.base_layer
            if (base.weight.numel() // (64 * 256)) % world:
                kept += 1
                continue
            base.weight = torch.nn.Parameter(to_nf4(base.weight.data, 64, 256), requires_grad=False)
            base.forward = lambda x, base=base: linear_nf4(x, base.weight)
            quantized += 1
    return quantized, kept


def main():
    args = peer_steps.parse_args(__doc__.splitlines()[0], lambda parser: parser.add_argument(
        "--arm", choices=["peft", "nf4"], required=True))
    from transformers import Mistral3ForConditionalGeneration

    model = Mistral3ForConditionalGeneration.from_pretrained(args.weights, dtype=torch.bfloat16)
    model.config._attn_implementation = "sdpa"
    quantized = []
    model, trainable = peer_steps.peft_under_fsdp2(model, lambda m: quantized.extend(
        quantize_base_nf4(m, dist.get_world_size()) if args.arm == "nf4" else (0, 0)))

    def micro_loss(b):
        inputs = {"input_ids": b["input_ids"], "labels": b["labels"], "position_ids": b["position_ids"]}
        if "pixel_values" in b:
            inputs.update(pixel_values=b["pixel_values"].to(torch.bfloat16), image_sizes=b["image_sizes"])
        return model(**inputs).loss

    peer_steps.run_steps(args, model, trainable, micro_loss, {"quantized": quantized[0], "left_bf16": quantized[1]})


if __name__ == "__main__":
    main()
