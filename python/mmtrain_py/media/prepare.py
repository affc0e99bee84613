"""`mmtrain prepare magihuman`: clips in, the magihuman_precomputed layout out (docs/prepare.md).

    OUT/latents/<stem>.safetensors        video_latent [Nv, 4z] fp32, video_grid_thw [3] int64
    OUT/audio_latents/<stem>.safetensors  audio_latent [Na, C] fp32
    OUT/conditions/<stem>.safetensors     prompt_embeds [Nt <= 640, hidden] fp16
    OUT/prepare.json                      the encoders, the settings, and per clip what was made or why not
    OUT/.records/settings.json            the settings (what --resume compares)
    OUT/.records/clips/<stem>.json        one record per finished clip (what --resume reads)

Captions are encoded first and the text encoder freed, then the clips go through the two VAEs,
so the 9B text encoder and the VAEs never share the device. Under torchrun clip i goes to rank
i % world; each clip's noise comes from (--seed, its stem), so the output does not depend on the
world size. A clip is complete when its record says ok and its three files exist.
"""

import argparse
import hashlib
import os
import sys
import time

import torch

from . import audio, spec, text, video
from .clips import find_clips
from .container import open_container
from .files import InputError, make_dir, open_regular, parse_json, printable, read_json, read_json_object, \
    read_regular, remove_quietly, say, utf8_safe_tree, write_json, write_safetensors

OUTPUT_DIRS = {"video": "latents", "audio": "audio_latents", "text": "conditions"}
FORMAT = "mmtrain prepare magihuman v2"  # v2: clip records under .records/clips/
EXIT_SOME_REFUSED = 2


def parse(argv):
    p = argparse.ArgumentParser(prog="mmtrain prepare magihuman", description="flags are parsed by mmtrain")
    for name in ("--input", "--out", "--vae", "--audio-vae", "--text-encoder", "--device", "--dtype", "--text-device"):
        p.add_argument(name, required=True)
    p.add_argument("--height", type=int, required=True)
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--fps", type=int, required=True)
    p.add_argument("--max-seconds", type=float, required=True)
    p.add_argument("--max-source-pixels", type=int, required=True)
    p.add_argument("--audio-window-seconds", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--vae-tiling", action="store_true")
    p.add_argument("--resume", action="store_true")
    return p.parse_args(argv)


def dtype_of(name):
    return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]


MAX_CHANNELS = 1 << 16  # an encoder width above this is not a real model's
ENCODERS = (("vae", "--vae"), ("audio_vae", "--audio-vae"), ("text_encoder", "--text-encoder"))


def encoder_settings(args):
    """(encoders, channels): each encoder's path and the SHA-256 of its config.json, and the token
    widths the three give (what model.config's video_in_channels, audio_in_channels and
    text_in_channels must equal), each config.json read once."""
    encoders, configs = {}, {}
    for name, flag in ENCODERS:
        path = os.path.join(getattr(args, name), "config.json")
        data = read_regular(path, f"{flag} config", 1 << 20, follow_links=True)
        encoders[name] = {"path": os.path.abspath(getattr(args, name)), "config_sha256": hashlib.sha256(data).hexdigest()}
        configs[name] = parse_json(data, f"{flag} config {path}")
    try:
        widths = {"video": (configs["vae"]["z_dim"], 4),
                  "audio": (configs["audio_vae"]["decoder_input_channels"], 1),
                  "text": (configs["text_encoder"]["encoder"]["hidden_size"], 1)}
    except (KeyError, TypeError) as error:
        raise InputError("bad_encoder", f"an encoder's config.json lacks {error} (is it the right model?)") from None
    channels = {}
    for kind, (value, factor) in widths.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CHANNELS:
            raise InputError("bad_encoder", f"the {kind} encoder's config.json gives a width of {value!r}, expected "
                             f"an integer in [1, {MAX_CHANNELS}]")
        channels[kind] = factor * value
    return encoders, channels


