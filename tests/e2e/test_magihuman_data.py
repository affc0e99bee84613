"""MagiHuman data end to end: samples written by Python (torch.save dicts, safetensors) are read
by the C++ dataset; `mmtrain debug collate` batches are checked against a Python reimplementation
of the packing and coords, and the noising through identities (one sigma per sample solved from
x, target and the clean latents); the data and weights fixtures open in Python with the right keys,
shapes and dtypes."""
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import run_mmtrain, write_config

CV, CA, CT = 16, 8, 24  # tiny widths: 4 latent channels x 1x2x2 patch, audio 8, text 24

TINY_MODEL = ("{num_layers: 3, hidden_size: 64, head_dim: 16, num_query_groups: 2, video_in_channels: 16, "
              "audio_in_channels: 8, text_in_channels: 24, mm_layers: [0, 2], gelu7_layers: [0]}")


def config_text(tmp: Path, root: Path, *, mbs=2, seed=7, sampling="logit_normal", model=TINY_MODEL,
                channels=(CV, CA, CT)):
    return f"""
model:
  model_id: magihuman
  config: {model}
data:
  dataset_param:
    dataset_type: magihuman_precomputed
    data_root: {root}
    video_in_channels: {channels[0]}
    audio_in_channels: {channels[1]}
    text_in_channels: {channels[2]}
    sigma_sampling: {sampling}
  dataloader_param: {{collate_param: {{model_name: magihuman}}}}
training:
  micro_batch_size: {mbs}
  seed: {seed}
  train_iters: 4
logging:
  output_dir: {tmp / 'run'}
"""


# ---------------------------------------------------------------------------------------------
# Python reference: packing and coords (spec §5, v2) and the video target reorder (spec §3).

def get_coords(shape, ref, offset):
    t, h, w = torch.meshgrid(torch.arange(shape[0]) + offset[0], torch.arange(shape[1]) + offset[1],
                             torch.arange(shape[2]) + offset[2], indexing="ij")
    xyz = torch.stack([t, h, w], dim=-1).reshape(-1, 3).float()
    n = xyz.shape[0]
    return torch.cat([xyz, torch.tensor(shape).float().expand(n, 3), torch.tensor(ref).float().expand(n, 3)], dim=1)


