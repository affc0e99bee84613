"""PyTorch FSDP2 side of bench/magihuman_vs_torch.sh: the project's reference DiT
(tests/parity/reference_magihuman.py) under torch.distributed.fsdp.fully_shard, plus the bench's
fixture.

Contract:
  prepare --dir D --mmtrain BIN
                      reads the size knobs from the environment (KNOBS below); with BIN writes
                      D/data (precomputed samples), D/bench.yaml (the config mmtrain trains),
                      D/weights (HF safetensors) and D/batches/s{step}_r{rank}.safetensors, the
                      collated micro-batch of every rank and step (`mmtrain debug collate`), so both
                      trainers see the same weights and batches; D/bench_meta.json. Reused while the
                      knobs are unchanged; clears old D/runs.
  torch --dir D --out O [--dcp-load DCP] [--dcp-save DCP] [--stop N]
                      WORLD gloo ranks, one intra-op thread each (optionally resuming from, stopping
                      after step N and saving a torch.distributed.checkpoint: HF keys, HF rows); every layer and the root are
                      fully_shard units (as mmtrain's plan); fp32 params, gathered in PARAM_DTYPE
                      (bf16: MixedPrecisionPolicy, upstream's numerics); torch.optim.AdamW(fused=True);
                      clip_grad_norm_ split for DTensors; the LR schedule of the YAML. With
                      OPTIMIZER=bnb8bit, bitsandbytes' AdamW8bit instead, stepping each rank's
                      local shards (bitsandbytes takes no DTensors; its blocks then count from each
                      shard's start, which costs the same). Output
                      O/metrics.jsonl (iteration, loss, grad_norm, lr, step_time_ms, peak_rss_mb).
PyTorch's best configuration, not the oracle's: attention is F.scaled_dot_product_attention (ATen's
CPU flash attention, one call per packed sample) instead of the reference's explicit softmax, whose
[heads, L, L] scores would dominate time and memory. The batch is read before the step clock starts.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))

import config_io  # noqa: E402
import mmtrain_util as mu  # noqa: E402
import reference_magihuman as R  # noqa: E402
import reference_transformer as rt  # noqa: E402

# knob -> default: the compute-dominated shape (hidden 1024, head_dim 128, 8 q / 2 KV
# heads, 4 layers, experts in the first and last, one packed sample of the official 32x8x15 video
# grid + 126 audio + 640 text = 4606 tokens per rank).
KNOBS = {"STEPS": 6, "WARMUP": 2, "LAYERS": 4, "HIDDEN": 1024, "HEAD_DIM": 128, "KV_HEADS": 2,
         "VIDEO_GRID": "32,8,15", "AUDIO_TOKENS": 126, "TEXT_TOKENS": 640, "SAMPLES": 4, "WORLD": 2,
         "PARAM_DTYPE": "fp32", "SEED": 7}


def knobs() -> dict:
    values = {}
    for name, default in KNOBS.items():
        raw = os.environ.get(name)
        values[name] = default if raw in (None, "") else (raw if isinstance(default, str) else int(raw))
    if values["PARAM_DTYPE"] not in ("fp32", "bf16"):
        raise SystemExit(f"PARAM_DTYPE: fp32 or bf16, got {values['PARAM_DTYPE']!r}")
    return values


def model_config(k: dict) -> dict:
    last = k["LAYERS"] - 1
    return R.make_config(num_layers=k["LAYERS"], hidden_size=k["HIDDEN"], head_dim=k["HEAD_DIM"],
                         num_query_groups=k["KV_HEADS"], mm_layers=sorted({0, last}), gelu7_layers=[0])


def bench_yaml(k: dict, d: str) -> str:
    training = {"micro_batch_size": 1, "gradient_accumulation_steps": 1, "seed": 42, "lr": 1.0e-4, "lr_min": 1.0e-5,
                "lr_warmup_ratio": 0.1, "lr_decay_style": "cosine", "weight_decay": 0.01, "clip_grad": 1.0,
                "train_iters": k["WARMUP"] + k["STEPS"]}
    return mu.magihuman_yaml("bench/magihuman_vs_torch.sh: MagiHuman where compute dominates (written by prepare).",
                             model_config(k), f"{d}/weights", f"{d}/data", training, f"{d}/runs/unused",
                             param_dtype=k["PARAM_DTYPE"])


def prepare(d: str, mmtrain: str) -> None:
    k = knobs()
    key_path = os.path.join(d, "fixture_key.json")
    shutil.rmtree(os.path.join(d, "runs"), ignore_errors=True)
    if os.path.exists(key_path) and json.load(open(key_path)) == k:
        print(json.dumps({"bench_dir": d, "reused": True, **k}))
        return
    for sub in ("data", "weights", "batches"):
        shutil.rmtree(os.path.join(d, sub), ignore_errors=True)
    cfg_path = os.path.join(d, "bench.yaml")
    with open(cfg_path, "w") as f:
        f.write(bench_yaml(k, d))
    c = model_config(k)

    def run(*args: str) -> None:
        subprocess.run([mmtrain, *args], check=True, stdout=subprocess.DEVNULL)

    run("fixture", "magihuman", "--out", os.path.join(d, "data"), "--samples", str(k["SAMPLES"]),
        "--seed", str(k["SEED"]), "--video-grid", k["VIDEO_GRID"], "--audio-tokens", str(k["AUDIO_TOKENS"]),
        "--text-tokens", str(k["TEXT_TOKENS"]), "--video-channels", str(c["video_in_channels"]),
        "--audio-channels", str(c["audio_in_channels"]), "--text-channels", str(c["text_in_channels"]))
    run("fixture", "magihuman-weights", "--config", cfg_path, "--out", os.path.join(d, "weights"), "--seed", "11")
    os.makedirs(os.path.join(d, "batches"))
    for step in range(k["WARMUP"] + k["STEPS"]):
        for rank in range(k["WORLD"]):
            run("debug", "collate", cfg_path, "--out", batch_path(d, step, rank), "--step", str(step),
                "--rank", str(rank), "--world", str(k["WORLD"]))
    json.dump(k, open(os.path.join(d, "bench_meta.json"), "w"))
    json.dump(k, open(key_path, "w"))
    print(json.dumps({"bench_dir": d, "reused": False, **k}))


def batch_path(d: str, step: int, rank: int) -> str:
    return os.path.join(d, "batches", f"s{step}_r{rank}.safetensors")


def sdpa_attention_core(q, k, v, cu_seqlens, num):
    """R.attention_core through ATen's fused attention: q [L, Hq, hd], k/v [L, Hkv, hd] -> [L, Hq, hd]
    fp32. Upstream numerics (bf16 params): ATen's bf16 flash attention (fp32 softmax and accumulation,
    bf16 output), as flash-attn upstream."""
    dtype = torch.bfloat16 if num.bf16 else q.dtype
    bounds = [int(b) for b in cu_seqlens]
    outs = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (t[a:b].to(dtype).transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)[0].transpose(0, 1))
    return torch.cat(outs, dim=0).to(q.dtype)


class Tensors(nn.Module):
    """Named tensors of the HF checkpoint as parameters ('.' -> '__': parameter names have no dots)."""

    def __init__(self, specs):
        super().__init__()
        for name, shape, _, trainable in specs:
            self.register_parameter(name.replace(".", "__"),
                                    nn.Parameter(torch.empty(shape, dtype=torch.float32), requires_grad=trainable))

    def as_dict(self) -> dict:
        return {n.replace("__", "."): p for n, p in self.named_parameters(recurse=False)}


class Layer(nn.Module):
    def __init__(self, cfg, index, specs, num):
        super().__init__()
        self.cfg, self.index, self.num = cfg, index, num
        self.tensors = Tensors(specs)

    def forward(self, h, packing):
        return R.layer(h, self.tensors.as_dict(), self.index, self.cfg, packing, self.num)


class Dit(nn.Module):
    def __init__(self, cfg, num):
        super().__init__()
        self.cfg, self.num = cfg, num
        specs = R.tensor_specs(cfg)
        by_layer = [[s for s in specs if s[0].startswith(f"block.layers.{i}.")] for i in range(cfg["num_layers"])]
        self.root = Tensors([s for s in specs if not s[0].startswith("block.layers.")])
        self.layers = nn.ModuleList(Layer(cfg, i, by_layer[i], num) for i in range(cfg["num_layers"]))

    def forward(self, batch):
        num = self.num
        root = self.root.as_dict()
        h, packing = R.adapter(root, batch, self.cfg, num)
        for layer in self.layers:
            h = layer(h, packing)
        pred = R.heads(h, root, self.cfg, packing, num)
        return R.flow_matching_loss(pred, batch, self.cfg)

    def named_layer_tensors(self):
        for name, p in self.root.as_dict().items():
            yield name, p
        for layer in self.layers:
            yield from layer.tensors.as_dict().items()


def load_own_rows(model: Dit, weights_dir: str, rank: int, world: int) -> None:
    """Each rank reads only its FSDP2 shard's rows of every tensor from the safetensors shards."""
    from safetensors import safe_open
    index = json.load(open(os.path.join(weights_dir, "model.safetensors.index.json")))["weight_map"]
    handles = {f: safe_open(os.path.join(weights_dir, f), "pt") for f in set(index.values())}
    mu.load_own_rows(model.named_layer_tensors(), lambda name: handles[index[name]].get_slice(name), rank, world)


