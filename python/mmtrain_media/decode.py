"""`mmtrain prepare magihuman --decode`: the magihuman_precomputed layout back to mp4s with sound.

Each stem in latents/ with its audio_latents/ file becomes OUT/<stem>.mp4: the video tokens
unpatchified and decoded by the Wan2.2 VAE, the audio latents by the Oobleck VAE and resampled to
44.1 kHz, muxed by PyAV (H.264 + AAC). `mmtrain sample` decodes its latents the same way.
"""

import argparse
import os
import secrets
import sys

import av
import numpy as np
import torch
from safetensors import safe_open

from . import audio, video
from .files import InputError, make_dir, open_regular

MAX_LATENT_BYTES = 1 << 32
AUDIO_RATE_OUT = 44100
AAC_FRAME = 1024  # samples per AAC frame


def parse(argv):
    p = argparse.ArgumentParser(prog="mmtrain prepare magihuman --decode", description="flags are parsed by mmtrain")
    for name in ("--input", "--out", "--vae", "--audio-vae", "--device", "--dtype"):
        p.add_argument(name, required=True)
    p.add_argument("--fps", type=int, required=True)
    return p.parse_args(argv)


def read_tensors(path, keys):
    """The named tensors of a safetensors file the user gave: a regular file, its header parsed by
    the safetensors library (which caps it), each key required."""
    with open_regular(path, "latents", MAX_LATENT_BYTES):
        pass
    try:
        with safe_open(path, framework="pt") as f:
            missing = [k for k in keys if k not in f.keys()]
            if missing:
                raise InputError("missing_key", f"{path}: no '{missing[0]}' (it holds {sorted(f.keys())})")
            return [f.get_tensor(k) for k in keys]
    except (OSError, RuntimeError, ValueError) as error:  # what safetensors raises for a bad file
        raise InputError("corrupt_file", f"{path}: not a safetensors file ({error})") from None


def mux(path, frames, fps, stereo, rate):
    """frames [F, H, W, 3] uint8 and stereo [2, n] fp32 -> an H.264 + AAC mp4 at `path`, written to
    a new temporary file (never through a link) and renamed into place when whole."""
    if os.path.lexists(path):
        raise InputError("output_exists", f"{path} exists; mmtrain never overwrites an output")
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.tmp-{secrets.token_hex(6)}")
    fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w+b") as f, av.open(f, mode="w", format="mp4") as container:
            v = container.add_stream("libx264", rate=fps)
            v.width, v.height, v.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
            v.options = {"crf": "18"}
            a = container.add_stream("aac", rate=rate, layout="stereo")
            for frame in frames:
                container.mux(v.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            container.mux(v.encode())
            samples = np.clip(stereo, -1, 1).astype(np.float32)
            for start in range(0, samples.shape[1], AAC_FRAME):
                chunk = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, start:start + AAC_FRAME]),
                                                   format="fltp", layout="stereo")
                chunk.sample_rate, chunk.pts = rate, start
                container.mux(a.encode(chunk))
            container.mux(a.encode())
        os.rename(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def run(args):
    from diffusers import AutoencoderKLWan, AutoencoderOobleck

    latents_dir = os.path.join(args.input, "latents")
    audio_dir = os.path.join(args.input, "audio_latents")
    if not os.path.isdir(latents_dir) or not os.path.isdir(audio_dir):
        raise InputError("not_precomputed", f"--input {args.input} has no latents/ and audio_latents/ "
                         "(the layout `mmtrain prepare magihuman` writes)")
    stems = sorted(name[:-len(".safetensors")] for name in os.listdir(latents_dir) if name.endswith(".safetensors"))
    if not stems:
        raise InputError("no_clips", f"{latents_dir} holds no .safetensors files")
    if os.path.lexists(args.out):
        raise InputError("output_exists", f"--out {args.out} exists; give a new directory")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    video_vae = AutoencoderKLWan.from_pretrained(args.vae, torch_dtype=dtype, local_files_only=True,
                                                 use_safetensors=True).to(args.device).eval()
    audio_vae = AutoencoderOobleck.from_pretrained(args.audio_vae, torch_dtype=torch.float32, local_files_only=True,
                                                   use_safetensors=True).to(args.device).eval()
    make_dir(args.out)
    for index, stem in enumerate(stems, start=1):
        tokens, grid = read_tensors(os.path.join(latents_dir, stem + ".safetensors"), ["video_latent", "video_grid_thw"])
        (audio_latent,) = read_tensors(os.path.join(audio_dir, stem + ".safetensors"), ["audio_latent"])
        frames = video.decode(video_vae, video.unpatchify(tokens.float(), grid.tolist()), dtype)
        stereo = audio.decode(audio_vae, audio_latent.float(), AUDIO_RATE_OUT)
        out = os.path.join(args.out, stem + ".mp4")
        mux(out, frames, args.fps, stereo, AUDIO_RATE_OUT)
        print(f"decode: {index}/{len(stems)} {out}: {frames.shape[0]} frames {frames.shape[2]}x{frames.shape[1]}, "
              f"{stereo.shape[1] / AUDIO_RATE_OUT:.2f} s of audio", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
