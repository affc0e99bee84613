"""PyTorch twin of mmtrain's `test_transformer` and the reference trainer (plain or FSDP2).

Contract:
  ModelConfig.from_dict(cfg["model"]["config"]); ReferenceTransformer(ModelConfig):
      parameters named and shaped exactly as mmtrain's test_transformer (param_shapes());
      forward(tokens [B,S] int64) -> mean next-token CE loss (fp32), logits(inputs) -> [B,S-1,V].
      Math: HF-Llama RMSNorm, rotate-half RoPE, SDPA causal GQA, SwiGLU MLP, untied lm_head.
  make_fixture(out_dir, model_cfg, num_samples, seq_len, seed) -> (model path, tokens path):
      model.safetensors (fp32; matrices N(0, 0.02) drawn in param_shapes() order from one
      torch.Generator(seed); norm weights 1) and tokens.safetensors {"tokens": int64 [N, S]}
      (drawn from a second generator seeded seed + 1, so tokens do not depend on model size).
  lr_at(step, ...): Megatron-style warmup + constant/linear/cosine schedule (0-based step).
  train(cfg, world_size, backend="gloo", fsdp=True) -> TrainResult(metrics, params, output_dir)
      cfg is the mmtrain YAML as a dict. fsdp=True: `world_size` spawned ranks, fully_shard on
      the fsdp_plan modules then the root, MixedPrecisionPolicy(param_dtype, reduce_dtype).
      fsdp=False: one process that runs the same micro-batches in rank order (accum * W micro
      steps), emulating bf16 params with a bf16 compute copy whose grads accumulate in fp32.
      Writes <output_dir>/metrics.jsonl (rank 0; iteration, loss, grad_norm, lr, step_time_ms,
      peak_rss_mb), <output_dir>/final_params.safetensors (full fp32 params) and, when
      training.save is set, <save>/iter_NNNNNNN/ in mmtrain's sharded layout (mmtrain_util).
  CLI:
      reference_transformer.py fixture --out DIR --vocab V --hidden H --layers L --heads NH
          --kv-heads NKV --ffn F [--rope-theta T --eps E] --samples N --seq S --seed SEED
      reference_transformer.py train --config CFG.yaml --world W [--plain] [--set k=v ...]
      reference_transformer.py mmtrain-stub train CFG.yaml [--set k=v ...]   (under torchrun;
          see mmtrain_contract_stub.sh: a stand-in that checks the parity harness, not mmtrain)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import resource
import socket
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import config_io  # noqa: E402
import mmtrain_util  # noqa: E402


# ============================================================================= model

@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown test_transformer config keys: {sorted(unknown)}")
        cfg = cls(**{k: (float(v) if k in ("rope_theta", "rms_norm_eps") else int(v)) for k, v in d.items()})
        if cfg.hidden_size % cfg.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        if cfg.num_heads % cfg.num_kv_heads:
            raise ValueError("num_heads must be divisible by num_kv_heads")
        if cfg.head_dim % 2:
            raise ValueError("head_dim must be even for RoPE")
        return cfg

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter, in the contract's order (the order make_fixture draws them in)."""
    H, V, F_, hd = cfg.hidden_size, cfg.vocab_size, cfg.ffn_hidden_size, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (V, H)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes[p + "attn_norm.weight"] = (H,)
        shapes[p + "attn.wq.weight"] = (cfg.num_heads * hd, H)
        shapes[p + "attn.wk.weight"] = (cfg.num_kv_heads * hd, H)
        shapes[p + "attn.wv.weight"] = (cfg.num_kv_heads * hd, H)
        shapes[p + "attn.wo.weight"] = (H, cfg.num_heads * hd)
        shapes[p + "mlp_norm.weight"] = (H,)
        shapes[p + "mlp.w1.weight"] = (F_, H)
        shapes[p + "mlp.w3.weight"] = (F_, H)
        shapes[p + "mlp.w2.weight"] = (H, F_)
    shapes["norm.weight"] = (H,)
    shapes["lm_head.weight"] = (V, H)
    return shapes


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Exactly HF Llama: normalise in fp32, cast back to the activation dtype, then scale.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_cos_sin(seq_len: int, head_dim: int, theta: float, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [seq_len, head_dim] for positions 0..seq_len-1, computed in fp32, cast to dtype."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    positions = torch.arange(seq_len, dtype=torch.int64, device=device).float()
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, S, heads, hd]; cos/sin [S, hd] broadcast over batch and heads."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        H, hd = cfg.hidden_size, cfg.head_dim
        self.wq = nn.Linear(H, cfg.num_heads * hd, bias=False)
        self.wk = nn.Linear(H, cfg.num_kv_heads * hd, bias=False)
        self.wv = nn.Linear(H, cfg.num_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.num_heads * hd, H, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        q = self.wq(x).view(B, S, self.num_heads, self.head_dim)
        k = self.wk(x).view(B, S, self.num_kv_heads, self.head_dim)
        v = self.wv(x).view(B, S, self.num_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        # enable_gqa: kv head j serves q heads j*(nh/nkv) .. (j+1)*(nh/nkv)-1.
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(o.transpose(1, 2).reshape(B, S, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=False)
        self.w3 = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        # Activation recompute sits inside the block's forward, i.e. inside FSDP2's hooks on
        # the block (torchtitan's checkpoint_wrapper-then-fully_shard order): the recompute in
        # backward runs while the block's params are still unsharded.
        self.recompute = False

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x), cos, sin)
        return h + self.mlp(self.mlp_norm(h))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._forward, x, cos, sin, use_reentrant=False)
        return self._forward(x, cos, sin)


class ReferenceTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self.embed(inputs)
        # RoPE tables follow the activation dtype (bf16 under mixed precision), as in HF.
        cos, sin = rope_cos_sin(inputs.shape[1], self.cfg.head_dim, self.cfg.rope_theta, x.dtype, x.device)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        logits = self.logits(inputs)
        return F.cross_entropy(logits.float().reshape(-1, self.cfg.vocab_size), labels.reshape(-1))


# ============================================================================= fixture

def init_params(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        if len(shape) == 1:
            params[name] = torch.ones(shape)
        else:
            params[name] = torch.normal(0.0, 0.02, size=shape, generator=gen)
    return params


def make_fixture(out_dir: str, model_cfg: ModelConfig | dict, num_samples: int, seq_len: int,
                 seed: int) -> tuple[str, str]:
    cfg = model_cfg if isinstance(model_cfg, ModelConfig) else ModelConfig.from_dict(model_cfg)
    os.makedirs(out_dir, exist_ok=True)
    model_path = os.path.join(out_dir, "model.safetensors")
    tokens_path = os.path.join(out_dir, "tokens.safetensors")
    save_file(init_params(cfg, seed), model_path)
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, cfg.vocab_size, (num_samples, seq_len), generator=gen, dtype=torch.int64)
    save_file({"tokens": tokens}, tokens_path)
    return model_path, tokens_path


# ============================================================================= schedule

def lr_at(step: int, lr_max: float, lr_min: float, train_iters: int, warmup_ratio: float,
          decay_style: str) -> float:
    """Megatron-style LR for 0-based optimizer step `step` (same float ops as the C++ side)."""
    warmup = int(warmup_ratio * train_iters)
    if warmup > 0 and step <= warmup:
        return lr_max * step / warmup
    ratio = (step - warmup) / (train_iters - warmup)
    if decay_style == "constant":
        return lr_max
    if decay_style == "linear":
        return lr_min + (lr_max - lr_min) * (1 - ratio)
    if decay_style == "cosine":
        return lr_min + (lr_max - lr_min) * 0.5 * (math.cos(math.pi * ratio) + 1)
    raise ValueError(f"unknown lr_decay_style {decay_style!r}")


# ============================================================================= run config

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def _dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(_DTYPES)}") from None


