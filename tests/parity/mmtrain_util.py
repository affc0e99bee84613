"""Driving the mmtrain binary and reading what it writes; shared by the parity tests and bench.

Contract:
  mmtrain checkpoint layout (also written by the reference trainer, so one reader serves both):
    <save>/iter_NNNNNNN/rank_00000.safetensors ... rank_{W-1:05d}.safetensors
    each model parameter under key "model.<param name>"; rank r holds a contiguous block of
    dim-0 rows, blocks in rank order (a file may lack the tensor or hold 0 rows); other key
    prefixes (optimizer state, ...) are ignored here. Optional index.json (INDEX_FORMAT):
      {"format": "mmtrain.sharded_checkpoint", "version": 1, "world_size": W, "iteration": N,
       "tensors": {"model.embed.weight": {"shape": [V, H], "dtype": "F32",
                   "shards": [{"rank": 0, "file": "rank_00000.safetensors", "rows": [0, 33]}, ...]}}}
      (the subset of docs/checkpoint_format.md this reader needs)
  load_mmtrain_params(iter_dir) -> {param name (no "model." prefix): full tensor}
      Uses index.json when present and in that format (checks shapes and row coverage), else
      concatenates the rank files in rank order.
  write_sharded_params(iter_dir, rank, world, local_params, full_shapes) writes that layout.
  latest_iter_dir(save_dir), read_metrics(path)
  run_mmtrain(bin, cfg_path, world, log_path) runs
      torchrun --standalone --nproc-per-node W --no-python BIN train CFG [--set k=v ...]
      with OMP_NUM_THREADS=1 per rank; raises MmtrainFailed with the log tail on failure.
  mmtrain_config(...) -> the mmtrain YAML as a dict with every training key explicit.
  magihuman_yaml(title, c, weights, data_root, training, output_dir) -> the YAML text of a MagiHuman
      run (FSDP over the DiT's layers in fp32, model config c from reference_magihuman.make_config,
      the precomputed-latent dataset, raw loss) with the given training keys.
  Comparison metrics: curve_rel_diff (sum|a-b|/sum|b|), step_rel_diffs, param_rel_diffs
      (per tensor ||a-b||_2 / ||b||_2).
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import warnings
from typing import Iterable, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save_file

import config_io

INDEX_FORMAT = "mmtrain.sharded_checkpoint"
MODEL_PREFIX = "model."
_RANK_FILE_RE = re.compile(r"^rank_(\d{5})\.safetensors$")
_ITER_DIR_RE = re.compile(r"^iter_(\d{7})$")


# ----------------------------------------------------------------------------- sharding layout

def shard_rows(num_rows: int, rank: int, world: int) -> tuple[int, int]:
    """(row_start, rows) of rank's dim-0 block: torch.chunk's split, which FSDP2 uses (the last
    ranks may get fewer or zero rows)."""
    chunk = -(-num_rows // world) if num_rows else 0
    start = min(rank * chunk, num_rows)
    return start, max(0, min(chunk, num_rows - start))


def load_own_rows(named_params, get_slice, rank: int, world: int) -> None:
    """Fills each FSDP2 DTensor param's local shard with its rows of the full tensor: get_slice(name)
    is a safetensors slice (safe_open(...).get_slice), so no rank reads more than its rows."""
    import torch
    with torch.no_grad():
        for name, p in named_params:
            local = p.to_local()
            start, rows = shard_rows(p.shape[0], rank, world)
            if local.shape[0] != rows:
                raise RuntimeError(f"{name}: FSDP2 shard has {local.shape[0]} rows, expected {rows}")
            if rows:
                local.copy_(get_slice(name)[start:start + rows])


def iter_dir_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def rank_file_name(rank: int) -> str:
    return f"rank_{rank:05d}.safetensors"


def write_sharded_params(iter_dir: str, rank: int, world: int, local_params: dict[str, torch.Tensor],
                         full_shapes: dict[str, Sequence[int]], iteration: int) -> None:
    """Writes rank's file; rank 0 also writes index.json. local_params are dim-0 blocks."""
    os.makedirs(iter_dir, exist_ok=True)
    tensors = {MODEL_PREFIX + name: t.detach().contiguous().cpu() for name, t in local_params.items()}
    save_file(tensors, os.path.join(iter_dir, rank_file_name(rank)))
    if rank != 0:
        return
    index = {"format": INDEX_FORMAT, "version": 1, "world_size": world, "iteration": iteration, "tensors": {}}
    for name, shape in full_shapes.items():
        shards = []
        for r in range(world):
            start, rows = shard_rows(shape[0], r, world) if len(shape) else (0, 0)
            shards.append({"rank": r, "file": rank_file_name(r), "rows": [start, start + rows]})
        index["tensors"][MODEL_PREFIX + name] = {"shape": list(shape), "dtype": "F32", "shards": shards}
    with open(os.path.join(iter_dir, "index.json"), "w") as f:
        json.dump(index, f, indent=1)


