"""`mmtrain prepare magihuman --decode`: the magihuman_precomputed layout back to mp4s with sound
(and, with --beside, `mmtrain sample`'s latents to an mp4 beside each).

Each stem in latents/ with its audio_latents/ file becomes OUT/<stem>.mp4: the video tokens
unpatchified and decoded by the Wan2.2 VAE, the audio latents by the Oobleck VAE and resampled to
44.1 kHz, muxed by PyAV (H.264 + AAC). `mmtrain sample` decodes its latents the same way.

A latent file that cannot be decoded is named and skipped; the others are decoded, and the exit
status is then 2. OUT is built as a hidden sibling and renamed into place when every sample has
been tried, so an interrupted decode leaves no OUT to block its rerun (with --beside the files go
beside the latents, each written atomically).
"""

import argparse
import io
import os
import secrets
import shutil
import sys
import wave

import numpy as np
import torch
from PIL import Image
from safetensors import SafetensorError
from safetensors.torch import load as safetensors_load

from . import audio, mp4, video
from .files import InputError, make_dir, open_regular, say, write_atomic

MAX_LATENT_BYTES = 1 << 32
AUDIO_RATE_OUT = 44100
EXIT_SOME_FAILED = 2


def parse(argv):
    p = argparse.ArgumentParser(prog="mmtrain prepare magihuman --decode", description="flags are parsed by mmtrain")
    for name in ("--input", "--out", "--vae", "--audio-vae", "--device", "--dtype"):
        p.add_argument(name, required=True)
    p.add_argument("--fps", type=int, required=True)
    p.add_argument("--beside", action="store_true",
                   help="--input holds `mmtrain sample`'s <index>.safetensors: write <index>.mp4 beside each")
    p.add_argument("--previews", action="store_true",
                   help="also <stem>.grid.png (8 frames, 2 x 4) and <stem>.wav (16-bit), what TensorBoard shows")
    return p.parse_args(argv)


def read_tensors(path, keys):
    """The named tensors of a safetensors file the user gave: a regular file, read through the
    descriptor that was checked and parsed by the safetensors library (which caps its header),
    each key required."""
    with open_regular(path, "latents", MAX_LATENT_BYTES) as f:
        data = f.read()
    try:
        tensors = safetensors_load(data)
    except (SafetensorError, OSError, RuntimeError, ValueError) as error:
        raise InputError("corrupt_file", f"{path}: not a safetensors file ({error})") from None
    missing = [k for k in keys if k not in tensors]
    if missing:
        raise InputError("missing_key", f"{path}: no '{missing[0]}' (it holds {sorted(tensors)})")
    return [tensors[k] for k in keys]


def frame_grid(frames, rows=2, cols=4):
    """[F, H, W, 3] uint8 -> one [rows H, cols W, 3] image of rows * cols frames evenly spread."""
    count = frames.shape[0]
    picks = [round(i * (count - 1) / max(1, rows * cols - 1)) for i in range(rows * cols)]
    tiles = [frames[i] for i in picks]
    return np.concatenate([np.concatenate(tiles[r * cols:(r + 1) * cols], axis=1) for r in range(rows)], axis=0)


def write_previews(stem_path, frames, stereo, rate):
    """stem.grid.png and stem.wav (16-bit PCM), each written atomically."""
    image = io.BytesIO()
    Image.fromarray(frame_grid(frames)).save(image, format="PNG")
    write_atomic(stem_path + ".grid.png", image.getvalue())
    sound = io.BytesIO()
    with wave.open(sound, "wb") as w:
        w.setnchannels(stereo.shape[0])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(stereo.T, -1, 1) * 32767).astype("<i2").tobytes())
    write_atomic(stem_path + ".wav", sound.getvalue())


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except InputError as error:
        say(f"error: {error}")
        return 1


