"""Peak memory and time of `mmtrain prepare magihuman` on one 5 s 256x480 clip, with the full-size
VAE architectures (Wan2.2-TI2V-5B's VAE config, Stable Audio Open's VAE config) holding random
weights (weights change no memory figure) and the fixture's tiny text encoder at 3584 wide.
The T5Gemma encoder's own memory is its weights (docs/prepare.md counts them).

    .venv/bin/python bench/prepare_memory.py [--seconds 5] [--resolution 256x480]

Prints the figures; the last line is JSON. About 5 minutes on 2 CPU cores.
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan, AutoencoderOobleck

REPO = Path(__file__).resolve().parents[1]
MMTRAIN = REPO / "build" / "bin" / "mmtrain"

# Wan2.2-TI2V-5B-Diffusers vae/config.json (the tables equal upstream's Wan2_2_VAE).
WAN22_MEAN = [-0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
              0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
              -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723,
              -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667]
WAN22_STD = [0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901, 0.6885,
             0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659, 0.7069, 0.5338,
             0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458,
             1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744]


def mmtrain(*args):
    subprocess.run([str(MMTRAIN), *args], check=True, stdout=subprocess.DEVNULL)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--resolution", default="256x480")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        torch.manual_seed(0)
        AutoencoderKLWan(base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                         temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
                         patch_size=2, scale_factor_temporal=4, scale_factor_spatial=16, latents_mean=WAN22_MEAN,
                         latents_std=WAN22_STD).save_pretrained(tmp / "vae")
        AutoencoderOobleck(encoder_hidden_size=128, downsampling_ratios=[2, 4, 4, 8, 8],
                           channel_multiples=[1, 2, 4, 8, 16], decoder_channels=128, decoder_input_channels=64,
                           audio_channels=2, sampling_rate=44100).save_pretrained(tmp / "audio_vae")
        (tmp / "full.yaml").write_text("model:\n  model_id: magihuman\n  config: {}\n")
        mmtrain("fixture", "magihuman-encoders", "--out", str(tmp / "enc"), "--config", str(tmp / "full.yaml"))
        mmtrain("fixture", "clips", "--out", str(tmp / "clips"), "--count", "1", "--seconds", str(args.seconds),
                "--size", args.resolution)
        proc = subprocess.run(["/usr/bin/time", "-v", str(MMTRAIN), "prepare", "magihuman", "--input",
                               str(tmp / "clips"), "--out", str(tmp / "prep"), "--vae", str(tmp / "vae"),
                               "--audio-vae", str(tmp / "audio_vae"), "--text-encoder",
                               str(tmp / "enc" / "text_encoder"), "--resolution", args.resolution],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(proc.stderr[-3000:])
        peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
        wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", proc.stderr).group(1)
        clip = json.loads((tmp / "prep" / "prepare.json").read_text())["clips"][0]
    parts = [float(x) for x in wall.split(":")]
    seconds = sum(v * 60 ** i for i, v in enumerate(reversed(parts)))
    print(f"peak RSS {peak_kb / 1e6:.2f} GB, {seconds:.0f} s; video {clip['video_latent']} grid "
          f"{clip['video_grid_thw']} audio {clip['audio_latent']}")
    print(json.dumps({"bench": "prepare_memory", "seconds": args.seconds, "resolution": args.resolution,
                      "peak_rss_gb": round(peak_kb / 1e6, 3), "wall_s": round(seconds, 1),
                      "video_latent": clip["video_latent"], "video_grid_thw": clip["video_grid_thw"],
                      "audio_latent": clip["audio_latent"]}))


if __name__ == "__main__":
    main()