def _rank_files(iter_dir: str) -> list[str]:
    found = {}
    for name in os.listdir(iter_dir):
        m = _RANK_FILE_RE.match(name)
        if m:
            found[int(m.group(1))] = name
    if not found:
        raise FileNotFoundError(f"no rank_NNNNN.safetensors in {iter_dir}")
    ranks = sorted(found)
    if ranks != list(range(len(ranks))):
        raise FileNotFoundError(f"rank files in {iter_dir} are not 0..W-1: {ranks}")
    return [os.path.join(iter_dir, found[r]) for r in ranks]


def _load_with_index(iter_dir: str, index: dict) -> dict[str, torch.Tensor]:
    params: dict[str, torch.Tensor] = {}
    handles: dict[str, object] = {}
    try:
        for key, entry in index["tensors"].items():
            if not key.startswith(MODEL_PREFIX):
                continue
            shape = [int(s) for s in entry["shape"]]
            full = None
            covered = 0
            for shard in sorted(entry["shards"], key=lambda s: int(s["rows"][0])):
                start, stop = (int(v) for v in shard["rows"])
                rows = stop - start
                if rows == 0:
                    continue
                if start != covered:
                    raise ValueError(f"{iter_dir}: {key} shards leave a gap or overlap at row {covered}")
                path = os.path.join(iter_dir, shard["file"])
                if path not in handles:
                    handles[path] = safe_open(path, "pt").__enter__()
                block = handles[path].get_tensor(key)
                if list(block.shape) != [rows] + shape[1:]:
                    raise ValueError(f"{path}: {key} has shape {list(block.shape)}, index says "
                                     f"{[rows] + shape[1:]}")
                if full is None:
                    full = torch.empty(shape, dtype=block.dtype)
                full[start:start + rows] = block
                covered += rows
            if full is None and len(shape):  # zero rows in total
                full = torch.empty(shape, dtype=torch.float32)
            if len(shape) == 0:
                first = entry["shards"][0]
                path = os.path.join(iter_dir, first["file"])
                if path not in handles:
                    handles[path] = safe_open(path, "pt").__enter__()
                full = handles[path].get_tensor(key)
                covered = 0
            elif covered != shape[0]:
                raise ValueError(f"{iter_dir}: {key} shards cover {covered} of {shape[0]} rows")
            params[key[len(MODEL_PREFIX):]] = full
    finally:
        for h in handles.values():
            h.__exit__(None, None, None)
    return params


def _load_by_concatenation(iter_dir: str) -> dict[str, torch.Tensor]:
    blocks: dict[str, list[torch.Tensor]] = {}
    for path in _rank_files(iter_dir):
        with safe_open(path, "pt") as f:
            for key in f.keys():
                if key.startswith(MODEL_PREFIX):
                    blocks.setdefault(key[len(MODEL_PREFIX):], []).append(f.get_tensor(key))
    params = {}
    for name, parts in blocks.items():
        if parts[0].dim() == 0:  # scalars cannot be row-sharded: every rank holds the value
            params[name] = parts[0]
            continue
        tails = {tuple(p.shape[1:]) for p in parts}
        if len(tails) != 1:
            raise ValueError(f"{iter_dir}: {name} blocks disagree on trailing dims: {sorted(tails)}")
        params[name] = torch.cat(parts, dim=0)
    return params