@dataclasses.dataclass
class RunConfig:
    """The fields of the mmtrain YAML the reference trainer uses, typed, with mmtrain's defaults."""
    model: ModelConfig
    model_path: str
    tokens_path: str
    micro_batch_size: int
    grad_accum: int
    train_iters: int
    lr: float
    lr_min: float
    lr_warmup_ratio: float
    lr_decay_style: str
    weight_decay: float
    clip_grad: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    min_8bit_size: int
    seed: int
    save: str | None
    output_dir: str | None
    param_dtype: torch.dtype
    reduce_dtype: torch.dtype
    fsdp_modules: list[str]
    forward_prefetch: int
    backward_prefetch: int
    recompute: bool
    recompute_modules: list[str]

    @classmethod
    def from_yaml_dict(cls, cfg: dict) -> "RunConfig":
        model = cfg.get("model", {})
        if model.get("model_id", "test_transformer") != "test_transformer":
            raise ValueError(f"the reference trainer only knows test_transformer, not {model.get('model_id')!r}")
        model_path = model["model_name_or_path"]
        if os.path.isdir(model_path):
            model_path = os.path.join(model_path, "model.safetensors")
        data = cfg.get("data", {}).get("dataset_param", {})
        if data.get("dataset_type", "token_file") != "token_file":
            raise ValueError(f"unsupported dataset_type {data.get('dataset_type')!r}")
        fsdp = cfg.get("parallel", {}).get("fsdp_plan", {}) or {}
        feats = cfg.get("features", {}) or {}
        tr = cfg.get("training", {})
        return cls(
            model=ModelConfig.from_dict(model["config"]),
            model_path=model_path,
            tokens_path=data["path"],
            micro_batch_size=int(tr.get("micro_batch_size", 1)),
            grad_accum=int(tr.get("gradient_accumulation_steps", 1)),
            train_iters=int(tr["train_iters"]),
            lr=float(tr["lr"]),
            lr_min=float(tr.get("lr_min", 0.0)),
            lr_warmup_ratio=float(tr.get("lr_warmup_ratio", 0.0)),
            lr_decay_style=str(tr.get("lr_decay_style", "constant")),
            weight_decay=float(tr.get("weight_decay", 0.0)),
            clip_grad=float(tr.get("clip_grad", 0.0)),
            adam_beta1=float(tr.get("adam_beta1", 0.9)),
            adam_beta2=float(tr.get("adam_beta2", 0.999)),
            adam_eps=float(tr.get("adam_eps", 1e-8)),
            min_8bit_size=int(tr.get("min_8bit_size", 4096)),
            seed=int(tr.get("seed", 0)),
            save=tr.get("save") or None,
            output_dir=(cfg.get("logging", {}) or {}).get("output_dir") or None,
            param_dtype=_dtype(fsdp.get("param_dtype", "fp32")),
            reduce_dtype=_dtype(fsdp.get("reduce_dtype", "fp32")),
            fsdp_modules=list(fsdp.get("apply_modules", ["layers.{*}"])),
            forward_prefetch=int(fsdp.get("num_to_forward_prefetch", 1)),
            backward_prefetch=int(fsdp.get("num_to_backward_prefetch", 1)),
            recompute=bool(feats.get("recompute", False)),
            recompute_modules=list((feats.get("recompute_plan", {}) or {}).get("apply_modules", ["layers.{*}"])),
        )


def match_modules(model: nn.Module, patterns: Sequence[str]) -> list[tuple[str, nn.Module]]:
    """Modules whose qualified name matches a plan pattern; '{*}' matches one list index."""
    regexes = [re.compile("^" + re.escape(p).replace(re.escape("{*}"), r"\d+") + "$") for p in patterns]
    return [(name, mod) for name, mod in model.named_modules() if name and any(r.match(name) for r in regexes)]


def apply_recompute(model: ReferenceTransformer, rc: RunConfig) -> None:
    if not rc.recompute:
        return
    for name, mod in match_modules(model, rc.recompute_modules):
        if not isinstance(mod, TransformerBlock):
            raise ValueError(f"recompute_plan module {name!r} is not a transformer block")
        mod.recompute = True


# ============================================================================= trainer

@dataclasses.dataclass
class TrainResult:
    metrics: list[dict]
    params: dict[str, torch.Tensor]
    output_dir: str


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def micro_batch_indices(step: int, micro: int, rank: int, ranks: int, mbs: int, accum: int,
                        num_samples: int) -> torch.Tensor:
    """Sample ids of micro-batch `micro` on `rank` at optimizer step `step` (the data contract)."""
    gbs = mbs * accum * ranks
    base = step * gbs + (micro * ranks + rank) * mbs
    return torch.arange(base, base + mbs) % num_samples


