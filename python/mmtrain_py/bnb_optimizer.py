"""bitsandbytes' AdamW8bit state <-> the file `mmtrain convert MODEL ckpt-to-bnb` writes.

For a PyTorch user who takes an mmtrain run trained with `training.optimizer: adamw8bit` on in
PyTorch: export the weights (`mmtrain convert MODEL ckpt-to-hf`) and the optimizer state
(`ckpt-to-bnb`), load the weights into the HF model, build `bnb.optim.AdamW8bit` over its
parameters, then

    from mmtrain_py.bnb_optimizer import load_state
    load_state(optimizer, model.named_parameters(), "OUT/optimizer.safetensors")

which fills each parameter's state (state1/state2 codes, absmax1/absmax2, qmap1/qmap2, step) and
the param groups' lr, betas, eps and weight_decay through `optimizer.load_state_dict`, checking
every tensor's name, dtype and shape first. `save_state` writes the same file from a live
AdamW8bit, which `mmtrain convert MODEL bnb-to-ckpt` (with the HF weights) turns into a training
checkpoint: the way back. File format: src/convert/bnb_optimizer.h.
"""
from __future__ import annotations

import json

import torch
from safetensors import safe_open
from safetensors.torch import save_file

FORMAT = "bitsandbytes.optim.AdamW8bit"


def _blocks(numel: int) -> int:
    return -(-numel // 256)


def load_state(optimizer, named_parameters, path: str) -> None:
    """Loads path into `optimizer` (a bnb.optim.AdamW8bit over the parameters named_parameters
    yields, HF names). Every parameter the file names must be the optimizer's, and the other way
    round; a parameter the file keeps in 8 bits must be one the optimizer would (min_8bit_size)."""
    params = dict(named_parameters)
    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: not an AdamW8bit state written by ckpt-to-bnb (format {meta.get('format')!r})")
        names = json.loads(meta["params"])
        keys = set(f.keys())
        qmap1, qmap2 = f.get_tensor("qmap1"), f.get_tensor("qmap2")
        order = [p for group in optimizer.param_groups for p in group["params"]]
        index = {id(p): i for i, p in enumerate(order)}
        missing = [n for n in names if n not in params or id(params[n]) not in index]
        if missing:
            raise ValueError(f"{path}: the optimizer has no parameter {missing[:3]} (of {len(missing)})")
        if len(names) != len(order):
            raise ValueError(f"{path}: holds the state of {len(names)} parameters, the optimizer has {len(order)}")
        step = int(meta["step"])
        state = {}
        for name in names:
            p = params[name]
            prefix = f"state.{name}."
            s1, s2 = f.get_tensor(prefix + "state1"), f.get_tensor(prefix + "state2")
            for t, key in ((s1, "state1"), (s2, "state2")):
                if tuple(t.shape) != tuple(p.shape):
                    raise ValueError(f"{path}: {prefix}{key} is {tuple(t.shape)}, the parameter {tuple(p.shape)}")
            entry = {"step": step, "state1": s1, "state2": s2}
            if s1.dtype == torch.uint8:
                absmax1, absmax2 = f.get_tensor(prefix + "absmax1"), f.get_tensor(prefix + "absmax2")
                for t, key in ((absmax1, "absmax1"), (absmax2, "absmax2")):
                    if t.dtype != torch.float32 or t.numel() != _blocks(p.numel()):
                        raise ValueError(f"{path}: {prefix}{key} must be fp32 [{_blocks(p.numel())}]")
                entry.update(qmap1=qmap1.clone(), qmap2=qmap2.clone(), absmax1=absmax1, absmax2=absmax2)
            elif s1.dtype != torch.float32 or prefix + "absmax1" in keys:
                raise ValueError(f"{path}: {prefix}state1 must be uint8 codes with absmax, or fp32 moments")
            state[index[id(p)]] = entry
    sd = optimizer.state_dict()
    sd["state"] = state
    for group in sd["param_groups"]:
        group.update(lr=json.loads(meta["lr"]), betas=tuple(json.loads(meta["betas"])), eps=json.loads(meta["eps"]),
                     weight_decay=json.loads(meta["weight_decay"]))
    optimizer.load_state_dict(sd)


def save_state(optimizer, named_parameters, path: str, min_8bit_size: int = 4096) -> None:
    """Writes a live bnb.optim.AdamW8bit's state in the format load_state reads."""
    params = list(named_parameters)
    group = optimizer.param_groups[0]
    tensors, names, step = {}, [], 0
    for name, p in params:
        s = optimizer.state.get(p)
        if not s:
            continue
        names.append(name)
        step = int(s["step"])
        tensors[f"state.{name}.state1"], tensors[f"state.{name}.state2"] = s["state1"], s["state2"]
        if s["state1"].dtype == torch.uint8:
            tensors[f"state.{name}.absmax1"], tensors[f"state.{name}.absmax2"] = s["absmax1"], s["absmax2"]
            tensors["qmap1"], tensors["qmap2"] = s["qmap1"], s["qmap2"]
    if "qmap1" not in tensors:  # no parameter in 8 bits: the maps all the same
        import bitsandbytes.functional as F
        tensors["qmap1"], tensors["qmap2"] = F.create_dynamic_map(signed=True), F.create_dynamic_map(signed=False)
    meta = {"format": FORMAT, "step": str(step), "lr": json.dumps(group["lr"]), "betas": json.dumps(list(group["betas"])),
            "eps": json.dumps(group["eps"]), "weight_decay": json.dumps(group["weight_decay"]),
            "min_8bit_size": json.dumps(min_8bit_size), "params": json.dumps(names)}
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=meta)