def sample_coords(grid, na, nt):
    ref_t = max(((na - 1) // 4 + 1) // 1, 1)
    return torch.cat([get_coords(grid, grid, (0, 0, 0)), get_coords((na, 1, 1), (ref_t, 1, 1), (0, 0, 0)),
                      get_coords((nt, 1, 1), (1, 1, 1), (-nt, 0, 0))])


def reorder(tok):  # (C, pT, pH, pW) -> (pT, pH, pW, C)
    n, c = tok.shape[0], tok.shape[1] // 4
    return tok.reshape(n, c, 1, 2, 2).permute(0, 2, 3, 4, 1).reshape(n, 4 * c)


def unreorder(tok):
    n, c = tok.shape[0], tok.shape[1] // 4
    return tok.reshape(n, 1, 2, 2, c).permute(0, 4, 1, 2, 3).reshape(n, 4 * c)


def test_reference_reorder_matches_spec_formula():
    tok = torch.arange(192.0).reshape(1, 192)
    out = reorder(tok)
    for c in range(48):
        for k in range(4):
            assert out[0, k * 48 + c] == c * 4 + k
    assert torch.equal(unreorder(out), tok)


# ---------------------------------------------------------------------------------------------
# Samples written by Python.

SAMPLES = [  # stem, grid, Na, Nt, writer
    ("clip_a", (1, 2, 3), 5, 4, "pt_tensor_grid"),
    ("clip_b", (2, 1, 2), 3, 2, "safetensors"),
    ("clip_c", (2, 2, 2), 9, 1, "pt_tuple_grid"),
    ("clip_d", (1, 1, 2), 1, 6, "pt_alt_keys"),
]


def write_python_samples(root: Path):
    """Returns stem -> (video, grid, audio, text) clean tensors."""
    gen = torch.Generator().manual_seed(123)
    for sub in ("latents", "audio_latents", "conditions"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    clean = {}
    for stem, grid, na, nt, writer in SAMPLES:
        nv = grid[0] * grid[1] * grid[2]
        video = torch.randn(nv, CV, generator=gen)
        audio = torch.randn(na, CA, generator=gen)
        text = torch.randn(nt, CT, generator=gen)
        clean[stem] = (video, grid, audio, text)
        if writer == "safetensors":
            save_file({"video_latent": video, "video_grid_thw": torch.tensor(grid)}, root / "latents" / f"{stem}.safetensors")
            save_file({"audio_latent": audio}, root / "audio_latents" / f"{stem}.safetensors")
            save_file({"prompt_embeds": text}, root / "conditions" / f"{stem}.safetensors")
        elif writer == "pt_alt_keys":
            # MindSpeed's alternative names, a list grid, fp16 text saved [1, Nt, C]; the video is a
            # view at a storage offset and the audio a transposed (non-contiguous) view, as
            # slicing precompute scripts save them.
            text = text.half().float()
            clean[stem] = (video, grid, audio, text)
            offset_video = torch.cat([torch.zeros(1, CV), video])[1:]
            torch.save({"latents": offset_video, "grid_thw": list(grid)}, root / "latents" / f"{stem}.pt")
            torch.save({"latents": audio.t().contiguous().t()}, root / "audio_latents" / f"{stem}.pt")
            torch.save({"text_embed": text.half().unsqueeze(0)}, root / "conditions" / f"{stem}.pt")
        else:
            g = torch.tensor(grid) if writer == "pt_tensor_grid" else tuple(grid)
            torch.save({"video_latent": video, "video_grid_thw": g}, root / "latents" / f"{stem}.pt")
            torch.save({"audio_latent": audio}, root / "audio_latents" / f"{stem}.pt")
            torch.save({"prompt_embeds": text, "prompt": "a cat"}, root / "conditions" / f"{stem}.pt")
    return clean


def debug_collate(cfg: Path, out: Path, *args):
    run_mmtrain(["debug", "collate", str(cfg), "--out", str(out), *args])
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    return load_file(str(out)), meta


def check_batch(batch, samples, sampling="logit_normal"):
    """samples: [(video, grid, audio, text)] in batch order. Returns the solved sigma per sample."""
    assert sorted(batch) == ["coords_mapping", "cu_seqlens", "loss_mask", "max_seqlen", "modality_mapping",
                             "target_velocity", "x"]
    lens = [v.shape[0] + a.shape[0] + t.shape[0] for v, _, a, t in samples]
    total = sum(lens)
    io, out = max(CV, CA, CT), max(CV, CA)
    assert batch["x"].dtype == torch.float32 and batch["x"].shape == (total, io)
    assert batch["target_velocity"].dtype == torch.float32 and batch["target_velocity"].shape == (total, out)
    assert batch["coords_mapping"].dtype == torch.float32
    assert batch["modality_mapping"].dtype == torch.int64
    assert batch["loss_mask"].dtype == torch.bool
    assert batch["cu_seqlens"].dtype == torch.int32 and batch["max_seqlen"].dtype == torch.int32
    assert batch["max_seqlen"].shape == () and batch["max_seqlen"].item() == max(lens)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    assert batch["cu_seqlens"].tolist() == cu
    # Exact: coords, modality, loss mask (Python reference).
    assert torch.equal(batch["coords_mapping"], torch.cat([sample_coords(g, a.shape[0], t.shape[0]) for v, g, a, t in samples]))
    modality = torch.cat([torch.tensor([0] * v.shape[0] + [1] * a.shape[0] + [2] * t.shape[0]) for v, _, a, t in samples])
    assert torch.equal(batch["modality_mapping"], modality)
    assert torch.equal(batch["loss_mask"], modality != 2)

    sigmas = []
    x, target = batch["x"], batch["target_velocity"]
    for (video, grid, audio, text), begin in zip(samples, cu):
        nv, na, nt = video.shape[0], audio.shape[0], text.shape[0]
        xv, xa, xt = x[begin:begin + nv], x[begin + nv:begin + nv + na], x[begin + nv + na:begin + nv + na + nt]
        tv, ta, tt = (target[begin:begin + nv], target[begin + nv:begin + nv + na],
                      target[begin + nv + na:begin + nv + na + nt])
        # Text: clean, never noised; target zero. Padding columns zero.
        assert torch.equal(xt[:, :CT], text)
        assert torch.count_nonzero(xv[:, CV:]) == 0 and torch.count_nonzero(xa[:, CA:]) == 0
        assert torch.count_nonzero(ta[:, CA:]) == 0 and torch.count_nonzero(tt) == 0
        # x_t - x0 = sigma (eps - x0) and target = reorder(eps - x0): solve sigma by least squares.
        rv, dv = (xv[:, :CV] - video).double(), unreorder(tv).double()
        ra, da = (xa[:, :CA] - audio).double(), ta[:, :CA].double()
        r, d = torch.cat([rv.flatten(), ra.flatten()]), torch.cat([dv.flatten(), da.flatten()])
        sigma = float((r @ d) / (d @ d))
        assert 0.0 < sigma < 1.0
        # One constant across every video and audio element of the sample.
        assert torch.allclose(r, sigma * d, atol=1e-5), (r - sigma * d).abs().max()
        sigma_v = float((rv.flatten() @ dv.flatten()) / (dv.flatten() @ dv.flatten()))
        sigma_a = float((ra.flatten() @ da.flatten()) / (da.flatten() @ da.flatten()))
        assert abs(sigma_v - sigma_a) < 1e-5
        # The un-reordered video target is eps - x0 with eps ~ N(0, 1) (the reorder is not the identity).
        assert not torch.allclose(tv, unreorder(tv))
        sigmas.append(sigma)
    return sigmas


def test_python_written_samples_collate(tmp_path):
    root = tmp_path / ".precomputed"
    clean = write_python_samples(root)
    stems = sorted(clean)
    cfg = write_config(tmp_path / "c.yaml", config_text(tmp_path, root, mbs=2))
    all_sigmas = []
    for step in (0, 1):
        batch, meta = debug_collate(cfg, tmp_path / f"b{step}.safetensors", "--step", str(step))
        indices = [int(i) for i in meta["sample_indices"].split(",")]
        assert indices == [2 * step, 2 * step + 1]
        assert meta["step"] == str(step) and meta["seed"] == "7"
        all_sigmas += check_batch(batch, [clean[stems[i]] for i in indices])
    assert len(set(round(s, 6) for s in all_sigmas)) == 4  # one independent sigma per sample

    # Same (seed, step, micro, rank): the same batch, bit for bit. Another seed: another batch.
    again, _ = debug_collate(cfg, tmp_path / "again.safetensors", "--step", "1")
    first = load_file(str(tmp_path / "b1.safetensors"))
    assert all(torch.equal(first[k], again[k]) for k in first)
    other, _ = debug_collate(cfg, tmp_path / "other.safetensors", "--step", "1", "--set", "training.seed=8")
    assert not torch.equal(first["x"], other["x"])
    assert torch.equal(first["coords_mapping"], other["coords_mapping"])

    # Uniform sigma sampling and another rank / world: still one sigma per sample in (0, 1).
    cfg_u = write_config(tmp_path / "u.yaml", config_text(tmp_path, root, mbs=1, sampling="uniform"))
    batch, meta = debug_collate(cfg_u, tmp_path / "u.safetensors", "--rank", "1", "--world", "2", "--step", "1")
    index = int(meta["sample_indices"])
    assert index == 3  # step 1 of world 2: samples [2, 4), rank 1 -> sample 3
    check_batch(batch, [clean[stems[index]]])


def test_sample_errors_name_the_path(tmp_path):
    root = tmp_path / ".precomputed"
    write_python_samples(root)
    cfg = write_config(tmp_path / "c.yaml", config_text(tmp_path, root))
    (root / "audio_latents" / "clip_c.pt").unlink()
    proc = run_mmtrain(["debug", "collate", str(cfg), "--out", str(tmp_path / "b.safetensors")], check=False)
    assert proc.returncode == 1, proc.stderr
    assert str(root / "audio_latents") in proc.stderr and "'clip_c'" in proc.stderr

    write_python_samples(root)
    torch.save({"video_latent": torch.zeros(5, CV), "video_grid_thw": (1, 2, 3)}, root / "latents" / "clip_a.pt")
    proc = run_mmtrain(["debug", "collate", str(cfg), "--out", str(tmp_path / "b.safetensors")], check=False)
    assert proc.returncode == 1 and str(root / "latents" / "clip_a.pt") in proc.stderr, proc.stderr
    assert "6 tokens" in proc.stderr

    # Widths must match the model's: the full-size defaults reject the tiny samples.
    write_python_samples(root)
    cfg = write_config(tmp_path / "d.yaml", config_text(tmp_path, root, channels=(192, 64, 3584)))
    proc = run_mmtrain(["debug", "collate", str(cfg), "--out", str(tmp_path / "b.safetensors")], check=False)
    assert proc.returncode == 1 and "video_in_channels" in proc.stderr, proc.stderr

    cfg = write_config(tmp_path / "e.yaml", config_text(tmp_path, tmp_path / "missing"))
    proc = run_mmtrain(["debug", "collate", str(cfg), "--out", str(tmp_path / "b.safetensors")], check=False)
    assert proc.returncode == 1 and str(tmp_path / "missing") in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------
# Data fixture.

def read_fixture_sample(root: Path, stem: str, ext: str):
    if ext == "pt":
        load = lambda p: torch.load(p, weights_only=True)  # noqa: E731
    else:
        load = lambda p: load_file(str(p))  # noqa: E731
    return (load(root / "latents" / f"{stem}.{ext}"), load(root / "audio_latents" / f"{stem}.{ext}"),
            load(root / "conditions" / f"{stem}.{ext}"))


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_data_fixture_tiny(tmp_path, fmt):
    root = tmp_path / "fx"
    run_mmtrain(["fixture", "magihuman", "--out", str(root), "--samples", "3", "--seed", "4", "--video-grid", "2,2,3",
                 "--audio-tokens", "5", "--text-tokens", "3", "--video-channels", str(CV), "--audio-channels",
                 str(CA), "--text-channels", str(CT), "--format", fmt])
    for sub in ("latents", "audio_latents", "conditions"):
        assert sorted(p.name for p in (root / sub).iterdir()) == [f"sample_{i:06d}.{fmt}" for i in range(3)]
    samples = []
    for i in range(3):
        lat, aud, cond = read_fixture_sample(root, f"sample_{i:06d}", fmt)
        assert sorted(lat) == ["video_grid_thw", "video_latent"] and list(aud) == ["audio_latent"]
        assert list(cond) == ["prompt_embeds"]
        assert lat["video_latent"].shape == (12, CV) and lat["video_latent"].dtype == torch.float32
        assert lat["video_grid_thw"].tolist() == [2, 2, 3]
        assert aud["audio_latent"].shape == (5, CA) and cond["prompt_embeds"].shape == (3, CT)
        samples.append((lat["video_latent"], (2, 2, 3), aud["audio_latent"], cond["prompt_embeds"]))
    assert not torch.equal(samples[0][0], samples[1][0])
    # The fixture feeds the C++ dataset and collator.
    cfg = write_config(tmp_path / "c.yaml", config_text(tmp_path, root, mbs=3))
    batch, _ = debug_collate(cfg, tmp_path / "b.safetensors")
    check_batch(batch, samples)
    # Same seed, same files; the first samples do not depend on --samples.
    root2 = tmp_path / "fx2"
    run_mmtrain(["fixture", "magihuman", "--out", str(root2), "--samples", "1", "--seed", "4", "--video-grid", "2,2,3",
                 "--audio-tokens", "5", "--text-tokens", "3", "--video-channels", str(CV), "--audio-channels",
                 str(CA), "--text-channels", str(CT), "--format", fmt])
    assert torch.equal(read_fixture_sample(root2, "sample_000000", fmt)[0]["video_latent"], samples[0][0])


def test_data_fixture_default_shape(tmp_path):
    """The official 5 s 256p sample: video [3840, 192] grid (32, 8, 15), audio [126, 64], text [640, 3584]."""
    root = tmp_path / "fx"
    run_mmtrain(["fixture", "magihuman", "--out", str(root), "--samples", "1"])
    lat, aud, cond = read_fixture_sample(root, "sample_000000", "pt")
    assert lat["video_latent"].shape == (3840, 192) and lat["video_grid_thw"].tolist() == [32, 8, 15]
    assert aud["audio_latent"].shape == (126, 64) and cond["prompt_embeds"].shape == (640, 3584)
    # Documented distribution: i.i.d. N(0, 1).
    v = lat["video_latent"]
    assert abs(v.mean().item()) < 0.01 and abs(v.std().item() - 1.0) < 0.01
    # The shipped full-size example config drives the C++ dataset and collator as it is.
    example = Path(__file__).resolve().parents[2] / "examples" / "magihuman" / "magihuman_config_t2av.yaml"
    batch, _ = debug_collate(example, tmp_path / "b.safetensors", "--set", f"data.dataset_param.data_root={root}")
    assert batch["x"].shape == (4606, 3584) and batch["target_velocity"].shape == (4606, 192)
    assert batch["max_seqlen"].item() == 4606
    # Audio ref_T = (125 // 4 + 1) = 32 = the video's T: audio spans the video's frame axis.
    assert batch["coords_mapping"][3840, 6].item() == 32.0


def test_data_fixture_refuses_foreign_files(tmp_path):
    root = tmp_path / "fx"
    (root / "latents").mkdir(parents=True)
    torch.save({}, root / "latents" / "other.pt")
    proc = run_mmtrain(["fixture", "magihuman", "--out", str(root), "--samples", "1"], check=False)
    assert proc.returncode == 1 and str(root / "latents" / "other.pt") in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------
# Weights fixture.

def expected_specs(num_layers, d, hd, hkv, cv, ca, ct, mm, gelu):
    """name -> (shape, dtype), spec §4 generalised to any config."""
    hq = d // hd
    qkv = (hq + 2 * hkv) * hd + hq
    specs = {
        "adapter.video_embedder.weight": ([d, cv], torch.bfloat16), "adapter.video_embedder.bias": ([d], torch.bfloat16),
        "adapter.text_embedder.weight": ([d, ct], torch.bfloat16), "adapter.text_embedder.bias": ([d], torch.bfloat16),
        "adapter.audio_embedder.weight": ([d, ca], torch.bfloat16), "adapter.audio_embedder.bias": ([d], torch.bfloat16),
        "adapter.rope.bands": ([hd // 8], torch.float32),
    }
    for i in range(num_layers):
        e = 3 if i in mm else 1
        inter = 4 * d if i in gelu else int(d * 4 * 2 / 3) // 4 * 4
        up = inter if i in gelu else 2 * inter
        p = f"block.layers.{i}."
        specs.update({
            p + "attention.pre_norm.weight": ([d * e], torch.float32),
            p + "attention.linear_qkv.weight": ([qkv * e, d], torch.bfloat16),
            p + "attention.linear_proj.weight": ([d * e, d], torch.bfloat16),
            p + "attention.q_norm.weight": ([hd * e], torch.float32),
            p + "attention.k_norm.weight": ([hd * e], torch.float32),
            p + "mlp.pre_norm.weight": ([d * e], torch.float32),
            p + "mlp.up_gate_proj.weight": ([up * e, d], torch.bfloat16),
            p + "mlp.down_proj.weight": ([d * e, inter], torch.bfloat16),
        })
    specs.update({
        "final_norm_video.weight": ([d], torch.float32), "final_norm_audio.weight": ([d], torch.float32),
        "final_linear_video.weight": ([cv, d], torch.bfloat16), "final_linear_audio.weight": ([ca, d], torch.bfloat16),
    })
    return specs


def read_weights(out: Path):
    index = json.loads((out / "model.safetensors.index.json").read_text())
    tensors, where = {}, {}
    for shard in sorted(out.glob("model-*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            assert f.metadata() == {"format": "pt"}
            for name in f.keys():
                assert name not in tensors
                tensors[name] = f.get_tensor(name)
                where[name] = shard.name
    return index, tensors, where


def test_weights_fixture(tmp_path):
    cfg = write_config(tmp_path / "m.yaml", config_text(tmp_path, tmp_path / "unused"))
    specs = expected_specs(3, 64, 16, 2, CV, CA, CT, mm=[0, 2], gelu=[0])
    assert len(specs) == 7 + 8 * 3 + 4
    assert 7 + 8 * 40 + 4 == 331  # the full model (40 layers): spec §4's tensor count

    out = tmp_path / "w3"
    run_mmtrain(["fixture", "magihuman-weights", "--config", str(cfg), "--out", str(out), "--shards", "3",
                 "--seed", "1"])
    assert sorted(p.name for p in out.glob("model-*.safetensors")) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index, tensors, where = read_weights(out)
    assert index["weight_map"] == where  # every key mapped, to the shard that holds it
    assert list(index["weight_map"]) == sorted(index["weight_map"])
    assert set(tensors) == set(specs)
    total = 0
    for name, (shape, dtype) in specs.items():
        t = tensors[name]
        assert list(t.shape) == shape and t.dtype == dtype, (name, t.shape, t.dtype)
        total += t.numel() * t.element_size()
    assert index["metadata"]["total_size"] == total
    b = 16 // 8
    bands = 1 / (10000 ** (torch.arange(0, b, 1).float() / b))
    assert torch.equal(tensors["adapter.rope.bands"], bands)
    up = tensors["block.layers.1.mlp.up_gate_proj.weight"].float()
    assert abs(up.std().item() - 0.02) < 0.002 and abs(up.mean().item()) < 0.002
    norm = tensors["block.layers.0.attention.pre_norm.weight"]
    assert abs(norm.std().item() - 0.02) < 0.005 and abs(norm.mean().item()) < 0.005  # near 0: the model uses 1 + w
    # Shards are split by bytes, in state-dict order.
    order = [where[n] for n in specs]
    assert order == sorted(order)

    # Default shard count 7; the values do not depend on the sharding.
    out7 = tmp_path / "w7"
    run_mmtrain(["fixture", "magihuman-weights", "--config", str(cfg), "--out", str(out7), "--seed", "1"])
    index7, tensors7, _ = read_weights(out7)
    assert len(set(index7["weight_map"].values())) == 7
    assert all(torch.equal(tensors[n], tensors7[n]) for n in specs)
    # A different seed gives different weights.
    out_s = tmp_path / "ws"
    run_mmtrain(["fixture", "magihuman-weights", "--config", str(cfg), "--out", str(out_s), "--seed", "2",
                 "--shards", "1"])
    _, tensors_s, _ = read_weights(out_s)
    assert not torch.equal(tensors_s["final_linear_video.weight"], tensors["final_linear_video.weight"])
    assert torch.equal(tensors_s["adapter.rope.bands"], bands)


def test_weights_fixture_bad_input(tmp_path):
    cfg = write_config(tmp_path / "m.yaml", config_text(tmp_path, tmp_path / "unused"))
    proc = run_mmtrain(["fixture", "magihuman-weights", "--config", str(cfg), "--out", str(tmp_path / "w"),
                        "--shards", "1000"], check=False)
    assert proc.returncode == 1 and "--shards" in proc.stderr, proc.stderr
    bad = write_config(tmp_path / "b.yaml", config_text(tmp_path, tmp_path / "unused", model="{num_layerz: 2}"))
    proc = run_mmtrain(["fixture", "magihuman-weights", "--config", str(bad), "--out", str(tmp_path / "w")],
                       check=False)
    assert proc.returncode == 1 and "num_layerz" in proc.stderr, proc.stderr


def test_fixture_mix_spreads_durations_and_resolutions(tmp_path):
    def grids(out):
        found = []
        for f in sorted((out / "latents").glob("*.safetensors")):
            with safe_open(str(f), "pt") as s:
                t, h, w = s.get_tensor("video_grid_thw").tolist()
                assert s.get_tensor("video_latent").shape[0] == t * h * w
                found.append((t, h, w))
        return found
    for name in ("a", "b"):
        run_mmtrain(["fixture", "magihuman", "--out", str(tmp_path / name), "--samples", "24", "--seed", "5", "--mix",
                     "--format", "safetensors"])
    found = grids(tmp_path / "a")
    assert found == grids(tmp_path / "b")  # drawn from (seed, index)
    # The base 5 s 256p grid (32, 8, 15) at 1/4 .. 2 x the duration and 1/2 .. 3/2 x the resolution.
    assert {t for t, _, _ in found} <= {8, 16, 32, 64} and {(h, w) for _, h, w in found} <= {(4, 8), (8, 15), (12, 23)}
    counts = [t * h * w for t, h, w in found]
    assert max(counts) / min(counts) >= 8 and len(set(counts)) >= 6, counts