def clip_seed(seed, stem):
    """The clip's own noise seed: the audio posterior's sample depends on (--seed, stem) alone."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{stem}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


class Progress:
    """One line on stderr per clip (rewritten in place on a terminal): done/total, clips/s, ETA."""

    def __init__(self, total, enabled):
        self.total, self.enabled, self.done, self.started = total, enabled, 0, time.monotonic()
        self.tty = sys.stderr.isatty()

    def step(self, stem, status):
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        line = f"prepare: {self.done}/{self.total} clips  {rate:.2f} clips/s  ETA {eta:.0f} s  {printable(stem)}: {status}"
        print(("\r" + line + "\033[K") if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)
        if self.tty and self.done == self.total:
            print(file=sys.stderr)


class Run:
    def __init__(self, args):
        self.args = args
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.records = os.path.join(args.out, ".records")
        self.clip_records = os.path.join(self.records, "clips")  # a namespace of stems only
        self.dtype = dtype_of(args.dtype)

    def barrier(self):
        if self.world > 1:
            torch.distributed.barrier()

    def path(self, kind, stem):
        return os.path.join(self.args.out, OUTPUT_DIRS[kind], stem + ".safetensors")

    def settings(self):
        a = self.args
        encoders, channels = encoder_settings(a)
        return {"format": FORMAT, "resolution": [a.height, a.width], "fps": a.fps, "max_seconds": a.max_seconds,
                "dtype": a.dtype, "seed": a.seed, "audio_window_seconds": a.audio_window_seconds,
                "vae_tiling": a.vae_tiling, "input": os.path.realpath(a.input), "sample_rate": spec.AUDIO_SAMPLE_RATE,
                "text_tokens": spec.TEXT_TOKENS,
                "encoders": encoders, "channels": channels}

    def open_output(self, settings):
        """Rank 0 creates OUT (refused when it exists without --resume) or checks a resumed one's settings."""
        out = self.args.out
        if self.rank == 0:
            if os.path.lexists(out) and not self.args.resume:
                raise InputError("output_exists", f"--out {out} exists; give a new directory, or --resume to finish it")
            if self.args.resume and os.path.lexists(out):
                before = read_json_object(os.path.join(self.records, "settings.json"),
                                          "--resume: the earlier run's settings")
                stored = utf8_safe_tree(settings)  # as settings.json holds them
                changed = [k for k in settings if before.get(k) != stored[k]]
                if changed:
                    k = changed[0]
                    raise InputError("resume_mismatch", f"--resume: {out} was prepared with {k} = {before.get(k)}, "
                                     f"this run has {settings[k]}; use a new --out")
            make_dir(out)
            for sub in list(OUTPUT_DIRS.values()) + [".records", os.path.join(".records", "clips")]:
                make_dir(os.path.join(out, sub))
                for name in os.listdir(os.path.join(out, sub)):  # a killed run's half-written files
                    if name.startswith(".") and ".tmp-" in name:
                        remove_quietly(os.path.join(out, sub, name))
            settings_path = os.path.join(self.records, "settings.json")
            if not os.path.lexists(settings_path):
                write_json(settings_path, settings)
        self.barrier()

    def record_path(self, stem):
        return os.path.join(self.clip_records, stem + ".json")

    def complete(self, stem):
        try:
            record = read_json(self.record_path(stem), "record")
        except InputError:
            return None
        if record.get("status") != "ok" or not all(os.path.isfile(self.path(k, stem)) for k in OUTPUT_DIRS):
            return None
        return record

    def refuse(self, clip, error, record):
        for kind in OUTPUT_DIRS:
            remove_quietly(self.path(kind, clip.stem))
        record.update(status="error", error={"code": error.code, "message": str(error)})
        say(f"prepare: {clip.stem}: refused ({error.code}): {error}")
        write_json(self.record_path(clip.stem), record, replace=True)

    def encode_captions(self, clips, records):
        encoder = text.TextEncoder(self.args.text_encoder, self.args.text_device, self.dtype)
        for clip in clips:
            embedding, tokens = encoder.encode(clip.caption)
            record = records[clip.stem]
            record["caption_tokens"] = tokens
            record["prompt_embeds"] = list(embedding.shape)
            if tokens > spec.TEXT_TOKENS:
                record["warnings"].append(f"caption_trimmed: {tokens} tokens, the first {spec.TEXT_TOKENS} kept")
                say(f"prepare: {clip.stem}: warning: the caption's {tokens} tokens are trimmed to {spec.TEXT_TOKENS}")
            write_safetensors(self.path("text", clip.stem), {"prompt_embeds": embedding}, replace=True)
        encoder.offload()

    def encode_clip(self, clip, record, video_vae, audio_vae):
        a = self.args
        end = clip.start + a.max_seconds if clip.end is None else min(clip.end, clip.start + a.max_seconds)
        with open_regular(clip.video, "video", None) as f:
            container = open_container(f, clip.video)
            with container:
                if container.streams.video:
                    s = container.streams.video[0]
                    if s.width * s.height > a.max_source_pixels:
                        raise InputError("source_too_large", f"{clip.video}: {s.width}x{s.height} exceeds "
                                         f"--max-source-pixels {a.max_source_pixels}")
                frames = video.decode_frames(container, a.height, a.width, a.fps, clip.start, end,
                                             a.max_source_pixels, clip.video)
        seconds = len(frames) / a.fps
        if (clip.end is None or clip.end > end) and len(frames) == video.frame_count(int(a.max_seconds * a.fps)):
            record["warnings"].append(f"cut_at_max_seconds: only the first {a.max_seconds} s are kept")
        sound = clip.audio or clip.video
        with open_regular(sound, "audio", None) as f:
            container = open_container(f, sound)
            with container:
                samples = audio.decode_samples(container, clip.start, seconds, sound)
        latent = video.encode(video_vae, video.preprocess(frames, a.height, a.width), self.dtype)
        tokens = video.patchify(latent)
        grid = video.grid_of(latent)
        generator = torch.Generator().manual_seed(clip_seed(a.seed, clip.stem))
        audio_latent = audio.encode(audio_vae, samples, generator, a.audio_window_seconds)
        write_safetensors(self.path("video", clip.stem),
                          {"video_latent": tokens, "video_grid_thw": torch.tensor(grid, dtype=torch.int64)}, replace=True)
        write_safetensors(self.path("audio", clip.stem), {"audio_latent": audio_latent}, replace=True)
        record.update(status="ok", frames=len(frames), seconds=seconds, video_latent=list(tokens.shape),
                      video_grid_thw=grid, audio_latent=list(audio_latent.shape))
        write_json(self.record_path(clip.stem), record, replace=True)

    def load_vaes(self):
        from diffusers import AutoencoderKLWan, AutoencoderOobleck

        device = self.args.device
        video_vae = AutoencoderKLWan.from_pretrained(self.args.vae, torch_dtype=self.dtype, local_files_only=True,
                                                     use_safetensors=True).to(device).eval()
        if self.args.vae_tiling:
            video_vae.enable_tiling()
        # Upstream runs the audio VAE in fp32 whatever the other encoders' dtype.
        audio_vae = AutoencoderOobleck.from_pretrained(self.args.audio_vae, torch_dtype=torch.float32,
                                                       local_files_only=True, use_safetensors=True).to(device).eval()
        return video_vae, audio_vae

    def main(self):
        if self.world > 1:
            torch.distributed.init_process_group("gloo")
        settings = self.settings()
        self.open_output(settings)
        clips = find_clips(self.args.input)
        if not clips:
            raise InputError("no_clips", f"--input {self.args.input}: no clips found "
                             "(<stem>.mp4|mkv|webm|mov with <stem>.txt, or a JSONL manifest)")
        mine = [clip for index, clip in enumerate(clips) if index % self.world == self.rank]
        todo = [clip for clip in mine if not (self.args.resume and self.complete(clip.stem))]
        progress = Progress(len(todo), self.rank == 0)
        records = {clip.stem: {"stem": clip.stem, "video": clip.video, "audio": clip.audio, "start": clip.start,
                               "end": clip.end, "warnings": list(clip.warnings)} for clip in todo}
        for clip in todo:
            if clip.problem is not None:
                self.refuse(clip, clip.problem, records[clip.stem])
                progress.step(clip.stem, clip.problem.code)
        todo = [clip for clip in todo if clip.problem is None]
        if todo:
            self.encode_captions(todo, records)
            video_vae, audio_vae = self.load_vaes()
            for clip in todo:
                try:
                    self.encode_clip(clip, records[clip.stem], video_vae, audio_vae)
                    progress.step(clip.stem, "ok")
                except InputError as error:
                    self.refuse(clip, error, records[clip.stem])
                    progress.step(clip.stem, error.code)
                except (MemoryError, KeyboardInterrupt):
                    raise
                except Exception as error:  # one clip's unforeseen failure never costs the others
                    named = InputError("failed", f"{clip.video}: {type(error).__name__}: {error}")
                    self.refuse(clip, named, records[clip.stem])
                    progress.step(clip.stem, named.code)
        self.barrier()
        refused = self.write_summary(clips, settings) if self.rank == 0 else 0
        if self.world > 1:
            # torchrun takes any non-zero exit for a failed rank: it prints a ChildFailedError and
            # SIGTERMs the ranks still exiting. A run that finished every clip is not a failure,
            # so under torchrun every rank exits 0 once the summary exists; prepare.json, and the
            # line rank 0 prints, say what was refused.
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
            if refused:
                say(f"prepare: {refused} clip(s) refused; under torchrun the exit status is 0 (status 2 would read "
                    "as a failed rank): prepare.json lists them")
            return 0
        return EXIT_SOME_REFUSED if refused else 0

    def write_summary(self, clips, settings):
        """prepare.json: the settings, the channel widths and every clip's record, in clip order."""
        entries = []
        for clip in clips:
            try:
                entries.append(read_json(self.record_path(clip.stem), "record"))
            except InputError:
                entries.append({"stem": clip.stem, "video": clip.video, "status": "error",
                                "error": {"code": "not_prepared", "message": "no record (was a rank killed?)"}})
        summary = dict(settings, clips=entries)
        write_json(os.path.join(self.args.out, "prepare.json"), summary, replace=True)
        ok = sum(1 for e in entries if e.get("status") == "ok")
        refused = len(entries) - ok
        say(f"prepare: {ok} clips prepared, {refused} refused; {os.path.join(self.args.out, 'prepare.json')} lists each")
        return refused


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        return Run(args).main()
    except InputError as error:
        say(f"error: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
