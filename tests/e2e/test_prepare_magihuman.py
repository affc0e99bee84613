"""`mmtrain prepare magihuman` end to end, on tiny random-weight encoders of the real classes
(`fixture magihuman-encoders`) and synthetic clips written with PyAV:
- the frame and shape arithmetic, 1 rank equal to 2 ranks bitwise, `mmtrain train` on the output;
- fidelity: the tool's latents against a reference written here from docs/prepare.md (the resize-crop,
  the normalization, the 1x2x2 patchify and the audio window merge by hand; only the networks'
  forwards come from the libraries);
- every bad input, each a named error in prepare.json with nothing partial left;
- --resume after a kill, and --decode back to mp4 and encoded again.
"""
import hashlib
import json
import math
import os
import signal
import subprocess
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from conftest import mmtrain_bin, run_mmtrain, write_config

H, W = 64, 96
CV, CA, CT = 16, 8, 24


def prepare(args, world=1, check=True, timeout=300):
    return run_mmtrain(["prepare", "magihuman", *args], world=world, check=check, timeout=timeout)


def encoder_flags(encoders):
    return ["--vae", str(encoders / "vae"), "--audio-vae", str(encoders / "audio_vae"),
            "--text-encoder", str(encoders / "text_encoder")]


def write_clip(path, frames, fps=25, audio=True, pts=None, rotation=None, tone=440.0):
    """frames [F, H, W, 3] uint8 -> an H.264 mp4, optionally with a stereo AAC tone, explicit
    timestamps (ms) and a display rotation."""
    with av.open(str(path), mode="w") as container:
        v = container.add_stream("libx264", rate=fps)
        v.width, v.height, v.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        if pts is not None:
            v.codec_context.time_base = Fraction(1, 1000)
        if rotation is not None:
            v.set_display_rotation(rotation)
        a = container.add_stream("aac", rate=44100, layout="stereo") if audio else None
        for i, frame in enumerate(frames):
            f = av.VideoFrame.from_ndarray(frame, format="rgb24")
            if pts is not None:
                f.pts, f.time_base = pts[i], Fraction(1, 1000)
            container.mux(v.encode(f))
        container.mux(v.encode())
        if a is not None:
            n = int(len(frames) / fps * 44100)
            tone_samples = (0.3 * np.sin(2 * math.pi * tone * np.arange(n) / 44100)).astype(np.float32)
            stereo = np.stack([tone_samples, tone_samples])
            for s in range(0, n, 1024):
                chunk = av.AudioFrame.from_ndarray(np.ascontiguousarray(stereo[:, s:s + 1024]), format="fltp",
                                                   layout="stereo")
                chunk.sample_rate, chunk.pts = 44100, s
                container.mux(a.encode(chunk))
            container.mux(a.encode())


def moving_frames(count, height=H, width=W, seed=0):
    rng = np.random.default_rng(seed)
    frames = np.repeat(rng.integers(0, 200, (1, height, width, 3), dtype=np.uint8), count, axis=0)
    for i in range(count):
        x = (i * 3) % max(1, width - 8)
        frames[i, 4:12, x:x + 8] = 255
    return frames


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    out = tmp_path_factory.mktemp("media") / "encoders"
    run_mmtrain(["fixture", "magihuman-encoders", "--out", str(out), "--config",
                 str(Path(__file__).resolve().parents[2] / "examples/magihuman/magihuman_tiny.yaml")])
    return out


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    out = tmp_path_factory.mktemp("media") / "clips"
    run_mmtrain(["fixture", "clips", "--out", str(out), "--count", "3", "--seconds", "1.0", "--size", f"{H}x{W}"])
    return out


@pytest.fixture(scope="module")
def prepared(encoders, clips, tmp_path_factory):
    out = tmp_path_factory.mktemp("media") / "prepared"
    prepare(["--input", str(clips), "--out", str(out), *encoder_flags(encoders), "--resolution", f"{H}x{W}",
             "--audio-window-seconds", "0.4"])
    return out


