"""Audio: 51200 Hz samples, mono made stereo, Stable Audio Open's Oobleck latents in overlapping windows.

Upstream (video_process.py::load_audio_and_encode) loads with whisper.load_audio: ffmpeg resamples
to 51200 Hz mono 16-bit and the samples are divided by 32768. The same libswresample does it here
through PyAV. The mono signal is duplicated into two channels ([2, n]) for the stereo VAE.
Shapes: samples [n] fp32; latents [Na, C] fp32 with Na = n / 2048 (25 a second).
"""

import math

import av
import numpy as np
import torch

from . import spec
from .files import InputError


# A clip that starts later than this is reached by a seek to SEEK_LEAD_SECONDS before its start
# (so the resampler's start-up lies well before it) instead of decoding everything before it.
SEEK_LEAD_SECONDS = 30.0


def decode_samples(container, start, seconds, where):
    """`seconds` of mono samples at 51200 Hz from `start` (seconds from the stream's first sample):
    [round(seconds * 51200)] fp32 in [-1, 1). A stream that ends up to one video frame early is
    padded with silence, as upstream pads its windows; shorter than that is an error.

    Only the samples inside the window are kept, so a late start costs no memory. A start beyond
    SEEK_LEAD_SECONDS seeks first; its samples then sit on a resampling grid offset from a decode
    from the first sample by less than one output sample (under 20 us)."""
    if not container.streams.audio:
        raise InputError("no_audio", f"{where} has no audio track (give a <stem>.wav / .flac beside it, "
                         "or an 'audio' entry in the manifest)")
    stream = container.streams.audio[0]
    resampler = av.AudioResampler(format="s16", layout="mono", rate=spec.AUDIO_SAMPLE_RATE)
    first = round(start * spec.AUDIO_SAMPLE_RATE)
    wanted = round(seconds * spec.AUDIO_SAMPLE_RATE)
    origin = stream.start_time or 0
    sought = start > SEEK_LEAD_SECONDS and stream.time_base is not None
    chunks, layout = [], None
    position = None if sought else 0  # the next resampled sample's index from the stream's first

    def keep(frame):
        nonlocal position
        data = frame.to_ndarray().reshape(-1)
        lo, hi = max(first - position, 0), min(first + wanted - position, len(data))
        if lo < hi:
            chunks.append(data[lo:hi])
        position += len(data)

    try:
        if sought:
            container.seek(origin + int((start - SEEK_LEAD_SECONDS) / stream.time_base), stream=stream)
        for frame in container.decode(stream):
            if position is None:
                if frame.pts is None:
                    raise InputError("corrupt_file", f"{where}: an audio frame without a timestamp after seeking "
                                     f"to {start} s")
                position = max(round(float((frame.pts - origin) * stream.time_base) * spec.AUDIO_SAMPLE_RATE), 0)
            this = (frame.sample_rate, frame.layout.name, frame.format.name)
            if layout is not None and this != layout:
                raise InputError("audio_format_changes", f"{where}: its audio changes format mid-stream "
                                 f"({layout[0]} Hz {layout[1]} -> {this[0]} Hz {this[1]}); re-encode it at one rate")
            layout = this
            frame.pts = None  # the resampler counts samples from the first; timestamps may jump
            for out in resampler.resample(frame):
                keep(out)
            if position >= first + wanted:
                break
        else:
            for out in resampler.resample(None):
                keep(out)
    except av.error.FFmpegError as error:
        raise InputError("corrupt_file", f"{where}: cannot decode its audio: {error}") from None
    except ValueError as error:  # PyAV's resampler refuses a frame unlike the first
        raise InputError("audio_format_changes", f"{where}: its audio cannot be resampled: {error}") from None
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
    missing = wanted - len(samples)
    if missing > spec.AUDIO_SAMPLE_RATE // spec.FPS:
        raise InputError("audio_too_short", f"{where}: its audio holds {len(samples) / spec.AUDIO_SAMPLE_RATE:.3f} s "
                         f"after {start} s, the video {seconds:.3f} s")
    samples = np.pad(samples, (0, max(missing, 0)))
    return torch.from_numpy(samples.astype(np.float32) / 32768.0)