# AdamW implementations: torch.optim.AdamW "fused" (fused=True, one ATen kernel per step; what
# mmtrain's adamw runs) and "single" (foreach=False, the per-tensor op sequence); "bnb8bit":
# bitsandbytes' AdamW8bit (what mmtrain's adamw8bit follows), with the config's min_8bit_size.
ADAMW_KINDS = ("fused", "single", "bnb8bit")


class _StepRunner:
    """The per-step loop shared by plain and FSDP2 training. `ranks`/`rank` describe the data
    split this process runs; plain training runs all W*accum micro-batches itself."""

    def __init__(self, rc: RunConfig, model: nn.Module, rank: int, ranks: int, accum: int,
                 distributed: bool, forward: Callable[[torch.Tensor], torch.Tensor],
                 after_backward: Callable[[], None] | None = None, adamw: str = "fused"):
        self.rc, self.model, self.rank, self.ranks, self.accum = rc, model, rank, ranks, accum
        self.distributed = distributed
        self.forward = forward
        self.after_backward = after_backward
        with safe_open(rc.tokens_path, "pt") as f:
            self.tokens = f.get_tensor("tokens")
        if self.tokens.dtype != torch.int64 or self.tokens.dim() != 2:
            raise ValueError(f"{rc.tokens_path}: tokens must be int64 [N, S], got {self.tokens.dtype} "
                             f"{tuple(self.tokens.shape)}")
        self.params = list(model.parameters())
        if adamw not in ADAMW_KINDS:
            raise ValueError(f"adamw must be one of {ADAMW_KINDS}, got {adamw!r}")
        if adamw == "bnb8bit":
            import bitsandbytes as bnb
            self.optimizer = bnb.optim.AdamW8bit(self.params, lr=rc.lr, betas=(rc.adam_beta1, rc.adam_beta2),
                                                 eps=rc.adam_eps, weight_decay=rc.weight_decay,
                                                 min_8bit_size=rc.min_8bit_size)
        else:
            self.optimizer = torch.optim.AdamW(self.params, lr=rc.lr, betas=(rc.adam_beta1, rc.adam_beta2),
                                               eps=rc.adam_eps, weight_decay=rc.weight_decay,
                                               foreach=False, fused=(adamw == "fused"))

    def grad_norm_and_clip(self) -> float:
        grads = [p.grad for p in self.params if p.grad is not None]
        if not self.distributed:
            if self.rc.clip_grad > 0:
                return float(torch.nn.utils.clip_grad_norm_(self.params, self.rc.clip_grad))
            return float(torch.nn.utils.get_total_norm(grads, 2.0))
        # clip_grad_norm_ split in its two halves (what it does internally), because the norm of
        # sharded DTensor grads must be materialised with full_tensor() before clipping.
        from torch.distributed.tensor import DTensor
        total = torch.nn.utils.get_total_norm(grads, 2.0)
        if isinstance(total, DTensor):
            total = total.full_tensor()
        if self.rc.clip_grad > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.rc.clip_grad, total)
        return float(total)

    def step(self, t: int) -> dict:
        rc = self.rc
        lr = lr_at(t, rc.lr, rc.lr_min, rc.train_iters, rc.lr_warmup_ratio, rc.lr_decay_style)
        start = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float64)
        for m in range(self.accum):
            idx = micro_batch_indices(t, m, self.rank, self.ranks, rc.micro_batch_size, self.accum,
                                      self.tokens.shape[0])
            loss = self.forward(self.tokens[idx])
            (loss / self.accum).backward()
            if self.after_backward is not None:
                self.after_backward()
            loss_sum += loss.detach().double()
        if self.distributed:
            import torch.distributed as dist
            dist.all_reduce(loss_sum)
            world = dist.get_world_size()
        else:
            world = 1
        grad_norm = self.grad_norm_and_clip()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        step_ms = (time.perf_counter() - start) * 1000.0
        rss = torch.tensor([peak_rss_mb()], dtype=torch.float64)
        if self.distributed:
            import torch.distributed as dist
            dist.all_reduce(rss, op=dist.ReduceOp.MAX)
        return {"iteration": t + 1, "loss": float(loss_sum) / (self.accum * world),
                "grad_norm": grad_norm, "lr": lr, "step_time_ms": step_ms, "peak_rss_mb": float(rss)}