def sources(args):
    """(stem, video file, audio file) for each sample: the prepared layout's latents/ and
    audio_latents/, or with --beside one file per sample holding both."""
    if args.beside:
        names = sorted(n for n in os.listdir(args.input) if n.endswith(".safetensors") and not n.startswith("."))
        return [(n[:-len(".safetensors")], os.path.join(args.input, n), os.path.join(args.input, n)) for n in names]
    latents_dir = os.path.join(args.input, "latents")
    audio_dir = os.path.join(args.input, "audio_latents")
    if not os.path.isdir(latents_dir) or not os.path.isdir(audio_dir):
        raise InputError("not_precomputed", f"--input {args.input} has no latents/ and audio_latents/ "
                         "(the layout `mmtrain prepare magihuman` writes)")
    stems = sorted(name[:-len(".safetensors")] for name in os.listdir(latents_dir) if name.endswith(".safetensors"))
    return [(stem, os.path.join(latents_dir, stem + ".safetensors"), os.path.join(audio_dir, stem + ".safetensors"))
            for stem in stems]


def run(args):
    from diffusers import AutoencoderKLWan, AutoencoderOobleck

    samples = sources(args)
    if not samples:
        raise InputError("no_clips", f"{args.input} holds no latents (.safetensors files)")
    if not args.beside and os.path.lexists(args.out):
        raise InputError("output_exists", f"--out {args.out} exists; give a new directory")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    video_vae = AutoencoderKLWan.from_pretrained(args.vae, torch_dtype=dtype, local_files_only=True,
                                                 use_safetensors=True).to(args.device).eval()
    audio_vae = AutoencoderOobleck.from_pretrained(args.audio_vae, torch_dtype=torch.float32, local_files_only=True,
                                                   use_safetensors=True).to(args.device).eval()
    if args.beside:
        failed = decode_all(args, samples, args.out, video_vae, audio_vae, dtype)
    else:
        parent, name = os.path.split(os.path.abspath(args.out))
        building = os.path.join(parent, f".{name}.partial-{secrets.token_hex(6)}")
        make_dir(building)
        try:
            failed = decode_all(args, samples, building, video_vae, audio_vae, dtype)
            if os.path.lexists(args.out):
                raise InputError("output_exists", f"--out {args.out} appeared while decoding; mmtrain never overwrites")
            os.rename(building, args.out)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    if failed:
        say(f"decode: {len(samples) - failed} of {len(samples)} decoded; {failed} failed (named above)")
        return EXIT_SOME_FAILED
    return 0


def decode_all(args, samples, out_dir, video_vae, audio_vae, dtype):
    """Decodes each sample into out_dir; returns how many failed (each named on stderr)."""
    failed = 0
    for index, (stem, video_file, audio_file) in enumerate(samples, start=1):
        out = os.path.join(out_dir, stem + ".mp4")
        try:
            tokens, grid = read_tensors(video_file, ["video_latent", "video_grid_thw"])
            (audio_latent,) = read_tensors(audio_file, ["audio_latent"])
            if grid.dim() != 1 or grid.numel() != 3 or tokens.dim() != 2 or audio_latent.dim() != 2:
                raise InputError("bad_latent", f"{video_file}: video_latent {list(tokens.shape)}, video_grid_thw "
                                 f"{list(grid.shape)}, audio_latent {list(audio_latent.shape)}: expected [N, C], [3], "
                                 "[Na, C]")
            if not (torch.isfinite(tokens.float()).all() and torch.isfinite(audio_latent.float()).all()):
                raise InputError("bad_latent", f"{video_file}: the latents hold NaN or Inf")
            frames = video.decode(video_vae, video.unpatchify(tokens.float(), grid.tolist()), dtype)
            stereo = audio.decode(audio_vae, audio_latent.float(), AUDIO_RATE_OUT)
            mp4.write(out, frames, args.fps, stereo, AUDIO_RATE_OUT)
            if args.previews:
                write_previews(os.path.join(out_dir, stem), frames, stereo, AUDIO_RATE_OUT)
        except (MemoryError, KeyboardInterrupt):
            raise
        except Exception as error:  # ours (InputError), or the decoders' refusal of a latent of the wrong width
            failed += 1
            why = f"({error.code})" if isinstance(error, InputError) else f"{type(error).__name__}:"
            say(f"decode: {index}/{len(samples)} {stem}: failed {why} {error}")
            continue
        say(f"decode: {index}/{len(samples)} {os.path.join(args.out, stem + '.mp4')}: {frames.shape[0]} frames "
            f"{frames.shape[2]}x{frames.shape[1]}, {stereo.shape[1] / AUDIO_RATE_OUT:.2f} s of audio")
    return failed


if __name__ == "__main__":
    sys.exit(main())
