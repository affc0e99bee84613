"""Self-checks of the MagiHuman PyTorch reference (reference_magihuman.py), without the mmtrain
binary: RoPE against a naive per-element loop, checkpoint shapes and counts of the full model,
block-diagonal packing, float64 gradcheck, expert routing, the up_gate interleave convention, the
loss terms and the HF loader."""
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference_magihuman as R  # noqa: E402

TINY = R.make_config(num_layers=6, hidden_size=128, head_dim=32, num_query_groups=2, video_in_channels=16,
                     audio_in_channels=8, text_in_channels=24, mm_layers=[0, 1, 4, 5], gelu7_layers=[0, 1])
# For gradcheck: every structural feature (GQA 2:1, MM + shared layers, GELU7 + SwiGLU7) at minimum size.
MICRO = R.make_config(num_layers=3, hidden_size=16, head_dim=8, num_query_groups=1, video_in_channels=8,
                      audio_in_channels=4, text_in_channels=6, mm_layers=[0, 2], gelu7_layers=[0])


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(1)


def test_full_size_tensor_table():
    specs = R.tensor_specs(R.FULL_CONFIG)
    numel = {name: math.prod(shape) for name, shape, _, _ in specs}
    assert len(specs) == 331
    assert sum(numel.values()) == 15_299_419_152
    assert sum(n for (name, shape, _, _) in specs for n in [numel[name]] if len(shape) == 2) == 15_298_805_760
    assert sum(n for (name, shape, _, _) in specs for n in [numel[name]] if len(shape) == 1) == 613_392
    shapes = {name: shape for name, shape, _, _ in specs}
    assert shapes["block.layers.0.attention.linear_qkv.weight"] == (21624, 5120)
    assert shapes["block.layers.0.mlp.up_gate_proj.weight"] == (61440, 5120)
    assert shapes["block.layers.0.mlp.down_proj.weight"] == (15360, 20480)
    assert shapes["block.layers.4.attention.linear_qkv.weight"] == (7208, 5120)
    assert shapes["block.layers.4.mlp.up_gate_proj.weight"] == (27304, 5120)
    assert shapes["block.layers.4.mlp.down_proj.weight"] == (5120, 13652)
    assert shapes["block.layers.36.mlp.up_gate_proj.weight"] == (81912, 5120)
    assert shapes["block.layers.36.attention.q_norm.weight"] == (384,)
    assert shapes["adapter.rope.bands"] == (16,)
    # On-disk bytes of the BF16/F32 split match the 30.6 GB base checkpoint.
    assert sum(numel[n] * (2 if dt == torch.bfloat16 else 4) for n, _, dt, _ in specs) == 30_600_034_368
    # MindSpeed's "active linear params": 2-D tensors, MM layers divided by 3.
    active = 0
    for name, shape, _, _ in specs:
        if len(shape) == 2:
            layer = int(name.split(".")[2]) if name.startswith("block.layers.") else None
            active += numel[name] // (3 if layer in R.FULL_CONFIG["mm_layers"] else 1)
    assert active == 10_933_616_640
    assert [n for n, _, _, trainable in specs if not trainable] == ["adapter.rope.bands"]
    assert R.infer_config({n: torch.empty(s, device="meta") for n, s, _, _ in specs}) == R.FULL_CONFIG


def naive_rope(x, coords, nb):
    """The RoPE formula element by element in float64: phi_j = (coord_axis - centre) * scale * 10000^(-k/nb),
    axis = j // nb, k = j % nb; q'[j] = q[j] cos - q[j+3nb] sin, q'[j+3nb] = q[j+3nb] cos + q[j] sin."""
    L, H, hd = x.shape
    out = x.double().clone()
    for n in range(L):
        c = [float(v) for v in coords[n]]
        phis = []
        for axis in range(3):
            pos, size, ref = c[axis], c[3 + axis], c[6 + axis]
            scale = 1.0 if (size == 1 and ref == 1) else (ref - 1) / (size - 1)
            centre = 0.0 if axis == 0 else (size - 1) / 2
            phis += [(pos - centre) * scale * 10000.0 ** (-k / nb) for k in range(nb)]
        for h in range(H):
            for j in range(3 * nb):
                a, b = float(x[n, h, j]), float(x[n, h, j + 3 * nb])
                out[n, h, j] = a * math.cos(phis[j]) - b * math.sin(phis[j])
                out[n, h, j + 3 * nb] = b * math.cos(phis[j]) + a * math.sin(phis[j])
    return out