def _train_loop(runner: _StepRunner, rc: RunConfig, out_dir: str, write: bool,
                on_step: Callable[[], None] | None = None, start: int = 0, stop: int | None = None) -> list[dict]:
    metrics = []
    path = os.path.join(out_dir, "metrics.jsonl")
    f = open(path, "w") if write else None
    try:
        for t in range(start, rc.train_iters if stop is None else stop):
            record = runner.step(t)
            if on_step is not None:
                on_step()
            metrics.append(record)
            if f is not None:
                f.write(json.dumps(record) + "\n")
                f.flush()
    finally:
        if f is not None:
            f.close()
    return metrics


def _train_plain(rc: RunConfig, world_size: int, out_dir: str, adamw: str) -> None:
    model = ReferenceTransformer(rc.model)
    model.load_state_dict(load_file(rc.model_path), strict=True)
    apply_recompute(model, rc)
    accum = rc.grad_accum * world_size  # the W ranks' micro-batches, in rank order

    if rc.param_dtype == torch.float32:
        runner = _StepRunner(rc, model, 0, 1, accum, False, forward=model, adamw=adamw)
        _train_loop(runner, rc, out_dir, write=True)
    else:
        # FSDP2 MixedPrecisionPolicy emulation: forward/backward on a low-precision copy of the
        # fp32 master params; each backward's grad is cast to fp32 and accumulated (FSDP2 casts
        # to reduce_dtype before its reduce-scatter and accumulates sharded fp32 grads).
        if rc.reduce_dtype != torch.float32:
            raise ValueError("plain training emulates reduce_dtype fp32 only")
        compute = ReferenceTransformer(rc.model).to(rc.param_dtype)
        apply_recompute(compute, rc)
        pairs = list(zip(model.parameters(), compute.parameters()))

        def sync_compute_params() -> None:
            with torch.no_grad():
                for master, low in pairs:
                    low.copy_(master)

        def accumulate_grads() -> None:
            for master, low in pairs:
                if low.grad is None:
                    continue
                g = low.grad.float()
                master.grad = g if master.grad is None else master.grad.add_(g)
                low.grad = None

        sync_compute_params()
        runner = _StepRunner(rc, model, 0, 1, accum, False, forward=compute, after_backward=accumulate_grads,
                             adamw=adamw)
        _train_loop(runner, rc, out_dir, write=True, on_step=sync_compute_params)

    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    save_file(params, os.path.join(out_dir, "final_params.safetensors"))
    if rc.save:
        iter_dir = os.path.join(rc.save, mmtrain_util.iter_dir_name(rc.train_iters))
        mmtrain_util.write_sharded_params(iter_dir, 0, 1, params, {n: p.shape for n, p in params.items()},
                                          rc.train_iters)


def _build_fsdp_model(rc: RunConfig, rank: int, world: int) -> ReferenceTransformer:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (world,))
    # Build on meta and load only this rank's rows afterwards, so no rank ever holds the full
    # fp32 model (keeps peak RSS comparable with a sharded C++ loader).
    with torch.device("meta"):
        model = ReferenceTransformer(rc.model)
    apply_recompute(model, rc)
    policy = MixedPrecisionPolicy(param_dtype=rc.param_dtype, reduce_dtype=rc.reduce_dtype)
    sharded = match_modules(model, rc.fsdp_modules)
    for _, mod in reversed(sharded):  # children before parents, as fully_shard requires
        fully_shard(mod, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)

    layers = [mod for _, mod in sharded]
    if rc.forward_prefetch > 0:
        for i, mod in enumerate(layers[:-1]):
            mod.set_modules_to_forward_prefetch(layers[i + 1:i + 1 + rc.forward_prefetch])
    if rc.backward_prefetch > 0:
        for i, mod in enumerate(layers[1:], start=1):
            mod.set_modules_to_backward_prefetch(list(reversed(layers[max(0, i - rc.backward_prefetch):i])))

    model.to_empty(device="cpu")
    with safe_open(rc.model_path, "pt") as f:
        mmtrain_util.load_own_rows(model.named_parameters(), f.get_slice, rank, world)
    return model