def files_of(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.safetensors"))}


def test_shapes_follow_the_frame_arithmetic(prepared):
    summary = json.loads((prepared / "prepare.json").read_text())
    assert summary["channels"] == {"video": CV, "audio": CA, "text": CT}
    assert [c["status"] for c in summary["clips"]] == ["ok"] * 3
    for clip in summary["clips"]:
        # 1.0 s at 25 fps = 25 frames = 1 + 4 * 6: 7 latent frames of (64/16) x (96/16), patched 2x2.
        assert clip["frames"] == 25 and clip["seconds"] == 1.0
        assert clip["video_grid_thw"] == [7, 2, 3] and clip["video_latent"] == [42, CV]
        assert clip["audio_latent"] == [25, CA]           # 51200 Hz / 2048 = 25 latent frames a second
        assert (clip["audio_latent"][0] - 1) // 4 + 1 == clip["video_grid_thw"][0]  # upstream's A2V relation
        stem = clip["stem"]
        video = load_file(prepared / "latents" / f"{stem}.safetensors")
        assert video["video_latent"].dtype == torch.float32 and list(video["video_latent"].shape) == [42, CV]
        assert video["video_grid_thw"].tolist() == [7, 2, 3]
        text = load_file(prepared / "conditions" / f"{stem}.safetensors")["prompt_embeds"]
        assert text.dtype == torch.float16 and list(text.shape) == [clip["caption_tokens"], CT]
        assert load_file(prepared / "audio_latents" / f"{stem}.safetensors")["audio_latent"].shape == (25, CA)
    assert not [p for p in prepared.rglob(".*tmp-*")]


def test_two_ranks_write_what_one_rank_writes(encoders, clips, prepared, tmp_path):
    out = tmp_path / "two"
    prepare(["--input", str(clips), "--out", str(out), *encoder_flags(encoders), "--resolution", f"{H}x{W}",
             "--audio-window-seconds", "0.4"], world=2)
    assert files_of(out) == files_of(prepared)
    one, two = (json.loads((d / "prepare.json").read_text())["clips"] for d in (prepared, out))
    assert one == two


def train_config(path, prepared, run_dir, text_channels=CT):
    return write_config(path, f"""
model:
  model_id: magihuman
  config: {{num_layers: 2, hidden_size: 64, head_dim: 16, num_query_groups: 2, video_in_channels: {CV},
           audio_in_channels: {CA}, text_in_channels: {text_channels}, mm_layers: [0], gelu7_layers: [0]}}
data:
  dataset_param: {{dataset_type: magihuman_precomputed, data_root: {prepared}}}
  dataloader_param: {{collate_param: {{model_name: magihuman}}}}
training: {{micro_batch_size: 1, train_iters: 3, seed: 1, lr: 1.0e-3}}
logging: {{output_dir: {run_dir}}}
""")


def test_train_runs_on_the_output_and_refuses_it_for_another_width(prepared, tmp_path):
    run_mmtrain(["train", str(train_config(tmp_path / "train.yaml", prepared, tmp_path / "run"))])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)

    other = train_config(tmp_path / "other.yaml", prepared, tmp_path / "other", text_channels=32)
    proc = run_mmtrain(["train", str(other)], check=False)
    assert proc.returncode != 0 and "prepare.json" in proc.stderr and "text tokens 24 wide" in proc.stderr


# ---------------------------------------------------------------------------------------------
# Fidelity: a reference written from docs/prepare.md. The networks' forwards come from diffusers and
# transformers; everything around them is written out here.

def reference_frames(path, count, height, width):
    """Frames 0..count-1 of a constant 25 fps clip, cropped to the centred box of the target aspect
    (upstream's resizecrop), Lanczos-resized, scaled to [-1, 1]: [3, F, H, W] fp32."""
    out = []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            image = frame.to_image()
            w, h = image.size
            if h / w > height / width:
                nw, nh = w, int(w * height / width)
            else:
                nh, nw = h, int(h * width / height)
            image = image.crop(((w - nw) / 2, (h - nh) / 2, (w + nw) / 2, (h + nh) / 2))
            image = image.resize((width, height), resample=Image.LANCZOS)
            out.append(np.asarray(image, dtype=np.float32) / 255.0 * 2.0 - 1.0)
            if len(out) == count:
                break
    return torch.from_numpy(np.stack(out)).permute(3, 0, 1, 2).contiguous()