@pytest.mark.parametrize("head_dim", [32, 128])
def test_rope_matches_naive_loop(head_dim):
    nb = head_dim // 8
    bands = R.default_bands(nb)
    assert torch.allclose(bands.double(), torch.tensor([10000.0 ** (-k / nb) for k in range(nb)], dtype=torch.float64))
    # Odd and even grids (centring by half-integers), audio time compression, text of 3 tokens and of 1.
    coords = torch.cat([R.sample_coords((3, 4, 5), 9, 3), R.sample_coords((2, 3, 2), 1, 1)])
    g = torch.Generator().manual_seed(head_dim)
    x = torch.randn(coords.shape[0], 2, head_dim, generator=g)
    got = R.apply_rope(x, R.rope_table(coords, bands))
    want = naive_rope(x, coords, nb)
    err = (got.double() - want).abs().max().item()
    assert err < 2e-5, f"max |fp32 rope - naive| = {err}"
    assert torch.equal(got[..., 6 * nb:], x[..., 6 * nb:]), "dims from 6*bands on must pass through"
    rope = R.rope_table(coords, bands)
    text3 = slice(60 + 9, 60 + 9 + 3)
    assert torch.equal(rope[text3, :3 * nb], torch.zeros(3, 3 * nb)), "text (Nt > 1) gets zero angle"
    assert torch.equal(rope[text3, 3 * nb:], torch.ones(3, 3 * nb))
    last = coords.shape[0] - 1  # the single text token: t = -1, scale 1
    assert torch.allclose(rope[last, :nb], torch.sin(-bands))


def test_rope_rejects_size_one_with_ref():
    coords = torch.tensor([[0, 0, 0, 1, 1, 1, 2, 1, 1]], dtype=torch.float32)
    with pytest.raises(ValueError, match="not finite"):
        R.rope_table(coords, R.default_bands(4))


def test_packed_samples_equal_separate_samples():
    params = R.trainable_leaves(R.init_params(TINY, seed=1))
    packed = R.make_batch(TINY, [((2, 2, 3), 5, 7), ((1, 3, 2), 4, 3)], seed=2)
    pred = R.forward(params, packed, "fp32", TINY)
    cu = [int(c) for c in packed["cu_seqlens"]]
    for s, one in enumerate(R.split_batch(packed)):
        alone = R.forward(params, one, "fp32", TINY)
        diff = (pred[cu[s]:cu[s + 1]] - alone).abs().max().item()
        assert diff <= 1e-5 * alone.abs().max().item(), f"sample {s}: packed vs alone max diff {diff}"
    # Teeth: attention across the two samples changes the outputs.
    leaky = dict(packed, cu_seqlens=torch.tensor([0, cu[-1]], dtype=torch.int32))
    assert (R.forward(params, leaky, "fp32", TINY) - pred).abs().max() > 1e-3


def test_gradcheck_float64():
    torch.manual_seed(0)
    params = {n: t.double() for n, t in R.init_params(MICRO, seed=3).items()}
    batch = {k: (v.double() if v.is_floating_point() else v)
             for k, v in R.make_batch(MICRO, [((1, 2, 2), 3, 2), ((1, 1, 2), 2, 1)], seed=4).items()}
    checked = ["block.layers.0.attention.linear_qkv.weight", "block.layers.1.mlp.up_gate_proj.weight",
               "block.layers.2.attention.q_norm.weight", "block.layers.0.mlp.pre_norm.weight",
               "adapter.audio_embedder.bias", "final_linear_video.weight"]

    def loss_of(*tensors):
        p = dict(params)
        p.update(zip(checked, tensors))
        return R.forward_loss(p, batch, "fp64", MICRO)[0]

    inputs = [params[n].clone().requires_grad_(True) for n in checked]
    # Exact Jacobian on the small ones, fast (random projection) mode on the big ones.
    assert torch.autograd.gradcheck(loss_of, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)
    small = [2, 4]
    assert torch.autograd.gradcheck(lambda *t: loss_of(*[t[small.index(i)] if i in small else inputs[i].detach()
                                                          for i in range(len(inputs))]),
                                    [inputs[i] for i in small], eps=1e-6, atol=1e-7, rtol=1e-5)
    # fp32 gradients agree with fp64 ones (the fp32 mode has no precision trap of its own).
    leaves32 = R.trainable_leaves(params, torch.float32)
    batch32 = {k: (v.float() if v.is_floating_point() else v) for k, v in batch.items()}
    R.forward_loss(leaves32, batch32, "fp32", MICRO)[0].backward()
    leaves64 = R.trainable_leaves(params, torch.float64)
    R.forward_loss(leaves64, batch, "fp64", MICRO)[0].backward()
    for n, leaf in leaves64.items():
        if leaf.grad is not None:
            rel = ((leaves32[n].grad.double() - leaf.grad).norm() / leaf.grad.norm().clamp_min(1e-30)).item()
            assert rel < 1e-5, f"{n}: fp32 vs fp64 grad rel L2 {rel}"