def finish_rank() -> None:
    """Ends a spawned rank whose work succeeded (its files written, its process group destroyed)
    without Python's finalization. destroy_process_group does not free a ProcessGroupGloo that FSDP2's
    mesh still references, so its worker thread lives on and may drop a finished work (the last
    barrier's, which holds earlier collectives' tensors with Python objects) while the interpreter
    finalizes: that decref needs the GIL, Python ends a thread asking for it then with pthread_exit,
    the forced unwind crosses a noexcept destructor and std::terminate aborts the rank: "terminate
    called without an active exception", SIGABRT (or SIGSEGV when faulthandler's dump crashes too).
    Found from a core dump (issue 35: ProcessGroupGloo::runLoop -> ~AsyncBarrierWork ->
    ~AsyncAllgatherCoalescedWork -> TensorImpl::decref_pyobject -> take_gil -> pthread_exit ->
    std::terminate), about 1 run in 30 with two runs at once. Nothing is left to finalize: exit now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _fsdp_worker(rank: int, world: int, port: int, cfg: dict, out_dir: str, backend: str, threads: int,
                 adamw: str, dcp: dict) -> None:
    # A rank that dies on a signal (a SIGABRT from a collective library's thread) prints every
    # thread's Python stack first: mp.spawn alone says only which rank died and on what signal.
    import faulthandler
    faulthandler.enable(all_threads=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    _fsdp_rank_main(rank, world, cfg, out_dir, backend, threads, adamw, **dcp)
    finish_rank()


def _dcp_state(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> dict:
    """What a PyTorch user saves with torch.distributed.checkpoint: get_state_dict's model and
    optimizer state dicts, and the step."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd, "train_state": {"step": step}}


def _dcp_load(model: nn.Module, optimizer: torch.optim.Optimizer, path: str) -> int:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    state = _dcp_state(model, optimizer, 0)
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["train_state"]["step"])


def _fsdp_rank_main(rank: int, world: int, cfg: dict, out_dir: str, backend: str, threads: int,
                    adamw: str = "fused", dcp_load: str | None = None, dcp_save: str | None = None,
                    stop: int | None = None) -> None:
    """One FSDP2 rank; the process group comes from MASTER_ADDR/MASTER_PORT (env://). dcp_load:
    resume from that DCP checkpoint; stop: the step to stop after (default train_iters);
    dcp_save: write a DCP checkpoint there at the end."""
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        rc = RunConfig.from_yaml_dict(cfg)
        model = _build_fsdp_model(rc, rank, world)
        runner = _StepRunner(rc, model, rank, world, rc.grad_accum, True, forward=model, adamw=adamw)
        start = _dcp_load(model, runner.optimizer, dcp_load) if dcp_load else 0
        _train_loop(runner, rc, out_dir, write=(rank == 0), start=start, stop=stop)
        if dcp_save:
            import torch.distributed.checkpoint as dcp
            dcp.save(_dcp_state(model, runner.optimizer, stop or rc.train_iters), checkpoint_id=dcp_save)

        full = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}  # collective
        if rank == 0:
            save_file(full, os.path.join(out_dir, "final_params.safetensors"))
        if rc.save:
            iter_dir = os.path.join(rc.save, mmtrain_util.iter_dir_name(rc.train_iters))
            local = {n: p.to_local() for n, p in model.named_parameters()}
            mmtrain_util.write_sharded_params(iter_dir, rank, world, local, {n: t.shape for n, t in full.items()},
                                              rc.train_iters)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(cfg: dict, world_size: int, backend: str = "gloo", fsdp: bool = True,
          threads: int | None = None, adamw: str = "fused", dcp_load: str | None = None,
          dcp_save: str | None = None, stop: int | None = None) -> TrainResult:
    """Runs the reference training described by the mmtrain YAML dict `cfg` (see module doc).
    threads: intra-op threads per rank (default $OMP_NUM_THREADS or 1); adamw: one of ADAMW_KINDS.
    FSDP2 only: dcp_load resumes from a torch.distributed.checkpoint directory, stop ends after that
    step (of the same schedule), dcp_save writes one at the end."""
    rc = RunConfig.from_yaml_dict(cfg)
    out_dir = rc.output_dir or tempfile.mkdtemp(prefix="torch_ref_")
    os.makedirs(out_dir, exist_ok=True)
    threads = threads or int(os.environ.get("OMP_NUM_THREADS", "1"))
    if fsdp:
        import torch.multiprocessing as mp
        dcp = dict(dcp_load=dcp_load, dcp_save=dcp_save, stop=stop)
        mp.spawn(_fsdp_worker, args=(world_size, free_port(), cfg, out_dir, backend, threads, adamw, dcp),
                 nprocs=world_size, join=True)
    else:
        saved_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            _train_plain(rc, world_size, out_dir, adamw)
        finally:
            torch.set_num_threads(saved_threads)
    metrics = mmtrain_util.read_metrics(os.path.join(out_dir, "metrics.jsonl"))
    params = load_file(os.path.join(out_dir, "final_params.safetensors"))
    return TrainResult(metrics=metrics, params=params, output_dir=out_dir)