def load_mmtrain_params(iter_dir: str) -> dict[str, torch.Tensor]:
    """Full model parameters from one checkpoint iteration directory (see module docstring)."""
    index_path = os.path.join(iter_dir, "index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        if isinstance(index, dict) and index.get("format") == INDEX_FORMAT and isinstance(index.get("tensors"), dict):
            return _load_with_index(iter_dir, index)
        warnings.warn(f"{index_path} is not in format {INDEX_FORMAT!r}; concatenating rank files instead")
    return _load_by_concatenation(iter_dir)


def latest_iter_dir(save_dir: str) -> str:
    iters = []
    for name in os.listdir(save_dir):
        m = _ITER_DIR_RE.match(name)
        if m and os.path.isdir(os.path.join(save_dir, name)):
            iters.append((int(m.group(1)), name))
    if not iters:
        raise FileNotFoundError(f"no iter_NNNNNNN directory in {save_dir}")
    return os.path.join(save_dir, max(iters)[1])


# ----------------------------------------------------------------------------- metrics

def read_metrics(path: str) -> list[dict]:
    """metrics.jsonl lines ordered by iteration; a repeated iteration keeps the last line."""
    by_iter: dict[int, dict] = {}
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
            if "iteration" not in record:
                raise ValueError(f"{path}:{number}: no 'iteration' field")
            by_iter[int(record["iteration"])] = record
    return [by_iter[k] for k in sorted(by_iter)]


def column(metrics: Iterable[dict], key: str) -> list[float]:
    return [float(m[key]) for m in metrics]


def step_rel_diffs(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """|a_i - b_i| / |b_i| per step (b is the reference)."""
    if len(a) != len(b):
        raise ValueError(f"curves differ in length: {len(a)} vs {len(b)}")
    return [abs(x - y) / abs(y) if y != 0 else abs(x - y) for x, y in zip(a, b)]


def curve_rel_diff(a: Sequence[float], b: Sequence[float]) -> float:
    """sum|a-b| / sum|b| over the steps both curves have (b is the reference)."""
    n = min(len(a), len(b))
    den = sum(abs(y) for y in b[:n])
    num = sum(abs(x - y) for x, y in zip(a[:n], b[:n]))
    return num / den if den else (0.0 if num == 0 else math.inf)


def param_rel_diffs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per tensor ||a-b||_2 / ||b||_2 in fp64; names must match exactly."""
    if set(a) != set(b):
        raise ValueError(f"parameter names differ: only in a {sorted(set(a) - set(b))}, "
                         f"only in b {sorted(set(b) - set(a))}")
    out = {}
    for name in b:
        x, y = a[name].double(), b[name].double()
        if x.shape != y.shape:
            raise ValueError(f"{name}: shape {tuple(x.shape)} vs {tuple(y.shape)}")
        den = y.norm().item()
        out[name] = (x - y).norm().item() / den if den else (x - y).norm().item()
    return out


# ----------------------------------------------------------------------------- config

def mmtrain_config(model_path: str, tokens_path: str, model_cfg: dict, output_dir: str,
                   save: str | None = None, *, micro_batch_size: int = 2,
                   gradient_accumulation_steps: int = 1, train_iters: int = 20, lr: float = 1e-3,
                   lr_min: float = 1e-4, lr_warmup_ratio: float = 0.1, lr_decay_style: str = "cosine",
                   weight_decay: float = 0.01, clip_grad: float = 1.0, seed: int = 42,
                   adam_beta1: float = 0.9, adam_beta2: float = 0.999, adam_eps: float = 1e-8,
                   param_dtype: str = "fp32", reduce_dtype: str = "fp32", prefetch: int = 1,
                   recompute: bool = False) -> dict:
    """The YAML both mmtrain and the reference trainer read. Every key is written out, the
    Adam hyper-parameters too, so neither side's defaults can make them diverge."""
    training = {
        "micro_batch_size": micro_batch_size, "gradient_accumulation_steps": gradient_accumulation_steps,
        "train_iters": train_iters, "lr": float(lr), "lr_min": float(lr_min),
        "lr_warmup_ratio": float(lr_warmup_ratio), "lr_decay_style": lr_decay_style,
        "weight_decay": float(weight_decay), "clip_grad": float(clip_grad), "seed": seed,
        "adam_beta1": float(adam_beta1), "adam_beta2": float(adam_beta2), "adam_eps": float(adam_eps),
    }
    if save:
        training["save"] = save
    return {
        "model": {"model_id": "test_transformer", "model_name_or_path": model_path, "config": dict(model_cfg)},
        "data": {"dataset_param": {"dataset_type": "token_file", "path": tokens_path},
                 "dataloader_param": {"collate_param": {"model_name": "causal_lm"}}},
        "parallel": {"fsdp_plan": {"apply_modules": ["layers.{*}"], "param_dtype": param_dtype,
                                   "reduce_dtype": reduce_dtype, "num_to_forward_prefetch": prefetch,
                                   "num_to_backward_prefetch": prefetch}},
        "features": {"recompute": recompute, "recompute_plan": {"apply_modules": ["layers.{*}"]}},
        "training": training,
        "logging": {"output_dir": output_dir},
    }


# ----------------------------------------------------------------------------- running mmtrain

class MmtrainFailed(RuntimeError):
    pass


def magihuman_yaml(title: str, c: dict, weights, data_root, training: dict, output_dir, param_dtype="fp32",
                   pairs=None) -> str:
    """A MagiHuman config in plain YAML (no anchors), which config_io reads too. pairs: a preference
    manifest over data_root (dataset and collator magihuman_preference)."""
    model_keys = ("num_layers", "hidden_size", "head_dim", "num_query_groups", "video_in_channels",
                  "audio_in_channels", "text_in_channels", "mm_layers", "gelu7_layers")
    cfg = {
        "parallel": {"fully_shard_parallel_size": "auto",
                     "fsdp_plan": {"apply_modules": ["dit.block.layers.{*}"], "param_dtype": param_dtype,
                                   "reduce_dtype": "fp32", "num_to_forward_prefetch": 1,
                                   "num_to_backward_prefetch": 1}},
        "model": {"model_id": "magihuman", "model_name_or_path": str(weights),
                  "config": {**{key: c[key] for key in model_keys}, "enable_attn_gating": True, "norm_eps": 1.0e-6,
                             "deinterleave_mlp": True, "fused_ops": True}},
        "data": {"dataset_param": {"dataset_type": "magihuman_precomputed", "data_root": str(data_root),
                                   "sigma_sampling": "logit_normal", "logit_normal_loc": 0.0,
                                   "logit_normal_scale": 1.0},
                 "dataloader_param": {"collate_param": {"model_name": "magihuman"}}},
        "features": {"loss_cfg": {"loss_type": "raw"}},
        "training": {**training, "save": ""},
        "logging": {"output_dir": str(output_dir), "progress": False},
    }
    if pairs is not None:
        cfg["data"]["dataset_param"].update({"dataset_type": "magihuman_preference", "pairs": str(pairs)})
        cfg["data"]["dataloader_param"]["collate_param"]["model_name"] = "magihuman_preference"
    return f"# {title}\n" + config_io.dump_yaml(cfg)


def torchrun_cmd(world: int) -> list[str]:
    """torchrun from this interpreter's torch; --standalone picks a free rendezvous port."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]


def child_env(threads: int = 1) -> dict[str, str]:
    env = dict(os.environ)
    # Ranks share 2 cores with other work: one intra-op thread each avoids oversubscription.
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    return env


def run_mmtrain(mmtrain_bin: str, cfg_path: str, world: int, log_path: str,
                overrides: Sequence[str] = (), timeout: float = 600, threads: int = 1) -> None:
    cmd = torchrun_cmd(world) + ["--no-python", mmtrain_bin, "train", cfg_path]
    for item in overrides:
        cmd += ["--set", item]
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        # Own session so a timeout ends torchrun and every rank it started, and nothing else.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(threads),
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = f"timeout after {timeout}s"
    if rc != 0:
        with open(log_path, errors="replace") as f:
            text = f.read()
        raise MmtrainFailed(f"mmtrain (W={world}) exited with {rc}; log {log_path}:\n"
                            f"{crash_reports(text)}{text[-4000:]}")


def crash_reports(log_text: str) -> str:
    """The backtraces mmtrain prints on a fatal signal (and glibc's heap messages): the log tail
    alone loses them behind the other ranks' connection errors."""
    lines = log_text.splitlines()
    marks = ("mmtrain: fatal signal", "terminate called", "free():", "corrupted", "double free")
    picked = []
    for i, line in enumerate(lines):
        if any(m in line for m in marks):
            picked += lines[max(0, i - 2):i + 40] + ["..."]
    return ("--- crash reports ---\n" + "\n".join(picked) + "\n--- log tail ---\n") if picked else ""


def e2e_helpers():
    """tests/e2e/conftest.py (run_mmtrain, write_config, mmtrain_bin, read_metrics, ...) loaded once
    under a name of its own, so that it never collides with this directory's conftest in sys.modules."""
    name = "mmtrain_e2e_helpers"
    if name not in sys.modules:
        from pathlib import Path
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "e2e" / "conftest.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def checkpoint_tensors(iter_dir) -> dict:
    """Every tensor of an mmtrain checkpoint (weights, AdamW moments, EMA shadows), each rank's rows
    joined in rank order (docs/checkpoint_format.md)."""
    import torch
    from pathlib import Path
    from safetensors.torch import load_file
    parts = {}
    for rank_file in sorted(Path(iter_dir).glob("rank_*.safetensors")):
        for name, rows in load_file(str(rank_file)).items():
            parts.setdefault(name, []).append(rows)
    return {name: torch.cat(rows) if rows[0].dim() else rows[0] for name, rows in parts.items()}