def dcp_state(model: Dit, optimizer: torch.optim.Optimizer, step: int) -> dict:
    """What this trainer saves with torch.distributed.checkpoint: the weights and AdamW state under
    the HF keys (a port of the model names its parameters so), the HF row layout, and the step."""
    named = dict(model.named_layer_tensors())
    return {"model": named,
            "optim": {"state": {k: optimizer.state[p] for k, p in named.items() if p in optimizer.state}},
            "train_state": {"step": step}}


def dcp_resume(model: Dit, params: list, optimizer: torch.optim.Optimizer, path: str) -> int:
    """Loads a DCP into the live tensors (the AdamW state made first by a step of lr 0 on zero
    grads, which moves nothing) and returns its step."""
    import torch.distributed.checkpoint as dcp
    for p in params:
        p.grad = torch.zeros_like(p)
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    state = dcp_state(model, optimizer, 0)
    dcp.load(state, checkpoint_id=path)
    return int(state["train_state"]["step"])


def rank_main(rank: int, world: int, port: int, d: str, out: str, dcp_load: str | None = None,
              dcp_save: str | None = None, stop: int | None = None) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor
    from safetensors.torch import load_file

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    R.attention_core = sdpa_attention_core
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        k = json.load(open(os.path.join(d, "bench_meta.json")))
        tr = config_io.load_yaml(os.path.join(d, "bench.yaml"))["training"]
        cfg = model_config(k)
        mesh = init_device_mesh("cpu", (world,))
        bf16 = k["PARAM_DTYPE"] == "bf16"
        with torch.device("meta"):
            model = Dit(cfg, R.Numerics("upstream" if bf16 else "fp32"))
        # mmtrain's plan: the layers gather in param_dtype and reduce in fp32; the root unit (embedders,
        # final norms and heads) computes in fp32 whatever param_dtype is.
        layer_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else torch.float32,
                                            reduce_dtype=torch.float32, cast_forward_inputs=False)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=layer_policy)
        fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32,
                                                                      reduce_dtype=torch.float32,
                                                                      cast_forward_inputs=False))
        layers = list(model.layers)
        for i, layer in enumerate(layers[:-1]):
            layer.set_modules_to_forward_prefetch([layers[i + 1]])
        for i, layer in enumerate(layers[1:], start=1):
            layer.set_modules_to_backward_prefetch([layers[i - 1]])
        model.to_empty(device="cpu")
        load_own_rows(model, os.path.join(d, "weights"), rank, world)
        params = [p for p in model.parameters() if p.requires_grad]
        if os.environ.get("OPTIMIZER", "fused") == "bnb8bit":
            import bitsandbytes as bnb
            local = [torch.nn.Parameter(p.to_local()) for p in params]  # the shards' own storage
            optimizer = bnb.optim.AdamW8bit(local, lr=tr["lr"], weight_decay=tr["weight_decay"])

            def step_local():
                for lp, p in zip(local, params):
                    lp.grad = p.grad.to_local()
                optimizer.step()
                for lp in local:
                    lp.grad = None
        else:
            optimizer = torch.optim.AdamW(params, lr=tr["lr"], weight_decay=tr["weight_decay"], fused=True)
            step_local = optimizer.step
        iters = int(tr["train_iters"])
        start = dcp_resume(model, params, optimizer, dcp_load) if dcp_load else 0
        records = []
        for t in range(start, stop or iters):
            batch = load_file(batch_path(d, t, rank))
            lr = rt.lr_at(t, tr["lr"], tr["lr_min"], iters, tr["lr_warmup_ratio"], tr["lr_decay_style"])
            start = time.perf_counter()
            loss = model(batch)
            loss.backward()
            loss_sum = loss.detach().double()
            dist.all_reduce(loss_sum)
            total = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], 2.0)
            if isinstance(total, DTensor):
                total = total.full_tensor()
            torch.nn.utils.clip_grads_with_norm_(params, tr["clip_grad"], total)
            for group in optimizer.param_groups:
                group["lr"] = lr
            step_local()
            for p in params:
                p.grad = None
            step_ms = (time.perf_counter() - start) * 1000.0
            rss = torch.tensor([rt.peak_rss_mb()], dtype=torch.float64)
            dist.all_reduce(rss, op=dist.ReduceOp.MAX)
            records.append({"iteration": t + 1, "loss": float(loss_sum) / world, "grad_norm": float(total),
                            "lr": lr, "step_time_ms": step_ms, "peak_rss_mb": float(rss)})
        if dcp_save:
            import torch.distributed.checkpoint as dcp
            dcp.save(dcp_state(model, optimizer, stop or iters), checkpoint_id=dcp_save)
        if rank == 0:
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "metrics.jsonl"), "w") as f:
                for r in records:
                    f.write(json.dumps(r) + "\n")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    rt.finish_rank()  # not Python's finalization: see there


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cmd", choices=["prepare", "torch"])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--mmtrain", help="prepare: the mmtrain binary that writes the fixture")
    parser.add_argument("--out", help="torch: output directory (metrics.jsonl)")
    parser.add_argument("--dcp-load", help="torch: resume from this torch.distributed.checkpoint directory")
    parser.add_argument("--dcp-save", help="torch: write one there at the end")
    parser.add_argument("--stop", type=int, help="torch: stop after this step (of the same schedule)")
    args = parser.parse_args()
    d = os.path.abspath(args.dir)
    os.makedirs(d, exist_ok=True)
    if args.cmd == "prepare":
        if not args.mmtrain:
            parser.error("prepare needs --mmtrain")
        prepare(d, args.mmtrain)
    else:
        if not args.out:
            parser.error("torch needs --out")
        import torch.multiprocessing as mp
        world = json.load(open(os.path.join(d, "bench_meta.json")))["WORLD"]
        mp.spawn(rank_main, args=(world, rt.free_port(), d, os.path.abspath(args.out), args.dcp_load, args.dcp_save,
                                  args.stop), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