# ============================================================================= CLI

def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    fx = sub.add_parser("fixture", help="write model.safetensors and tokens.safetensors")
    fx.add_argument("--out", required=True)
    fx.add_argument("--vocab", type=int, default=128)
    fx.add_argument("--hidden", type=int, default=64)
    fx.add_argument("--layers", type=int, default=2)
    fx.add_argument("--heads", type=int, default=4)
    fx.add_argument("--kv-heads", type=int, default=2)
    fx.add_argument("--ffn", type=int, default=128)
    fx.add_argument("--rope-theta", type=float, default=10000.0)
    fx.add_argument("--eps", type=float, default=1e-6)
    fx.add_argument("--samples", type=int, default=64)
    fx.add_argument("--seq", type=int, default=33)
    fx.add_argument("--seed", type=int, default=1234)
    tr = sub.add_parser("train", help="train from an mmtrain YAML config")
    tr.add_argument("--config", required=True)
    tr.add_argument("--world", type=int, default=1)
    tr.add_argument("--plain", action="store_true", help="single process instead of FSDP2 ranks")
    tr.add_argument("--backend", default="gloo")
    tr.add_argument("--threads", type=int, default=None, help="intra-op threads per rank")
    tr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    stub = sub.add_parser("mmtrain-stub", help="stand-in with mmtrain's CLI, to check the parity harness itself")
    stub.add_argument("verb", choices=["train"])
    stub.add_argument("config")
    stub.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    if args.cmd == "mmtrain-stub":
        # Launched by torchrun like mmtrain: rank and rendezvous come from the environment.
        cfg = config_io.apply_overrides(config_io.load_yaml(args.config), args.set)
        out_dir = cfg["logging"]["output_dir"]
        os.makedirs(out_dir, exist_ok=True)
        _fsdp_rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), cfg, out_dir, "gloo",
                        int(os.environ.get("OMP_NUM_THREADS", "1")))
        return 0

    if args.cmd == "fixture":
        cfg = ModelConfig(args.vocab, args.hidden, args.layers, args.heads, args.kv_heads, args.ffn,
                          args.rope_theta, args.eps)
        ModelConfig.from_dict(cfg.to_dict())  # validate
        model_path, tokens_path = make_fixture(args.out, cfg, args.samples, args.seq, args.seed)
        print(json.dumps({"model": model_path, "tokens": tokens_path, "config": cfg.to_dict()}))
        return 0

    cfg = config_io.apply_overrides(config_io.load_yaml(args.config), args.set)
    result = train(cfg, args.world, backend=args.backend, fsdp=not args.plain, threads=args.threads)
    last = result.metrics[-1]
    print(json.dumps({"output_dir": result.output_dir, "iterations": len(result.metrics),
                      "final_loss": last["loss"], "final_grad_norm": last["grad_norm"]}))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
