"""`mmtrain sample magihuman` against a sampler written here from docs/sampling.md: the schedule and
UniPC in float64 scalars, upstream's packing, the independent PyTorch DiT of the parity tests
(reference_magihuman.py). Tiny model in fp32; final latents within 1e-5, with and without guidance;
1 rank against 2 ranks bitwise; Ulysses and ring context parallelism; the refused inputs."""
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import reference_magihuman as R  # noqa: E402
import mmtrain_util as mu  # noqa: E402

_e2e = mu.e2e_helpers()
run_mmtrain = _e2e.run_mmtrain

TINY = R.make_config(num_layers=3, hidden_size=64, head_dim=16, num_query_groups=2, video_in_channels=16,
                     audio_in_channels=8, text_in_channels=24, mm_layers=[0, 2], gelu7_layers=[0])
SECONDS, HEIGHT, WIDTH, STEPS = 0.48, 64, 96, 6   # Na = 13, T' = 4, latent 4 x 6
TOLERANCE = 1e-5
# Against the fp64 reference, mmtrain's fp32 sampler is off by at most 9.1e-6 with guidance 5 (audio;
# 1.5e-6 without guidance), measured on a 2-core AMD EPYC; other CPUs' fp32 kernels sum in other
# orders, hence twice that. (The fp32 reference was off by 1.6e-5 or 5e-6 depending on the thread
# count the pytest process had been left at by the tests before it.)
GUIDED_TOLERANCE = 2e-5


# ---------------------------------------------------------------------------------------------
# The reference, from docs/sampling.md

def schedule(steps, shift):
    sigma_max = float(np.float32(1 - 1 / 1000))
    s = np.linspace(sigma_max, 0.0, steps + 1)[:-1]
    s = shift * s / (1 + (shift - 1) * s)
    return np.concatenate([s.astype(np.float32), [0.0]]).astype(np.float64), (s * 1000).astype(np.int64)


class UniPC:
    """Order-2 UniPC (bh2, x0 prediction, the last step at order 1), float64 scalars."""

    def __init__(self, sigmas):
        self.sigma, self.i, self.x0, self.last, self.order, self.warm = sigmas, 0, [], None, 0, 0

    def lam(self, j):
        s = self.sigma[j]
        return math.inf if s == 0 else math.log(1 - s) - math.log(s)

    def terms(self, h, order):
        hh = -h
        phi = math.expm1(hh)
        b_h = phi
        h_phi, b, fact = phi / hh - 1, [], 1
        for k in range(1, order + 1):
            b.append(h_phi * fact / b_h)
            fact *= k + 1
            h_phi = h_phi / hh - 1 / fact
        return phi, b_h, b

    def step(self, v, x):
        i, sig = self.i, self.sigma
        x0 = x - sig[i] * v
        if i > 0:  # corrector at the last step's order
            h = self.lam(i) - self.lam(i - 1)
            phi, b_h, b = self.terms(h, self.order)
            m0 = self.x0[-1]
            base = (sig[i] / sig[i - 1]) * self.last - (1 - sig[i]) * phi * m0
            if self.order == 1:
                x = base - (1 - sig[i]) * b_h * 0.5 * (x0 - m0)
            else:
                r = (self.lam(i - 2) - self.lam(i - 1)) / h
                rho = np.linalg.solve(np.array([[1.0, 1.0], [r, 1.0]]), np.array(b))
                d1 = (self.x0[-2] - m0) / r
                x = base - (1 - sig[i]) * b_h * (rho[0] * d1 + rho[1] * (x0 - m0))
        self.x0 = (self.x0 + [x0])[-2:]
        self.order = min(2, len(sig) - 1 - i, self.warm + 1)
        self.last = x
        h = self.lam(i + 1) - self.lam(i)
        if sig[i + 1] == 0:
            nxt = x0  # sigma 0: (0 / sigma) x - 1 * (-1) * x0
        else:
            phi, b_h, _ = self.terms(h, self.order)
            nxt = (sig[i + 1] / sig[i]) * x - (1 - sig[i + 1]) * phi * x0
            if self.order == 2:
                r = (self.lam(i - 1) - self.lam(i)) / h
                nxt = nxt - (1 - sig[i + 1]) * b_h * 0.5 * ((self.x0[-2] - x0) / r)
        self.warm = min(self.warm + 1, 2)
        self.i += 1
        return nxt


