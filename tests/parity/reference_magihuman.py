"""Independent PyTorch reference of the MagiHuman DiT training forward and its flow-matching loss.

Written from the upstream model (GAIR-NLP/daVinci-MagiHuman: forward, loss, checkpoint layout) as the
oracle the C++ model is tested against; it shares no code with mmtrain. Functional style: parameters
are a dict {HF name: tensor} in the public checkpoint layout (interleaved up_gate rows, experts as
contiguous dim-0 chunks in video/audio/text order) and autograd gives every gradient. Tokens stay in
the original packed order throughout; modality experts gather their rows (the upstream modality
sort is a permutation that cancels). Non-goals: speed, local attention, the sampler.

Letters: L tokens, B packed samples, D hidden_size, hd head_dim, Hq = D / hd query heads,
Hkv kv heads (num_query_groups), E experts of a layer (3 in mm_layers, else 1), I MLP width,
U up_gate rows per expert (2I gated SwiGLU7, I for GELU7), nb = hd / 8 RoPE bands.

Precision modes of `forward`:
  "fp32"     every parameter and op in fp32 (the parity mode; C++ with param_dtype fp32).
  "fp64"     the same math in float64 (gradcheck).
  "upstream" as upstream runs it: block GEMMs take bf16 inputs/weights and return bf16-rounded outputs;
             residual stream, norms, RoPE, activations and the gate in fp32; attention sees bf16
             q/k/v and returns a bf16-rounded output; adapter and final heads are fp32 GEMMs.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

VIDEO, AUDIO, TEXT = 0, 1, 2
NUM_MODALITIES = 3

# model.config keys of mmtrain (src/models/magihuman/config.h); defaults = the released base model.
FULL_CONFIG = {
    "num_layers": 40,
    "hidden_size": 5120,
    "head_dim": 128,
    "num_query_groups": 8,
    "video_in_channels": 192,
    "audio_in_channels": 64,
    "text_in_channels": 3584,
    "mm_layers": [0, 1, 2, 3, 36, 37, 38, 39],
    "gelu7_layers": [0, 1, 2, 3],
    "enable_attn_gating": True,
    "norm_eps": 1e-6,
}

BLOCK_LINEARS = ("attention.linear_qkv.weight", "attention.linear_proj.weight",
                 "mlp.up_gate_proj.weight", "mlp.down_proj.weight")


def make_config(**overrides) -> dict:
    unknown = set(overrides) - set(FULL_CONFIG)
    if unknown:
        raise KeyError(f"unknown magihuman config keys {sorted(unknown)}")
    return {**FULL_CONFIG, **overrides}


# ---------------------------------------------------------------------------------------------
# Derived sizes

def heads_q(cfg):
    return cfg["hidden_size"] // cfg["head_dim"]


def rope_bands(cfg):
    return cfg["head_dim"] // 8


def experts(cfg, layer):
    return NUM_MODALITIES if layer in cfg["mm_layers"] else 1


def is_gelu7(cfg, layer):
    return layer in cfg["gelu7_layers"]


def mlp_width(cfg, layer):  # I
    d = cfg["hidden_size"]
    return 4 * d if is_gelu7(cfg, layer) else int(d * 4 * 2 / 3) // 4 * 4


def up_gate_rows(cfg, layer):  # U, per expert
    return mlp_width(cfg, layer) if is_gelu7(cfg, layer) else 2 * mlp_width(cfg, layer)


def gate_width(cfg):
    return heads_q(cfg) if cfg["enable_attn_gating"] else 0


def qkv_width(cfg):  # per expert: [Hq*hd | Hkv*hd | Hkv*hd | gates]
    return (heads_q(cfg) + 2 * cfg["num_query_groups"]) * cfg["head_dim"] + gate_width(cfg)


def io_width(cfg):
    return max(cfg["video_in_channels"], cfg["audio_in_channels"], cfg["text_in_channels"])


def out_width(cfg):
    return max(cfg["video_in_channels"], cfg["audio_in_channels"])


def tensor_specs(cfg):
    """[(HF name, shape, on-disk dtype of the public base checkpoint, trainable)] in state_dict order."""
    bf16, f32 = torch.bfloat16, torch.float32
    d = cfg["hidden_size"]
    specs = [
        ("adapter.video_embedder.weight", (d, cfg["video_in_channels"]), bf16, True),
        ("adapter.video_embedder.bias", (d,), bf16, True),
        ("adapter.text_embedder.weight", (d, cfg["text_in_channels"]), bf16, True),
        ("adapter.text_embedder.bias", (d,), bf16, True),
        ("adapter.audio_embedder.weight", (d, cfg["audio_in_channels"]), bf16, True),
        ("adapter.audio_embedder.bias", (d,), bf16, True),
        ("adapter.rope.bands", (rope_bands(cfg),), f32, False),  # persistent buffer, not trained
    ]
    for i in range(cfg["num_layers"]):
        p, e = f"block.layers.{i}.", experts(cfg, i)
        specs += [
            (p + "attention.pre_norm.weight", (d * e,), f32, True),
            (p + "attention.linear_qkv.weight", (qkv_width(cfg) * e, d), bf16, True),
            (p + "attention.linear_proj.weight", (d * e, heads_q(cfg) * cfg["head_dim"]), bf16, True),
            (p + "attention.q_norm.weight", (cfg["head_dim"] * e,), f32, True),
            (p + "attention.k_norm.weight", (cfg["head_dim"] * e,), f32, True),
            (p + "mlp.pre_norm.weight", (d * e,), f32, True),
            (p + "mlp.up_gate_proj.weight", (up_gate_rows(cfg, i) * e, d), bf16, True),
            (p + "mlp.down_proj.weight", (d * e, mlp_width(cfg, i)), bf16, True),
        ]
    specs += [
        ("final_norm_video.weight", (d,), f32, True),
        ("final_norm_audio.weight", (d,), f32, True),
        ("final_linear_video.weight", (cfg["video_in_channels"], d), bf16, True),
        ("final_linear_audio.weight", (cfg["audio_in_channels"], d), bf16, True),
    ]
    return specs


def module_dtype(name):
    """Dtype of the upstream module after loading: block linears bf16, all else fp32."""
    return torch.bfloat16 if name.startswith("block.layers.") and name.endswith(BLOCK_LINEARS) else torch.float32


def default_bands(nb, dtype=torch.float32):
    exp = torch.arange(0, nb, 1, dtype=torch.int64).to(torch.float32) / nb
    return (1.0 / (10000.0 ** exp)).to(dtype)


def infer_config(params) -> dict:
    """Recovers the model.config of a parameter dict from its shapes (gating assumed when consistent)."""
    d = params["final_norm_video.weight"].numel()
    hd = 8 * params["adapter.rope.bands"].numel()
    n = 0
    while f"block.layers.{n}.attention.pre_norm.weight" in params:
        n += 1
    mm, gelu, hkv, gating = [], [], None, True
    for i in range(n):
        e = params[f"block.layers.{i}.attention.pre_norm.weight"].numel() // d
        if e == NUM_MODALITIES:
            mm.append(i)
        if params[f"block.layers.{i}.mlp.up_gate_proj.weight"].shape[0] // e == params[f"block.layers.{i}.mlp.down_proj.weight"].shape[1]:
            gelu.append(i)
        rest = params[f"block.layers.{i}.attention.linear_qkv.weight"].shape[0] // e - d
        hq = d // hd
        gating = (rest - hq) > 0 and (rest - hq) % (2 * hd) == 0
        hkv = (rest - hq) // (2 * hd) if gating else rest // (2 * hd)
    return make_config(
        num_layers=n, hidden_size=d, head_dim=hd, num_query_groups=hkv,
        video_in_channels=params["adapter.video_embedder.weight"].shape[1],
        audio_in_channels=params["adapter.audio_embedder.weight"].shape[1],
        text_in_channels=params["adapter.text_embedder.weight"].shape[1],
        mm_layers=mm, gelu7_layers=gelu, enable_attn_gating=gating)


# ---------------------------------------------------------------------------------------------
# Weights: the public HF layout

def load_hf(path) -> dict:
    """Reads `model.safetensors.index.json` + shards, or one `model.safetensors` (or a .safetensors
    file), and casts every tensor from its on-disk dtype to its upstream module dtype. up_gate rows
    stay interleaved (gate even, linear odd), as on disk."""
    from safetensors.torch import load_file

    path = Path(path)
    if path.is_file():
        files = [path]
    elif (path / "model.safetensors.index.json").exists():
        weight_map = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
        files = [path / f for f in dict.fromkeys(weight_map.values())]
    elif (path / "model.safetensors").exists():
        files = [path / "model.safetensors"]
    else:
        raise FileNotFoundError(f"{path}: neither model.safetensors.index.json nor model.safetensors")
    params = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            if name in params:
                raise ValueError(f"{f}: tensor {name} is stored twice")
            params[name] = t.to(module_dtype(name))
    return params


def save_hf(params, out_dir, shards=1):
    """Writes params in the public layout (on-disk dtypes of tensor_specs), for the self-tests."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    disk = {name: dt for name, _, dt, _ in tensor_specs(infer_config(params))}
    names = list(params)
    if shards == 1:
        save_file({n: params[n].to(disk[n]).contiguous() for n in names}, str(out_dir / "model.safetensors"),
                  metadata={"format": "pt"})
        return
    weight_map, total = {}, 0
    for k in range(shards):
        part = names[k * len(names) // shards:(k + 1) * len(names) // shards]
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {n: params[n].to(disk[n]).contiguous() for n in part}
        save_file(tensors, str(out_dir / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    (out_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def init_params(cfg, seed=0) -> dict:
    """Random weights in module dtypes with O(1) activations: linears N(0, 1/fan_in), biases and norm
    weights N(0, 0.1) (so a missing `1 +` shows), bands from the formula."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape, _, _ in tensor_specs(cfg):
        if name == "adapter.rope.bands":
            t = default_bands(shape[0])
        elif len(shape) == 2:
            t = torch.randn(shape, generator=g) / math.sqrt(shape[1])
        else:
            t = 0.1 * torch.randn(shape, generator=g)
        params[name] = t.to(module_dtype(name))
    return params


# ---------------------------------------------------------------------------------------------
# Numerics

class Numerics:
    def __init__(self, precision):
        if precision not in ("fp32", "fp64", "upstream"):
            raise ValueError(f"precision must be fp32, fp64 or upstream, got {precision!r}")
        self.bf16 = precision == "upstream"
        self.dtype = torch.float64 if precision == "fp64" else torch.float32

    def f(self, t):
        """A float tensor in the compute dtype of the fp32-side ops."""
        return t.to(self.dtype)

    def block_linear(self, x, w):
        """Bias-free block GEMM [n, in] x [out, in]^T. upstream: bf16 GEMM, bf16 result upcast."""
        if self.bf16:
            return F.linear(x.to(torch.bfloat16), w.to(torch.bfloat16)).to(torch.float32)
        return F.linear(self.f(x), self.f(w))

    def round_bf16(self, t):
        return t.to(torch.bfloat16).to(torch.float32) if self.bf16 else t


# ---------------------------------------------------------------------------------------------
# Layers (free functions over tensors)

def modality_groups(modality):
    """Row indices of each modality (video, audio, text) in packed order."""
    return [torch.nonzero(modality == m, as_tuple=False).flatten() for m in range(NUM_MODALITIES)]


def scatter_rows(num_rows, parts, width, like):
    """[num_rows, width] tensor holding each (rows, values) part, zeros elsewhere (differentiable)."""
    out = torch.zeros(num_rows, width, dtype=like.dtype, device=like.device)
    for rows, values in parts:
        if rows.numel():
            out = out.index_copy(0, rows, F.pad(values, (0, width - values.shape[1])))
    return out


def expert_linear(x, w, groups, num, e):
    """Modality-expert linear: expert i owns rows [i*out, (i+1)*out) of w and the tokens of modality i."""
    if e == 1:
        return num.block_linear(x, w)
    chunks = w.chunk(e, dim=0)
    parts = [(rows, num.block_linear(x[rows], chunks[m])) for m, rows in enumerate(groups)]
    return scatter_rows(x.shape[0], parts, chunks[0].shape[0], parts[0][1])


def rms_norm(x, w, modality, e, eps, num):
    """y = x * rsqrt(mean(x^2) + eps) * (1 + w_modality), in fp32 (fp64 in fp64 mode), over the last dim.
    x: [L, dim] or [L, heads, dim]; w: [dim * e], chunk i for modality i."""
    t = num.f(x)
    t = t * torch.rsqrt(torch.mean(t * t, dim=-1, keepdim=True) + eps)
    w = num.f(w)
    if e == 1:
        scale = w + 1
    else:
        scale = w.view(e, -1)[modality] + 1  # [L, dim]
        if t.dim() == 3:
            scale = scale.unsqueeze(1)
    return t * scale


def rope_table(coords, bands):
    """ElementWiseFourierEmbed. coords [L, 9] = (t,h,w, T,H,W, refT,refH,refW) -> [L, 6 nb]
    = [sin(t bands) sin(h bands) sin(w bands) | cos(...)], each axis nb wide."""
    xyz, sizes, refs = coords[:, 0:3], coords[:, 3:6], coords[:, 6:9]
    scales = (refs - 1) / (sizes - 1)
    scales = torch.where((refs == 1) & (sizes == 1), torch.ones_like(scales), scales)
    if not torch.isfinite(scales).all():
        raise ValueError("RoPE scales are not finite: a block with size 1 but ref != 1")
    centers = (sizes - 1) / 2
    centers = torch.cat([torch.zeros_like(centers[:, :1]), centers[:, 1:]], dim=1)  # time is not centred
    xyz = xyz - centers
    proj = xyz.unsqueeze(-1) * scales.unsqueeze(-1) * bands  # [L, 3, nb]
    return torch.cat((proj.sin(), proj.cos()), dim=1).flatten(1)


def apply_rope(x, rope):
    """Partial rotate-half RoPE on the first 6 nb dims of x [L, H, hd]; dim j pairs with j + 3 nb."""
    half = rope.shape[-1] // 2  # 3 nb
    sin, cos = rope[:, :half], rope[:, half:]
    sin = torch.cat((sin, sin), dim=-1).unsqueeze(1)
    cos = torch.cat((cos, cos), dim=-1).unsqueeze(1)
    rot, rest = x[..., :2 * half], x[..., 2 * half:]
    x1, x2 = rot[..., :half], rot[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((rot * cos + rotated * sin, rest), dim=-1)


def attention_core(q, k, v, cu_seqlens, num):
    """Non-causal softmax attention, scale 1/sqrt(hd), block-diagonal over packed samples, GQA with
    q head i -> kv head i // (Hq / Hkv). q [L, Hq, hd], k/v [L, Hkv, hd] -> [L, Hq, hd]."""
    hq, hkv, hd = q.shape[1], k.shape[1], q.shape[2]
    if num.bf16:  # flash-attn: bf16 inputs, fp32 softmax/accumulation, bf16 output
        q, k, v = num.round_bf16(q), num.round_bf16(k), num.round_bf16(v)
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    outs = []
    bounds = [int(b) for b in cu_seqlens]
    for s in range(len(bounds) - 1):
        a, b = bounds[s], bounds[s + 1]
        scores = torch.einsum("qhd,khd->hqk", q[a:b], k[a:b]) / math.sqrt(hd)
        probs = torch.softmax(scores, dim=-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, v[a:b]))
    return num.round_bf16(torch.cat(outs, dim=0))


def attention(h, p, prefix, cfg, e, modality, groups, rope, cu_seqlens, num):
    L, hd, hq, hkv = h.shape[0], cfg["head_dim"], heads_q(cfg), cfg["num_query_groups"]
    eps = cfg["norm_eps"]
    a = rms_norm(h, p[prefix + "pre_norm.weight"], modality, e, eps, num)
    qkv = expert_linear(a, p[prefix + "linear_qkv.weight"], groups, num, e)  # [L, qkv_width]
    q, k, v, g = torch.split(qkv, [hq * hd, hkv * hd, hkv * hd, gate_width(cfg)], dim=1)
    q = rms_norm(q.reshape(L, hq, hd), p[prefix + "q_norm.weight"], modality, e, eps, num)
    k = rms_norm(k.reshape(L, hkv, hd), p[prefix + "k_norm.weight"], modality, e, eps, num)
    v = v.reshape(L, hkv, hd)
    q, k = apply_rope(q, rope), apply_rope(k, rope)
    o = attention_core(q, k, v, cu_seqlens, num)
    if cfg["enable_attn_gating"]:
        o = o * torch.sigmoid(g).unsqueeze(-1)  # one scalar per (token, q head)
    return expert_linear(o.reshape(L, hq * hd), p[prefix + "linear_proj.weight"], groups, num, e)


def swiglu7(u, alpha=1.702, limit=7.0):
    """Interleaved rows: even = gate (clamp max 7), odd = linear (clamp +-7); gate*sigmoid(a gate)*(lin+1)."""
    gate, lin = u[..., 0::2], u[..., 1::2]
    gate = gate.clamp(max=limit)
    lin = lin.clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(alpha * gate) * (lin + 1)


def gelu7(u, alpha=1.702, limit=7.0):
    u = u.clamp(max=limit)
    return u * torch.sigmoid(alpha * u)


def mlp(h, p, prefix, cfg, layer, e, modality, groups, num):
    b = rms_norm(h, p[prefix + "pre_norm.weight"], modality, e, cfg["norm_eps"], num)
    u = expert_linear(b, p[prefix + "up_gate_proj.weight"], groups, num, e)  # [L, U]
    z = gelu7(u) if is_gelu7(cfg, layer) else swiglu7(u)  # [L, I]
    return expert_linear(z, p[prefix + "down_proj.weight"], groups, num, e)


# ---------------------------------------------------------------------------------------------
# Model

def forward(params, batch, precision="fp32", cfg=None):
    """DiT forward. batch: x [L, io_width], coords_mapping [L, 9], modality_mapping [L],
    cu_seqlens [B+1]. Returns the prediction [L, out_width]: video rows = video channels, audio rows
    = audio channels then zeros, text rows = 0. Dtype fp32 (fp64 in fp64 mode)."""
    cfg = cfg or infer_config(params)
    num = Numerics(precision)
    h, packing = adapter(params, batch, cfg, num)
    for i in range(cfg["num_layers"]):
        h = layer(h, params, i, cfg, packing, num)
    return heads(h, params, cfg, packing, num)


def adapter(p, batch, cfg, num):
    """fp32 embedders on each modality's own columns -> h [L, D]; and the packing the layers and
    heads share: (modality [L], groups, rope [L, 6 nb], cu_seqlens)."""
    x = num.f(batch["x"])
    modality = batch["modality_mapping"].long()
    L = x.shape[0]
    groups = modality_groups(modality)
    cv, ca, ct = cfg["video_in_channels"], cfg["audio_in_channels"], cfg["text_in_channels"]
    rope = rope_table(num.f(batch["coords_mapping"]), num.f(p["adapter.rope.bands"]))
    embed = []
    for m, name, width in ((VIDEO, "video", cv), (AUDIO, "audio", ca), (TEXT, "text", ct)):
        rows = groups[m]
        embed.append((rows, F.linear(x[rows, :width], num.f(p[f"adapter.{name}_embedder.weight"]),
                                     num.f(p[f"adapter.{name}_embedder.bias"]))))
    return scatter_rows(L, embed, cfg["hidden_size"], x), (modality, groups, rope, batch["cu_seqlens"])


def layer(h, p, i, cfg, packing, num):
    """Transformer layer i (attention then MLP, both residual) on h [L, D]."""
    modality, groups, rope, cu_seqlens = packing
    e, pre = experts(cfg, i), f"block.layers.{i}."
    h = h + attention(h, p, pre + "attention.", cfg, e, modality, groups, rope, cu_seqlens, num)
    return h + mlp(h, p, pre + "mlp.", cfg, i, e, modality, groups, num)


def heads(h, p, cfg, packing, num):
    """Final norm + linear of video and audio rows -> the prediction [L, out_width]."""
    groups = packing[1]
    out = []
    for m, name in ((VIDEO, "video"), (AUDIO, "audio")):
        rows = groups[m]
        y = rms_norm(h[rows], p[f"final_norm_{name}.weight"], None, 1, cfg["norm_eps"], num)
        out.append((rows, F.linear(y, num.f(p[f"final_linear_{name}.weight"]))))
    return scatter_rows(h.shape[0], out, out_width(cfg), h)


def flow_matching_loss(pred, batch, cfg):
    """mean over (video rows x video channels) + mean over (audio rows x audio channels) of
    (pred - target)^2 on loss_mask rows; a term is skipped when its modality has no such row."""
    target = batch["target_velocity"].to(pred.dtype)
    modality = batch["modality_mapping"].long()
    mask = batch["loss_mask"].bool()
    diff = (pred - target) ** 2
    loss, present = pred.new_zeros(()), False
    for m, width in ((VIDEO, cfg["video_in_channels"]), (AUDIO, cfg["audio_in_channels"])):
        rows = (modality == m) & mask
        if rows.any():
            loss = loss + diff[rows][:, :width].mean()
            present = True
    return loss if present else diff.sum() * 0


def forward_loss(params, batch, precision="fp32", cfg=None):
    cfg = cfg or infer_config(params)
    pred = forward(params, batch, precision, cfg)
    return flow_matching_loss(pred, batch, cfg), pred


def trainable_leaves(params, dtype=torch.float32):
    """Copies as leaf tensors of `dtype` (the fp32 master weights); trainable ones require grad."""
    out = {}
    for name, t in params.items():
        leaf = t.detach().to(dtype).clone()
        out[name] = leaf.requires_grad_(name != "adapter.rope.bands")
    return out


# ---------------------------------------------------------------------------------------------
# Batches (packed samples and their flow-matching targets), for the self-tests

def sample_coords(video_grid, na, nt):
    """coords [Nv + Na + Nt, 9] of one sample in v2 style: video ref = grid; audio (Na,1,1) with
    ref ((Na-1)//4+1, 1, 1); text (Nt,1,1), ref (1,1,1), t offset -Nt."""
    def block(shape, ref, offset):
        t, h, w = torch.meshgrid(*(torch.arange(n, dtype=torch.float32) + o for n, o in zip(shape, offset)),
                                 indexing="ij")
        xyz = torch.stack([t, h, w], dim=-1).reshape(-1, 3)
        const = torch.tensor([*shape, *ref], dtype=torch.float32).expand(xyz.shape[0], 6)
        return torch.cat([xyz, const], dim=1)

    parts = [block(tuple(video_grid), tuple(video_grid), (0, 0, 0))]
    if na:
        parts.append(block((na, 1, 1), (max((na - 1) // 4 + 1, 1), 1, 1), (0, 0, 0)))
    if nt:
        parts.append(block((nt, 1, 1), (1, 1, 1), (-nt, 0, 0)))
    return torch.cat(parts, dim=0)


def make_batch(cfg, samples, seed=0):
    """Packs samples [(video_grid (T,H,W), Na, Nt), ...] like the collate_fn: per sample video, audio,
    text rows; x zero-padded to io_width; random targets on video/audio channels; loss on video+audio."""
    g = torch.Generator().manual_seed(seed)
    cv, ca, ct = cfg["video_in_channels"], cfg["audio_in_channels"], cfg["text_in_channels"]
    xs, coords, mods, targets, masks, cu = [], [], [], [], [], [0]
    for grid, na, nt in samples:
        nv = grid[0] * grid[1] * grid[2]
        n = nv + na + nt
        x = torch.zeros(n, io_width(cfg))
        x[:nv, :cv] = torch.randn(nv, cv, generator=g)
        x[nv:nv + na, :ca] = torch.randn(na, ca, generator=g)
        x[nv + na:, :ct] = torch.randn(nt, ct, generator=g)
        tgt = torch.zeros(n, out_width(cfg))
        tgt[:nv, :cv] = torch.randn(nv, cv, generator=g)
        tgt[nv:nv + na, :ca] = torch.randn(na, ca, generator=g)
        xs.append(x)
        coords.append(sample_coords(grid, na, nt))
        mods.append(torch.tensor([VIDEO] * nv + [AUDIO] * na + [TEXT] * nt, dtype=torch.int64))
        targets.append(tgt)
        masks.append(torch.tensor([True] * (nv + na) + [False] * nt))
        cu.append(cu[-1] + n)
    lengths = [b - a for a, b in zip(cu[:-1], cu[1:])]
    return {
        "x": torch.cat(xs), "coords_mapping": torch.cat(coords), "modality_mapping": torch.cat(mods),
        "target_velocity": torch.cat(targets), "loss_mask": torch.cat(masks),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32), "max_seqlen": torch.tensor(max(lengths), dtype=torch.int32),
    }


def split_batch(batch):
    """The single-sample batches of a packed batch (rows cut at cu_seqlens)."""
    cu = [int(c) for c in batch["cu_seqlens"]]
    out = []
    for a, b in zip(cu[:-1], cu[1:]):
        one = {k: batch[k][a:b].clone() for k in ("x", "coords_mapping", "modality_mapping", "target_velocity", "loss_mask")}
        one["cu_seqlens"] = torch.tensor([0, b - a], dtype=torch.int32)
        one["max_seqlen"] = torch.tensor(b - a, dtype=torch.int32)
        out.append(one)
    return out