def window_samples(window_seconds):
    """The window in samples: a whole number of latent frames (2048 samples each), else refused
    (a float truncation would otherwise drop the last latent frame silently)."""
    window = round(window_seconds * spec.AUDIO_SAMPLE_RATE)
    if abs(window - window_seconds * spec.AUDIO_SAMPLE_RATE) > 1e-6 * window or window % spec.AUDIO_HOP:
        raise InputError("bad_setting", f"--audio-window-seconds {window_seconds}: {window_seconds * spec.AUDIO_SAMPLE_RATE} "
                         f"samples, not a whole number of {spec.AUDIO_HOP}-sample latent frames")
    return window


def windows(total, window):
    """Upstream's windows: starts every window/2 samples until one reaches the end."""
    step = int(window * (1 - spec.AUDIO_WINDOW_OVERLAP))
    starts = []
    for start in range(0, total, step):
        starts.append(start)
        if start + window >= total:
            break
    return starts


def merge_overlapping(features, overlap_ratio=spec.AUDIO_WINDOW_OVERLAP):
    """Upstream's merge_overlapping_vae_features: windows [1, frames, C], each overlap cross-faded
    linearly (the earlier window's weight falls from 1, the later's rises from 0)."""
    if len(features) == 1:
        return features[0]
    batch, frames, channels = features[0].shape
    overlap = int(frames * overlap_ratio)
    step = frames - overlap
    out = torch.zeros(batch, (len(features) - 1) * step + frames, channels, dtype=features[0].dtype)
    out[:, :frames] = features[0]
    for index, current in enumerate(features[1:], start=1):
        begin = index * step
        out[:, begin + overlap:begin + frames] = current[:, overlap:]
        for i in range(overlap):
            previous_weight = (overlap - i) / overlap
            current_weight = i / overlap
            out[:, begin + i] = previous_weight * out[:, begin + i] + current_weight * current[:, i]
    return out


@torch.no_grad()
def encode(vae, samples, generator, window_seconds=spec.AUDIO_WINDOW_SECONDS):
    """Samples [n] -> latents [Na, C]: the VAE posterior sampled (mean + (softplus(scale) + 1e-4) * N(0, 1),
    noise from `generator`), window by window as upstream when n exceeds one window."""
    device = next(vae.parameters()).device
    window = window_samples(window_seconds)

    def sample(chunk):  # [n'] -> [1, C, frames]
        stereo = chunk.to(device).unsqueeze(0).expand(2, -1).unsqueeze(0)
        posterior = vae.encode(stereo).latent_dist
        noise = torch.randn(posterior.mean.shape, generator=generator, dtype=posterior.mean.dtype)
        return (posterior.mean.cpu() + posterior.std.cpu() * noise).float()

    total = samples.shape[0]
    if total <= window:
        return sample(samples)[0].T.contiguous()
    latents = []
    for start in windows(total, window):
        chunk = samples[start:start + window]
        chunk = torch.nn.functional.pad(chunk, (0, window - chunk.shape[0]))  # whisper.pad_or_trim
        latents.append(sample(chunk).permute(0, 2, 1))
    ratio = latents[0].shape[1] / window
    merged = merge_overlapping(latents)
    return merged[0, :math.ceil(total * ratio)].contiguous()


@torch.no_grad()
def decode(vae, latents, sample_rate_out=44100):
    """Latents [Na, C] -> stereo samples [2, n] fp32 at `sample_rate_out` (upstream resamples the
    51200 Hz output by 441/512 to 44.1 kHz; libswresample does it here)."""
    device = next(vae.parameters()).device
    waveform = vae.decode(latents.T.unsqueeze(0).to(device)).sample.float()[0].cpu().numpy()
    return resample(waveform, spec.AUDIO_SAMPLE_RATE, sample_rate_out)


def resample(waveform, rate_in, rate_out):
    """[channels, n] fp32 at rate_in -> [channels, m] fp32 at rate_out, through libswresample."""
    layout = "stereo" if waveform.shape[0] == 2 else "mono"
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(waveform, dtype=np.float32), format="fltp", layout=layout)
    frame.sample_rate = rate_in
    resampler = av.AudioResampler(format="fltp", layout=layout, rate=rate_out)
    out = [f.to_ndarray() for f in resampler.resample(frame)] + [f.to_ndarray() for f in resampler.resample(None)]
    return np.concatenate(out, axis=1) if out else np.zeros((waveform.shape[0], 0), np.float32)