def coords(shape, ref, offset):
    t, h, w = torch.meshgrid(*(torch.arange(n) + o for n, o in zip(shape, offset)), indexing="ij")
    xyz = torch.stack([t, h, w], -1).reshape(-1, 3).float()
    n = xyz.shape[0]
    return torch.cat([xyz, torch.tensor(shape).float().expand(n, 3), torch.tensor(ref).float().expand(n, 3)], 1)


def velocities(params, video, audio, text, precision="fp32"):
    """Pack [video tokens | audio | text] as training does, run the DiT, unpack (pT, pH, pW, C)."""
    z, t, h, w = video.shape
    tokens = video.reshape(z, t, h // 2, 2, w // 2, 2).permute(1, 2, 4, 0, 3, 5).reshape(-1, 4 * z)
    na, nt = audio.shape[0], text.shape[0]
    width = R.io_width(TINY)
    rows = [torch.nn.functional.pad(m, (0, width - m.shape[1])) for m in (tokens, audio, text)]
    grid = (t, h // 2, w // 2)
    batch = {"x": torch.cat(rows),
             "coords_mapping": torch.cat([coords(grid, grid, (0, 0, 0)),
                                          coords((na, 1, 1), ((na - 1) // 4 + 1, 1, 1), (0, 0, 0)),
                                          coords((nt, 1, 1), (1, 1, 1), (-nt, 0, 0))]),
             "modality_mapping": torch.cat([torch.full((len(tokens),), 0), torch.full((na,), 1), torch.full((nt,), 2)]),
             "cu_seqlens": torch.tensor([0, len(tokens) + na + nt], dtype=torch.int32)}
    with torch.no_grad():
        pred = R.forward(params, batch, precision, TINY)
    v = pred[:len(tokens), :4 * z].reshape(t, h // 2, w // 2, 2, 2, z).permute(5, 0, 1, 3, 2, 4).reshape(z, t, h, w)
    return v, pred[len(tokens):len(tokens) + na, :audio.shape[1]]


def reference_sample(params, text, negative, seed, steps=STEPS, shift=5.0, g_video=5.0, g_audio=5.0, precision="fp32"):
    """Upstream's sampler on the reference DiT. precision "fp64" runs it all in float64 (the noise
    drawn in fp32 as upstream draws it): a reference that does not depend on fp32 summation orders,
    which differ with the thread count and the CPU."""
    dtype = torch.float64 if precision == "fp64" else torch.float32
    na = round(SECONDS * 25) + 1
    generator = torch.Generator().manual_seed(seed)
    audio = torch.randn(na, 8, generator=generator).to(dtype)
    video = torch.randn(4, (na - 1) // 4 + 1, HEIGHT // 16, WIDTH // 16, generator=generator).to(dtype)
    text = text.to(dtype)
    negative = None if negative is None else negative.to(dtype)
    sigmas, timesteps = schedule(steps, shift)
    video_s, audio_s = UniPC(sigmas), UniPC(sigmas)
    for i, t in enumerate(timesteps):
        v_video, v_audio = velocities(params, video, audio, text, precision)
        if negative is None:
            clean_v, clean_a = video - sigmas[i] * v_video, audio - sigmas[i] * v_audio
            video = sigmas[i + 1] * torch.randn(video.shape, generator=generator).to(dtype) + (1 - sigmas[i + 1]) * clean_v
            audio = sigmas[i + 1] * torch.randn(audio.shape, generator=generator).to(dtype) + (1 - sigmas[i + 1]) * clean_a
            continue
        u_video, u_audio = velocities(params, video, audio, negative, precision)
        scale = g_video if t > 500 else 2.0
        video = video_s.step(u_video + scale * (v_video - u_video), video)
        audio = audio_s.step(u_audio + g_audio * (v_audio - u_audio), audio)
    return video, audio


# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sampler")
    weights = tmp / "weights"
    params = R.init_params(TINY, seed=3)
    R.save_hf(params, weights)
    config = tmp / "tiny.yaml"
    config.write_text(mu.magihuman_yaml("tiny sampler test", TINY, weights, tmp / "no_data", {"micro_batch_size": 1},
                                        tmp / "run"))
    gen = torch.Generator().manual_seed(0)
    for name, rows in (("a", 7), ("b", 11), ("negative", 9)):
        save_file({"prompt_embeds": torch.randn(rows, 24, generator=gen).half()}, str(tmp / f"{name}.safetensors"))
    (tmp / "prompts.jsonl").write_text('{"conditions": "a.safetensors", "seed": 11}\n'
                                       '{"conditions": "b.safetensors", "seed": 12}\n')
    return tmp, config, weights, R.load_hf(weights)


def sample(setup, out, *extra, world=1, check=True):
    """`mmtrain sample magihuman` at the test's size; a flag in `extra` replaces the default's."""
    tmp, config, weights, _ = setup
    flags = {"--load": str(weights), "--prompts": str(tmp / "prompts.jsonl"), "--out": str(out),
             "--seconds": str(SECONDS), "--resolution": f"{HEIGHT}x{WIDTH}", "--steps": str(STEPS)}
    for i in range(0, len(extra), 2):
        flags[extra[i]] = extra[i + 1]
    args = [item for pair in flags.items() for item in pair]
    return run_mmtrain(["sample", "magihuman", str(config), *args], world=world, check=check)


def unpack(path):
    f = load_file(str(path))
    t, h, w = f["video_grid_thw"].tolist()
    z = f["video_latent"].shape[1] // 4
    video = f["video_latent"].reshape(t, h, w, z, 2, 2).permute(3, 0, 1, 4, 2, 5).reshape(z, t, 2 * h, 2 * w)
    return video, f["audio_latent"]


@pytest.mark.parametrize("guided", [True, False])
def test_final_latents_match_the_reference(setup, tmp_path, guided):
    tmp, _, _, params = setup
    extra = ["--negative-conditions", str(tmp / "negative.safetensors")] if guided else []
    proc = sample(setup, tmp_path / "out", *extra)
    assert guided or "cfg_number 1" in proc.stdout + proc.stderr
    negative = load_file(str(tmp / "negative.safetensors"))["prompt_embeds"].float() if guided else None
    for index, (name, seed) in enumerate((("a", 11), ("b", 12))):
        text = load_file(str(tmp / f"{name}.safetensors"))["prompt_embeds"].float()
        want_video, want_audio = reference_sample(params, text, negative, seed, precision="fp64")
        got_video, got_audio = unpack(tmp_path / "out" / f"{index:04d}.safetensors")
        assert got_video.shape == want_video.shape == (4, 4, 4, 6) and got_audio.shape == want_audio.shape == (13, 8)
        tolerance = GUIDED_TOLERANCE if guided else TOLERANCE
        assert (got_video - want_video).abs().max() <= tolerance
        assert (got_audio - want_audio).abs().max() <= tolerance
        record = json.loads((tmp_path / "out" / f"{index:04d}.json").read_text())
        assert record["seed"] == seed and record["cfg_number"] == (2 if guided else 1)


def test_two_ranks_write_what_one_rank_writes(setup, tmp_path):
    tmp = setup[0]
    extra = ["--negative-conditions", str(tmp / "negative.safetensors")]
    sample(setup, tmp_path / "one", *extra)
    sample(setup, tmp_path / "two", *extra, world=2)
    for index in range(2):
        name = f"{index:04d}.safetensors"
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


@pytest.mark.parametrize("split", ["parallel.ulysses_parallel_size=2", "parallel.ring_attention_size=2"])
def test_context_parallel_sampling_matches_the_reference(setup, tmp_path, split):
    """Two ranks share each prompt's sequence (44 rows, padded to 46): the gathered prediction must be the
    unsplit one, so the latents still meet the reference; one writer per prompt."""
    tmp, _, _, params = setup
    sample(setup, tmp_path / "out", "--negative-conditions", str(tmp / "negative.safetensors"), "--set", split,
           world=2)
    negative = load_file(str(tmp / "negative.safetensors"))["prompt_embeds"].float()
    for index, (name, seed) in enumerate((("a", 11), ("b", 12))):
        text = load_file(str(tmp / f"{name}.safetensors"))["prompt_embeds"].float()
        want_video, want_audio = reference_sample(params, text, negative, seed, precision="fp64")
        got_video, got_audio = unpack(tmp_path / "out" / f"{index:04d}.safetensors")
        # Split attention sums in another order; guidance 5 amplifies that over the steps: 1e-5 of the scale.
        for got, want in ((got_video, want_video), (got_audio, want_audio)):
            assert (got - want).abs().max() <= TOLERANCE * want.abs().max(), split


def test_bad_input_is_refused_by_name(setup, tmp_path):
    tmp = setup[0]
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "broken.jsonl").write_text('{"conditions": "a.safetensors"\n')
    (tmp_path / "outside.jsonl").write_text('{"conditions": "../a.safetensors"}\n')
    (tmp_path / "both.jsonl").write_text('{"conditions": "a.safetensors", "prompt": "x"}\n')
    (tmp_path / "text.jsonl").write_text('{"prompt": "a face"}\n')
    (tmp_path / "absolute.jsonl").write_text(json.dumps({"conditions": str(tmp / "a.safetensors")}) + "\n")
    torch.save({"prompt_embeds": torch.zeros(3, 24)}, tmp / "a.pt")  # what `fixture magihuman` writes
    (tmp / "pt.jsonl").write_text('{"conditions": "a.pt"}\n')
    exists = tmp_path / "exists"
    exists.mkdir()
    cases = [
        (["--prompts", str(tmp_path / "empty.jsonl")], "no prompts"),
        (["--prompts", str(tmp_path / "broken.jsonl")], "broken.jsonl:1"),
        (["--prompts", str(tmp_path / "outside.jsonl")], "must be a file inside"),
        (["--prompts", str(tmp_path / "both.jsonl")], "exactly one of"),
        (["--prompts", str(tmp_path / "text.jsonl")], "give --text-encoder"),
        (["--resolution", "64x90"], "multiples of 32"),
        (["--seconds", "0"], "seconds must be in (0, 600]"),
        (["--seconds", "0.5"], "whole number of frames"),
        (["--guidance-video", "nan"], "must be finite"),
        # Finite but extreme: the schedule or the guided velocity would overflow to NaN latents (rc 0 before).
        (["--guidance-video", "1e300"], "must be finite and in [-100, 100]"),
        (["--shift", "1e-300"], "shift must be in [0.01, 100]"),
        (["--prompts", str(tmp_path / "absolute.jsonl")], "is an absolute path, which is refused"),
        (["--prompts", str(tmp / "pt.jsonl")], "a torch.save (.pt) file; conditions must be safetensors"),
        (["--vae", str(tmp)], "--vae and --audio-vae go together"),
    ]
    for extra, message in cases:
        out = tmp_path / "out"
        proc = sample(setup, out, *extra, check=False)
        assert proc.returncode != 0 and message in proc.stderr, (extra, proc.stderr[-2000:])
        assert not out.exists(), extra
    proc = sample(setup, exists, check=False)
    assert proc.returncode != 0 and "exists; give a new directory" in proc.stderr
    save_file({"prompt_embeds": torch.zeros(3, 32)}, str(tmp / "wrong.safetensors"))
    (tmp / "wrong.jsonl").write_text('{"conditions": "wrong.safetensors"}\n')
    proc = sample(setup, tmp_path / "w", "--prompts", str(tmp / "wrong.jsonl"), check=False)
    assert proc.returncode != 0 and "(model.config.text_in_channels)" in proc.stderr, proc.stderr[-2000:]
    other = tmp_path / "other_model"
    other.mkdir()
    save_file({"model.embed_tokens.weight": torch.zeros(4, 4)}, str(other / "model.safetensors"))
    proc = sample(setup, tmp_path / "o", "--load", str(other), check=False)
    assert proc.returncode != 0 and "keys the model needs" in proc.stderr, proc.stderr[-2000:]