def reference_patchify(latent):
    """[z, T, h, w] -> [T * h/2 * w/2, 4z], column c*4 + kh*2 + kw, tokens t-major: by loops."""
    z, t, h, w = latent.shape
    out = np.zeros((t * (h // 2) * (w // 2), 4 * z), np.float32)
    row = 0
    for ti in range(t):
        for hi in range(h // 2):
            for wi in range(w // 2):
                for c in range(z):
                    for kh in range(2):
                        for kw in range(2):
                            out[row, c * 4 + kh * 2 + kw] = latent[c, ti, 2 * hi + kh, 2 * wi + kw]
                row += 1
    return out


def reference_merge(windows):
    """Windows [frames, C]: each overlap of half a window cross-faded, the earlier window's weight
    (overlap - i) / overlap and the later's i / overlap."""
    frames = windows[0].shape[0]
    overlap = frames // 2
    step = frames - overlap
    out = np.zeros(((len(windows) - 1) * step + frames, windows[0].shape[1]), np.float32)
    out[:frames] = windows[0]
    for k, current in enumerate(windows[1:], start=1):
        begin = k * step
        for i in range(overlap):
            out[begin + i] = np.float32((overlap - i) / overlap) * out[begin + i] + np.float32(i / overlap) * current[i]
        out[begin + overlap:begin + frames] = current[overlap:]
    return out


def test_latents_match_a_reference_written_from_the_spec(encoders, clips, prepared):
    from diffusers import AutoencoderKLWan, AutoencoderOobleck
    from transformers import AutoTokenizer
    from transformers.models.t5gemma import T5GemmaEncoderModel

    stem = "clip_001"
    vae = AutoencoderKLWan.from_pretrained(encoders / "vae").eval()
    frames = reference_frames(clips / f"{stem}.mp4", 25, H, W)
    with torch.no_grad():
        mu = vae.encode(frames.unsqueeze(0)).latent_dist.mean[0].numpy()
    mean = np.array(vae.config.latents_mean, np.float32).reshape(-1, 1, 1, 1)
    inverse_std = (1.0 / torch.tensor(vae.config.latents_std, dtype=torch.float32)).numpy().reshape(-1, 1, 1, 1)
    expected = reference_patchify((mu - mean) * inverse_std)
    got = load_file(prepared / "latents" / f"{stem}.safetensors")["video_latent"].numpy()
    assert np.abs(got - expected).max() <= 1e-6

    # Audio: 1 s at 51200 Hz in windows of 0.4 s (20480 samples) every 0.2 s: 4 windows, the last
    # zero-padded; each window's posterior sampled with the clip's generator, in order.
    oobleck = AutoencoderOobleck.from_pretrained(encoders / "audio_vae").eval()
    with av.open(str(clips / f"{stem}.mp4")) as container:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=51200)
        pieces = [f.to_ndarray().reshape(-1) for frame in container.decode(audio=0) for f in resampler.resample(frame)]
        pieces += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    samples = np.concatenate(pieces)[:51200].astype(np.float32) / 32768.0
    seed = int.from_bytes(hashlib.sha256(f"0/{stem}".encode()).digest()[:8], "little") & ((1 << 63) - 1)
    generator = torch.Generator().manual_seed(seed)
    window, step = 20480, 10240
    windows = []
    for start in range(0, 51200, step):
        chunk = np.zeros(window, np.float32)
        piece = samples[start:start + window]
        chunk[:len(piece)] = piece
        with torch.no_grad():
            h = oobleck.encoder(torch.from_numpy(np.stack([chunk, chunk]))[None])[0]
        latent_mean, scale = h[:CA], h[CA:]
        std = torch.nn.functional.softplus(scale) + 1e-4
        noise = torch.randn(latent_mean.shape, generator=generator)
        windows.append((latent_mean + std * noise).T.numpy())
        if start + window >= 51200:
            break
    expected_audio = reference_merge(windows)[:math.ceil(51200 * windows[0].shape[0] / window)]
    got_audio = load_file(prepared / "audio_latents" / f"{stem}.safetensors")["audio_latent"].numpy()
    assert got_audio.shape == expected_audio.shape == (25, CA)
    assert np.abs(got_audio - expected_audio).max() <= 1e-6

    tokenizer = AutoTokenizer.from_pretrained(encoders / "text_encoder")
    encoder = T5GemmaEncoderModel.from_pretrained(encoders / "text_encoder", is_encoder_decoder=False).eval()
    caption = (clips / f"{stem}.txt").read_text().strip()
    with torch.no_grad():
        hidden = encoder(**tokenizer([caption], return_tensors="pt"))["last_hidden_state"].half()[0][:640]
    assert torch.equal(load_file(prepared / "conditions" / f"{stem}.safetensors")["prompt_embeds"], hidden)


# ---------------------------------------------------------------------------------------------
# Bad input: each clip refused by name in prepare.json, the others prepared, nothing partial left.

def test_each_bad_input_is_refused_by_name_and_the_rest_is_prepared(encoders, tmp_path):
    src = tmp_path / "bad"
    src.mkdir()
    good = src / "good.mp4"
    write_clip(good, moving_frames(25))
    cases = {  # stem -> the expected error code, or "ok" with a warning
        "good": "ok", "corrupt": "corrupt_file", "truncated": "corrupt_file",
        "concat": "unsupported_container", "settings": "ok", ".hidden": "bad_file_name",
        "hugecap": "caption_too_large", "silent": "no_audio",
        "short": "too_short", "vfr": "variable_frame_rate", "rotated": "rotated", "strip": "extreme_aspect_ratio",
        "big": "source_too_large", "long": "ok", "emptycap": "empty_caption", "latin1": "caption_not_utf8",
        "longcap": "ok", "nocap": "missing_file", "link": "not_regular_file", "fifo": "not_regular_file",
        "fifocap": "not_regular_file", "dup": "stem_collision",
    }
    (src / "corrupt.mp4").write_bytes(np.random.default_rng(0).integers(0, 256, 20000, dtype=np.uint8).tobytes())
    (src / "truncated.mp4").write_bytes(good.read_bytes()[:len(good.read_bytes()) * 2 // 5])
    # An ffconcat script named .mp4 would open files by path (relative to the working directory),
    # here a FIFO outside --input that would block the whole run: only real containers are opened.
    os.mkfifo(tmp_path / "outside_fifo")
    (src / "concat.mp4").write_text(f"ffconcat version 1.0\nfile '{tmp_path / 'outside_fifo'}'\n")
    (src / "settings.mp4").write_bytes(good.read_bytes())  # a stem that was .records/settings.json's name
    (src / ".hidden.mp4").write_bytes(good.read_bytes())
    write_clip(src / "silent.mp4", moving_frames(25), audio=False)
    write_clip(src / "short.mp4", moving_frames(3))
    write_clip(src / "vfr.mp4", moving_frames(25), pts=[i * 40 + (25 if i % 3 == 1 else 0) for i in range(25)])
    write_clip(src / "rotated.mp4", moving_frames(25), rotation=90)
    write_clip(src / "strip.mp4", moving_frames(25, 32, 320))
    write_clip(src / "big.mp4", moving_frames(10, 256, 384))
    write_clip(src / "long.mp4", moving_frames(50))
    for stem in ("emptycap", "latin1", "longcap", "nocap", "fifocap", "dup", "hugecap"):
        (src / f"{stem}.mp4").write_bytes(good.read_bytes())
    (src / "dup.mkv").write_bytes(good.read_bytes())
    os.symlink(good, src / "link.mp4")
    os.mkfifo(src / "fifo.mp4")
    os.mkfifo(src / "fifocap.txt")
    for stem in cases:
        if stem not in ("nocap", "fifocap"):
            (src / f"{stem}.txt").write_text("A square moves across a wall.")
    (src / "emptycap.txt").write_text("  \n")
    (src / "latin1.txt").write_bytes("caf\u00e9 au lait".encode("latin-1"))
    (src / "hugecap.txt").write_text("a" * 17000)  # over the 16 KiB cap: named as a caption, not a generic file
    (src / "longcap.txt").write_text("a" * 700)  # the fixture's tokenizer: a token a byte, + <bos> <eos>

    out = tmp_path / "out"
    proc = prepare(["--input", str(src), "--out", str(out), *encoder_flags(encoders), "--resolution", f"{H}x{W}",
                    "--max-source-pixels", "20000", "--max-seconds", "1"], check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    summary = json.loads((out / "prepare.json").read_text())
    status = {c["stem"]: (c["status"] if c["status"] == "ok" else c["error"]["code"]) for c in summary["clips"]}
    assert status == cases
    for clip in summary["clips"]:
        for sub in ("latents", "audio_latents", "conditions"):
            assert (out / sub / f"{clip['stem']}.safetensors").exists() == (clip["status"] == "ok"), clip
        if clip["status"] != "ok":
            assert clip["error"]["code"] in proc.stderr  # named in the log as well
    by_stem = {c["stem"]: c for c in summary["clips"]}
    assert by_stem["long"]["frames"] == 25 and by_stem["long"]["warnings"][0].startswith("cut_at_max_seconds")
    assert by_stem["longcap"]["caption_tokens"] == 702 and by_stem["longcap"]["prompt_embeds"] == [640, CT]
    assert by_stem["longcap"]["warnings"][0].startswith("caption_trimmed")
    assert not [p for p in out.rglob("*tmp-*")]
    # The clip named settings did not replace the run's settings: --resume still accepts the directory.
    again = prepare(["--input", str(src), "--out", str(out), *encoder_flags(encoders), "--resolution", f"{H}x{W}",
                     "--max-source-pixels", "20000", "--max-seconds", "1", "--resume"], check=False, timeout=120)
    assert again.returncode == 2 and "resume_mismatch" not in again.stderr, again.stderr[-3000:]


def test_names_and_audio_that_broke_a_whole_run_refuse_one_clip(encoders, tmp_path):
    """A file name that is not UTF-8 (and one with a terminal escape sequence) and an audio track whose
    sample rate changes mid-stream are each refused by name; the other clips are prepared, and the
    names are printed escaped."""
    src = tmp_path / "src"
    src.mkdir()
    write_clip(src / "good.mp4", moving_frames(25))
    (src / "good.txt").write_text("a square")
    raw = os.fsencode(str(src)) + b"/caf\xe9.mp4"
    with open(raw, "wb") as f:
        f.write((src / "good.mp4").read_bytes())
    with open(raw[:-4] + b".txt", "wb") as f:
        f.write(b"a square")
    escape = src / "red\x1b[31m.mp4"
    escape.write_bytes((src / "good.mp4").read_bytes())
    (src / "red\x1b[31m.txt").write_text("a square")
    # Video with a soundtrack whose second half is at another sample rate.
    write_clip(src / "rates.mp4", moving_frames(25), audio=False)
    (src / "rates.txt").write_text("a square")
    # A FLAC soundtrack whose frames switch from 44.1 to 22.05 kHz: the frames of a second stream
    # after the first's (FLAC frames carry their own rate).
    def flac(path, rate):
        with av.open(str(path), mode="w", format="flac") as container:
            stream = container.add_stream("flac", rate=rate, layout="mono")
            frame = av.AudioFrame.from_ndarray((np.sin(np.arange(rate) / 10) * 8000).astype(np.int16)[None],
                                               format="s16", layout="mono")
            frame.sample_rate = rate
            for packet in [*stream.encode(frame), *stream.encode()]:
                container.mux(packet)
        return path.read_bytes()

    def frames_of(data):  # after "fLaC" and the metadata blocks (a 4-byte header each, the last flagged)
        at = 4
        while True:
            last, length = data[at] & 0x80, int.from_bytes(data[at + 1:at + 4], "big")
            at += 4 + length
            if last:
                return data[at:]

    (src / "rates.flac").write_bytes(flac(tmp_path / "a.flac", 44100) + frames_of(flac(tmp_path / "b.flac", 22050)))
    out = tmp_path / "out"
    proc = prepare(["--input", str(src), "--out", str(out), *encoder_flags(encoders), "--resolution", f"{H}x{W}"],
                   check=False, timeout=180)
    assert proc.returncode in (0, 2), proc.stderr[-3000:]
    summary = json.loads((out / "prepare.json").read_text())
    status = {c["stem"]: (c["status"] if c["status"] == "ok" else c["error"]["code"]) for c in summary["clips"]}
    assert status["good"] == "ok" and status["red\x1b[31m"] == "ok"
    assert status["caf\\xe9"] == "bad_file_name"
    assert status["rates"] == "audio_format_changes", summary["clips"]
    assert "\x1b" not in proc.stderr and "red\\x1b[31m" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_media_room_never_imports_from_the_working_directory(encoders, clips, tmp_path):
    """A data set that ships av.py, run from inside it: the room's imports come from its package and
    the venv, never the working directory (python -P)."""
    work = tmp_path / "dataset"
    work.mkdir()
    (work / "av.py").write_text(f"open({str(tmp_path / 'pwned')!r}, 'w').write('ran')\n")
    proc = run_mmtrain(["prepare", "magihuman", "--input", str(clips), "--out", str(tmp_path / "out"),
                        *encoder_flags(encoders), "--resolution", f"{H}x{W}"], cwd=work, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (tmp_path / "pwned").exists()


def test_a_late_start_seeks_and_keeps_only_the_window(tmp_path):
    """Audio 60 s long, a window from 40 s: the seek path gives the samples of a decode from the first
    sample to within one resampled sample (a 1 kHz tone: |diff| <= 2 pi f / rate), and the same length."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
    from mmtrain_py.media import audio as media_audio

    rate = 48000
    t = np.arange(60 * rate) / rate
    tone = (0.3 * np.sin(2 * math.pi * 1000 * t) * 32767).astype(np.int16)
    path = tmp_path / "long.wav"
    with av.open(str(path), mode="w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=rate, layout="mono")
        for s in range(0, len(tone), rate):
            frame = av.AudioFrame.from_ndarray(tone[None, s:s + rate], format="s16", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with av.open(str(path)) as container:
        sought = media_audio.decode_samples(container, 40.0, 2.0, "long.wav")
    lead = media_audio.SEEK_LEAD_SECONDS
    try:
        media_audio.SEEK_LEAD_SECONDS = 1e9  # no seek: every sample from the first
        with av.open(str(path)) as container:
            whole = media_audio.decode_samples(container, 40.0, 2.0, "long.wav")
    finally:
        media_audio.SEEK_LEAD_SECONDS = lead
    assert sought.shape == whole.shape == (2 * 51200,)
    assert (sought - whole).abs().max() <= 0.3 * 2 * math.pi * 1000 / 51200 + 1e-3


def test_a_window_of_partial_latent_frames_is_refused(encoders, clips, tmp_path):
    proc = prepare(["--input", str(clips), "--out", str(tmp_path / "a"), *encoder_flags(encoders),
                    "--audio-window-seconds", "0.3"], check=False, timeout=60)
    assert proc.returncode != 0 and "not a whole number of 2048-sample audio latent frames" in proc.stderr
    assert not (tmp_path / "a").exists()


def test_a_manifest_selects_spans_and_keeps_paths_inside_its_directory(encoders, clips, tmp_path):
    manifest = tmp_path / "clips.jsonl"
    (tmp_path / "media").mkdir()
    for stem in ("clip_000", "clip_001"):
        (tmp_path / "media" / f"{stem}.mp4").write_bytes((clips / f"{stem}.mp4").read_bytes())
    os.symlink(clips, tmp_path / "linked")
    lines = [{"video": "media/clip_000.mp4", "caption": "a span", "start": 0.2, "end": 0.9},
             {"video": "../outside.mp4", "caption": "escapes"},
             {"video": "media/clip_001.mp4", "caption": "", "start": 0},
             {"video": "linked/clip_002.mp4", "caption": "leaves through a linked directory"}]
    manifest.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = tmp_path / "out"
    proc = prepare(["--input", str(manifest), "--out", str(out), *encoder_flags(encoders), "--resolution",
                    f"{H}x{W}"], check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    clips_json = json.loads((out / "prepare.json").read_text())["clips"]
    assert clips_json[0]["status"] == "ok" and clips_json[0]["frames"] == 17  # 0.7 s: 17.5 -> 1 + 4 * 4
    assert clips_json[1]["error"]["code"] == "path_outside_input"
    assert clips_json[2]["error"]["code"] == "empty_caption"
    assert clips_json[3]["error"]["code"] == "path_outside_input"


def test_resume_after_a_kill_finishes_what_one_run_writes(encoders, clips, prepared, tmp_path):
    out = tmp_path / "out"
    args = ["prepare", "magihuman", "--input", str(clips), "--out", str(out), *encoder_flags(encoders),
            "--resolution", f"{H}x{W}", "--audio-window-seconds", "0.4"]
    proc = subprocess.Popen([str(mmtrain_bin()), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    first = out / ".records" / "clips" / "clip_000.json"
    deadline = time.monotonic() + 120
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert first.exists(), proc.stderr.read().decode()[-2000:]
    finished = out / "latents" / "clip_000.safetensors"
    stamp = finished.stat().st_mtime_ns

    refused = run_mmtrain([*args[:-2], "--audio-window-seconds", "0.48", "--resume"], check=False)
    assert refused.returncode == 1 and "audio_window_seconds" in refused.stderr  # a resume never mixes settings

    run_mmtrain([*args, "--resume"])
    assert finished.stat().st_mtime_ns == stamp  # the finished clip was skipped, not redone
    assert files_of(out) == files_of(prepared)
    assert not [p for p in out.rglob("*tmp-*")]
    assert [c["status"] for c in json.loads((out / "prepare.json").read_text())["clips"]] == ["ok"] * 3


def test_decode_gives_mp4s_with_sound_that_encode_to_the_same_shapes(encoders, clips, prepared, tmp_path):
    decoded = tmp_path / "decoded"
    prepare(["--decode", "--input", str(prepared), "--out", str(decoded), "--vae", str(encoders / "vae"),
             "--audio-vae", str(encoders / "audio_vae")])
    for stem in ("clip_000", "clip_001", "clip_002"):
        with av.open(str(decoded / f"{stem}.mp4")) as container:
            frames = [f for f in container.decode(video=0)]
            assert len(frames) == 25 and (frames[0].width, frames[0].height) == (W, H)
        with av.open(str(decoded / f"{stem}.mp4")) as container:
            audio = container.streams.audio[0]
            samples = sum(f.samples for f in container.decode(audio=0))
            assert audio.sample_rate == 44100 and audio.channels == 2
            assert abs(samples / 44100 - 1.0) < 0.05
        (decoded / f"{stem}.txt").write_text((clips / f"{stem}.txt").read_text())
    again = tmp_path / "again"
    prepare(["--input", str(decoded), "--out", str(again), *encoder_flags(encoders), "--resolution", f"{H}x{W}"])
    shapes = [{k: c[k] for k in ("frames", "video_grid_thw", "audio_latent")}
              for c in json.loads((again / "prepare.json").read_text())["clips"]]
    original = [{k: c[k] for k in ("frames", "video_grid_thw", "audio_latent")}
                for c in json.loads((prepared / "prepare.json").read_text())["clips"]]
    assert shapes == original


def test_flags_are_checked_before_any_work(encoders, clips, prepared, tmp_path):
    base = ["--input", str(clips), *encoder_flags(encoders)]
    cases = [
        (["--out", str(tmp_path / "a"), "--resolution", "64x90"], "multiples of 32"),
        (["--out", str(tmp_path / "a"), "--resolution", "64by96"], "expected HxW"),
        (["--out", str(prepared)], "exists; give a new directory (or --resume"),
        (["--out", str(tmp_path / "a"), "--max-seconds", "0"], "--max-seconds must be in (0, 3600]"),
        (["--out", str(tmp_path / "a"), "--vae", str(tmp_path / "nowhere")], "--vae"),
    ]
    for extra, message in cases:
        proc = prepare([*base, *extra], check=False, timeout=60)
        assert proc.returncode != 0 and message in proc.stderr, (extra, proc.stderr)
    assert not (tmp_path / "a").exists()
    proc = prepare(["--decode", "--input", str(clips), "--out", str(tmp_path / "d"), "--vae", str(encoders / "vae"),
                    "--audio-vae", str(encoders / "audio_vae")], check=False, timeout=60)
    assert proc.returncode == 1 and "has no latents/ and audio_latents/" in proc.stderr


def test_decode_skips_a_bad_latent_by_name_and_resume_compares_the_input(encoders, clips, prepared, tmp_path):
    """--decode: a latent file that is not safetensors is named and skipped, the others decoded (exit 2),
    and --out appears only whole (built as a hidden sibling). --resume refuses another --input whose clips
    have the same stems (they would be skipped as done)."""
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(prepared, copy)
    (copy / "latents" / "clip_001.safetensors").write_bytes(b"not safetensors")
    decoded = tmp_path / "decoded"
    proc = prepare(["--decode", "--input", str(copy), "--out", str(decoded), "--vae", str(encoders / "vae"),
                    "--audio-vae", str(encoders / "audio_vae")], check=False)
    assert proc.returncode == 2 and "clip_001: failed (corrupt_file)" in proc.stderr, proc.stderr[-2000:]
    assert sorted(p.name for p in decoded.iterdir()) == ["clip_000.mp4", "clip_002.mp4"]
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]

    other = tmp_path / "other_clips"
    shutil.copytree(clips, other)
    proc = prepare(["--input", str(other), "--out", str(prepared), *encoder_flags(encoders), "--resolution", f"{H}x{W}",
                    "--audio-window-seconds", "0.4", "--resume"], check=False)
    assert proc.returncode == 1 and "was prepared with input" in proc.stderr, proc.stderr[-2000:]


def test_hostile_json_and_dash_paths_end_in_named_errors(encoders, clips, prepared, tmp_path):
    """A manifest line nested 100,000 deep, an encoder config with z_dim 1e400, a settings.json that is a
    list: each a named error, never a traceback. A path starting with '-' reaches the room as a path."""
    import shutil
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100000 + "]" * 100000 + "\n")
    proc = prepare(["--input", str(deep), "--out", str(tmp_path / "a"), *encoder_flags(encoders)], check=False)
    assert proc.returncode == 1 and "nested deeper than 64 levels" in proc.stderr and "Traceback" not in proc.stderr

    vae = tmp_path / "vae"
    shutil.copytree(encoders / "vae", vae)
    config = json.loads((vae / "config.json").read_text())
    (vae / "config.json").write_text(json.dumps(config).replace(f'"z_dim": {config["z_dim"]}', '"z_dim": 1e400'))
    flags = encoder_flags(encoders)
    flags[flags.index("--vae") + 1] = str(vae)
    proc = prepare(["--input", str(clips), "--out", str(tmp_path / "b"), *flags], check=False)
    assert proc.returncode == 1 and "is not finite" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr

    listed = tmp_path / "listed"
    shutil.copytree(prepared, listed)
    (listed / ".records" / "settings.json").write_text("[1, 2]\n")
    proc = prepare(["--input", str(clips), "--out", str(listed), *encoder_flags(encoders), "--resolution", f"{H}x{W}",
                    "--audio-window-seconds", "0.4", "--resume"], check=False)
    assert proc.returncode == 1 and "expected a JSON object, found list" in proc.stderr, proc.stderr[-2000:]

    dashed = tmp_path / "-clips"
    shutil.copytree(clips, dashed)
    proc = run_mmtrain(["prepare", "magihuman", "--input", "-clips", "--out", "-out", *encoder_flags(encoders),
                        "--resolution", f"{H}x{W}"], cwd=tmp_path, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list((tmp_path / "-out" / "latents").iterdir())) == 3


def test_under_torchrun_refused_clips_end_the_run_cleanly(encoders, clips, tmp_path):
    """Status 2 under torchrun read as a failed rank: a ChildFailedError and the other ranks SIGTERMed.
    Every rank finishes, rank 0 writes prepare.json, and every rank exits 0, saying what was refused."""
    import shutil
    src = tmp_path / "clips"
    shutil.copytree(clips, src)
    (src / "clip_001.txt").write_text(" \n")
    proc = prepare(["--input", str(src), "--out", str(tmp_path / "out"), *encoder_flags(encoders), "--resolution",
                    f"{H}x{W}"], world=2, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ChildFailedError" not in proc.stderr and "SIGTERM" not in proc.stderr
    assert "1 clip(s) refused; under torchrun the exit status is 0" in proc.stderr
    status = [c["status"] for c in json.loads((tmp_path / "out" / "prepare.json").read_text())["clips"]]
    assert status == ["ok", "error", "ok"]