def test_experts_route_by_modality_in_order():
    # Last layer's MLP is per token and feeds the heads directly: its expert chunk i may only move
    # the prediction rows of modality i (video, audio, text order).
    params = R.init_params(TINY, seed=5)
    batch = R.make_batch(TINY, [((2, 2, 3), 5, 7)], seed=6)
    base = R.forward(params, batch, "fp32", TINY)
    mod = batch["modality_mapping"]
    name = "block.layers.5.mlp.down_proj.weight"
    for expert in range(3):
        p = dict(params)
        w = p[name].clone()
        rows = w.shape[0] // 3
        w[expert * rows:(expert + 1) * rows] += 0.05
        p[name] = w
        moved = (R.forward(p, batch, "fp32", TINY) - base).abs().amax(dim=1) > 0
        assert torch.equal(moved, (mod == expert) & (mod != R.TEXT)), f"expert {expert}"


def test_up_gate_interleave_convention():
    # De-interleaving rows per expert block and splitting [gate | linear] halves is the same math
    # (what the C++ side does with deinterleave_mlp); reading interleaved rows as halves is not.
    params = R.init_params(TINY, seed=7)
    batch = R.make_batch(TINY, [((2, 2, 3), 5, 7)], seed=8)
    u = torch.randn(10, 2 * 40, dtype=torch.float64) * 4
    halves = torch.cat([u[:, 0::2], u[:, 1::2]], dim=1)
    gate, lin = halves.chunk(2, dim=1)
    gate, lin = gate.clamp(max=7), lin.clamp(-7, 7)
    assert torch.allclose(R.swiglu7(u), gate * torch.sigmoid(1.702 * gate) * (lin + 1))
    base = R.forward(params, batch, "fp32", TINY)
    wrong = dict(params)
    for i in (2, 3, 4, 5):  # SwiGLU7 layers: de-interleave, then (wrongly) use as if interleaved
        name = f"block.layers.{i}.mlp.up_gate_proj.weight"
        e = R.experts(TINY, i)
        w = params[name].view(e, -1, 2, TINY["hidden_size"]).transpose(1, 2).reshape(params[name].shape)
        wrong[name] = w
    assert (R.forward(wrong, batch, "fp32", TINY) - base).abs().max() > 1e-2


def test_loss_terms():
    params = R.init_params(TINY, seed=9)
    batch = R.make_batch(TINY, [((1, 2, 2), 3, 2)], seed=10)
    pred = R.forward(params, batch, "fp32", TINY)
    mod, tgt = batch["modality_mapping"], batch["target_velocity"]
    video = ((pred - tgt)[mod == 0][:, :16] ** 2).mean()
    audio = ((pred - tgt)[mod == 1][:, :8] ** 2).mean()  # 8 audio channels, not out_width 16
    assert torch.allclose(R.flow_matching_loss(pred, batch, TINY), video + audio)
    no_audio = dict(batch, loss_mask=batch["loss_mask"] & (mod != 1))
    assert torch.allclose(R.flow_matching_loss(pred, no_audio, TINY), video)
    nothing = dict(batch, loss_mask=torch.zeros_like(batch["loss_mask"]))
    assert R.flow_matching_loss(pred, nothing, TINY).item() == 0.0
    assert torch.equal(pred[mod == 2], torch.zeros(2, 16)) and torch.equal(pred[mod == 1][:, 8:], torch.zeros(3, 8))


def test_upstream_precision_is_bf16_close_to_fp32():
    params = R.init_params(TINY, seed=11)
    batch = R.make_batch(TINY, [((2, 2, 3), 5, 7), ((2, 2, 3), 5, 7)], seed=12)
    fp32 = R.forward(params, batch, "fp32", TINY)
    up = R.forward(params, batch, "upstream", TINY)
    rel = ((up - fp32).norm() / fp32.norm()).item()
    assert 1e-4 < rel < 3e-2, f"upstream vs fp32 prediction rel L2 {rel}"


@pytest.mark.parametrize("shards", [1, 3])
def test_load_hf_casts_to_module_dtypes(tmp_path, shards):
    params = R.init_params(TINY, seed=13)
    R.save_hf(params, tmp_path, shards=shards)
    loaded = R.load_hf(tmp_path)
    assert sorted(loaded) == sorted(n for n, _, _, _ in R.tensor_specs(TINY))
    for name, shape, disk, _ in R.tensor_specs(TINY):
        t = loaded[name]
        assert tuple(t.shape) == shape and t.dtype == R.module_dtype(name), name
        assert torch.equal(t, params[name].to(disk).to(t.dtype)), name
    assert loaded["adapter.video_embedder.weight"].dtype == torch.float32
    assert loaded["block.layers.3.mlp.up_gate_proj.weight"].dtype == torch.bfloat16
