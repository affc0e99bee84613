"""Fixtures, so prepare and decode run without downloads (`mmtrain fixture magihuman-encoders | clips`).

encoders: tiny random-weight models of the real classes, each loadable by its library's
from_pretrained: DIR/vae (diffusers AutoencoderKLWan in the Wan2.2 layout: residual, patch 2,
stride 4x16x16), DIR/audio_vae (diffusers AutoencoderOobleck with the 2048x downsampling) and
DIR/text_encoder (transformers T5GemmaEncoderModel with a byte-level tokenizer). Their widths are
the model config's: video_in_channels = 4 z (a z-channel latent patchified 1x2x2), audio_in_channels
= the Oobleck latent, text_in_channels = the encoder's hidden size.

clips: synthetic talking-head stand-ins: a textured background with a square moving across it,
and a tone (a different pitch per clip) on a stereo AAC track, with a caption beside each.
"""

import argparse
import math
import os
import sys

import numpy as np
import torch

from . import mp4
from .files import InputError, make_dir, write_atomic


def parse(argv):
    p = argparse.ArgumentParser(prog="mmtrain fixture", description="flags are parsed by mmtrain")
    sub = p.add_subparsers(dest="what", required=True)
    e = sub.add_parser("encoders")
    e.add_argument("--out", required=True)
    e.add_argument("--video-channels", type=int, required=True)
    e.add_argument("--audio-channels", type=int, required=True)
    e.add_argument("--text-channels", type=int, required=True)
    e.add_argument("--seed", type=int, required=True)
    c = sub.add_parser("clips")
    c.add_argument("--out", required=True)
    c.add_argument("--count", type=int, required=True)
    c.add_argument("--seconds", type=float, required=True)
    c.add_argument("--height", type=int, required=True)
    c.add_argument("--width", type=int, required=True)
    c.add_argument("--seed", type=int, required=True)
    return p.parse_args(argv)


def byte_tokenizer():
    """A byte-level tokenizer (256 byte tokens + <pad> <eos> <bos> <unk>): any UTF-8 caption
    encodes, one token a byte, with <bos> ... <eos> around it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", vocab["<bos>"]), ("<eos>", vocab["<eos>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", unk_token="<unk>")


def write_encoders(out, video_channels, audio_channels, text_channels, seed):
    from diffusers import AutoencoderKLWan, AutoencoderOobleck
    from transformers import T5GemmaConfig
    from transformers.models.t5gemma import T5GemmaEncoderModel

    if video_channels % 4:
        raise InputError("bad_width", f"video channels {video_channels} must be 4 z (a z-channel latent patchified 1x2x2)")
    if os.path.lexists(out):
        raise InputError("output_exists", f"--out {out} exists; give a new directory")
    torch.manual_seed(seed)
    z = video_channels // 4
    rng = np.random.default_rng(seed)
    vae = AutoencoderKLWan(base_dim=8, decoder_base_dim=8, z_dim=z, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
                           temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
                           patch_size=2, scale_factor_temporal=4, scale_factor_spatial=16,
                           latents_mean=[round(float(v), 4) for v in rng.normal(0, 0.2, z)],
                           latents_std=[round(float(v), 4) for v in rng.uniform(0.4, 1.6, z)])
    audio_vae = AutoencoderOobleck(encoder_hidden_size=2 * audio_channels, downsampling_ratios=[2, 4, 4, 8, 8],
                                   channel_multiples=[1, 2, 2, 2, 2], decoder_channels=8,
                                   decoder_input_channels=audio_channels, audio_channels=2, sampling_rate=51200)
    tokenizer = byte_tokenizer()
    heads, head_dim = 2, 8
    module = dict(vocab_size=len(tokenizer), hidden_size=text_channels, intermediate_size=2 * text_channels,
                  num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=1, head_dim=head_dim,
                  query_pre_attn_scalar=head_dim, sliding_window=64, max_position_embeddings=4096,
                  layer_types=["sliding_attention", "full_attention"], pad_token_id=0, eos_token_id=1, bos_token_id=2)
    config = T5GemmaConfig(encoder=module, decoder=dict(module), vocab_size=len(tokenizer), is_encoder_decoder=False)
    text_encoder = T5GemmaEncoderModel(config)
    make_dir(out)
    vae.save_pretrained(os.path.join(out, "vae"), safe_serialization=True)
    audio_vae.save_pretrained(os.path.join(out, "audio_vae"), safe_serialization=True)
    text_encoder.save_pretrained(os.path.join(out, "text_encoder"), safe_serialization=True)
    tokenizer.save_pretrained(os.path.join(out, "text_encoder"))
    print(f"wrote {out}/vae, {out}/audio_vae, {out}/text_encoder (video {video_channels}, audio {audio_channels}, "
          f"text {text_channels} channels)")


def clip_frames(index, seconds, height, width, fps, rng):
    """[F, H, W, 3] uint8: fixed texture, a square crossing left to right, its colour per clip."""
    count = round(seconds * fps)
    texture = rng.integers(0, 96, size=(height, width, 3), dtype=np.uint8)
    ys = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    background = (texture + np.stack([ys.repeat(width, 1)] * 3, -1) * 0.5).clip(0, 255).astype(np.uint8)
    side = max(4, min(height, width) // 3)
    colour = np.array([(80 * index) % 256, 200, (255 - 60 * index) % 256], dtype=np.uint8)
    frames = np.repeat(background[None], count, axis=0)
    for i in range(count):
        x = int((width - side) * i / max(1, count - 1))
        y = (height - side) // 2
        frames[i, y:y + side, x:x + side] = colour
    return frames


def clip_sound(seconds, tone_hz, rate=44100):
    """[2, n] fp32: a steady sine at 0.3 amplitude on both channels."""
    t = np.arange(int(seconds * rate)) / rate
    tone = (0.3 * np.sin(2 * math.pi * tone_hz * t)).astype(np.float32)
    return np.stack([tone, tone])


def write_clips(out, count, seconds, height, width, seed):
    if os.path.lexists(out):
        raise InputError("output_exists", f"--out {out} exists; give a new directory")
    make_dir(out)
    rng = np.random.default_rng(seed)
    for index in range(count):
        stem = f"clip_{index:03d}"
        tone = 220.0 * (1 + index)
        frames = clip_frames(index, seconds, height, width, 25, rng)
        mp4.write(os.path.join(out, stem + ".mp4"), frames, 25, clip_sound(frames.shape[0] / 25, tone), 44100, crf=10)
        caption = (f"A synthetic clip: a coloured square slides from left to right across a textured wall "
                   f"while a steady {tone:.0f} Hz tone plays.")
        write_atomic(os.path.join(out, stem + ".txt"), (caption + "\n").encode())
    print(f"wrote {count} clips ({seconds} s, {width}x{height}, 25 fps, with sound) to {out}")


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        if args.what == "encoders":
            write_encoders(args.out, args.video_channels, args.audio_channels, args.text_channels, args.seed)
        else:
            write_clips(args.out, args.count, args.seconds, args.height, args.width, args.seed)
        return 0
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
