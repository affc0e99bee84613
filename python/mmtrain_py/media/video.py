"""Video: frames at the model's fps, upstream's resize-crop, the Wan2.2 VAE's latents, 1x2x2 patches.

Shapes: frames [3, F, H, W] in [-1, 1] with F = 1 + 4k; the VAE's mean [z, T', H/16, W/16] with
T' = 1 + k; tokens [T' * H/32 * W/32, 4z] in channel order (c, pT, pH, pW), t-major then h then w.
"""

import av
import numpy as np
import torch

from . import spec
from .files import InputError

# The crop may drop at most this share of a frame; beyond it the clip is refused as an extreme
# aspect ratio (a 4:1 strip cropped to 16:9 would keep a quarter of its width).
MAX_CROPPED_SHARE = 0.5
# Frame-to-frame intervals that differ from the median by more than this share make the clip
# variable-frame-rate: resampling it to 25 fps would change its timing silently.
FRAME_INTERVAL_TOLERANCE = 0.05


def resizecrop(image, height, width):
    """Upstream's resizecrop (video_process.py): the largest centred box of the target aspect
    ratio; the resize to (height, width) follows in preprocess()."""
    w, h = image.size
    if w == width and h == height:
        return image
    if h / w > height / width:
        new_w = int(w)
        new_h = int(new_w * height / width)
    else:
        new_h = int(h)
        new_w = int(new_h * width / height)
    left, top = (w - new_w) / 2, (h - new_h) / 2
    return image.crop((left, top, (w + new_w) / 2, (h + new_h) / 2))


def kept_share(source_w, source_h, height, width):
    source, target = source_w / source_h, width / height
    return min(source / target, target / source)


def frame_count(available):
    """The longest 1 + 4k not above `available` (the VAE's temporal stride is 4)."""
    return (available - 1) // spec.VAE_TEMPORAL_STRIDE * spec.VAE_TEMPORAL_STRIDE + 1


def decode_frames(container, height, width, fps, start, end, max_pixels, where):
    """The clip's frames from `start` to `end` seconds (end None: the stream's end; times count from
    the first frame) at `fps`, each resize-cropped to (height, width): a list of F = 1 + 4k PIL
    images. Output frame i is the source frame on screen at time start + i / fps: the last one
    whose timestamp is at or before it (to 1 us). Only kept frames, at the target size, stay in
    memory, so a long source costs decode time, not memory."""
    if not container.streams.video:
        raise InputError("no_video_stream", f"{where} has no video stream")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    rotation = stream.metadata.get("rotate", "0")
    picked, intervals = [], []
    shown, shown_image = None, None  # the source frame on screen, and its resize-crop once made
    first_pts = previous_t = None

    def emit_until(limit):
        nonlocal shown_image
        while start + len(picked) / fps < limit - 1e-6 and (end is None or start + len(picked) / fps < end - 1e-6):
            if shown_image is None:
                shown_image = resizecrop(shown.to_image(), height, width)
            picked.append(shown_image)

    try:
        for frame in container.decode(stream):
            if frame.pts is None:
                raise InputError("corrupt_file", f"{where}: a video frame without a timestamp")
            if frame.rotation or rotation != "0":
                raise InputError("rotated", f"{where} carries rotation metadata ({frame.rotation or rotation} "
                                 "degrees); re-encode it upright (ffmpeg applies the rotation when re-encoding)")
            if frame.width * frame.height > max_pixels:
                raise InputError("source_too_large", f"{where}: frames of {frame.width}x{frame.height} exceed "
                                 f"--max-source-pixels {max_pixels}")
            if kept_share(frame.width, frame.height, height, width) < MAX_CROPPED_SHARE:
                raise InputError("extreme_aspect_ratio", f"{where}: a {frame.width}x{frame.height} frame cropped "
                                 f"to {width}x{height} would lose more than {MAX_CROPPED_SHARE:.0%} of it")
            if first_pts is None:
                first_pts = frame.pts
            t = float((frame.pts - first_pts) * stream.time_base)
            if previous_t is not None:
                intervals.append(t - previous_t)
            previous_t = t
            if shown is not None:
                emit_until(t)
            if end is not None and t >= end - 1e-6:
                break
            shown, shown_image = frame, None
    except av.error.FFmpegError as error:
        raise InputError("corrupt_file", f"{where}: cannot decode: {error}") from None
    _check_constant_rate(intervals, where)
    if shown is not None:
        emit_until(previous_t + (float(np.median(intervals)) if intervals else 1.0 / fps))
    if len(picked) < spec.MIN_FRAMES:
        raise InputError("too_short", f"{where}: {len(picked)} frames at {fps} fps from {start} s; a clip needs "
                         f"at least {spec.MIN_FRAMES} (one latent frame beyond the first)")
    return picked[:frame_count(len(picked))]


def _check_constant_rate(intervals, where):
    if len(intervals) < 2:
        return
    median = float(np.median(intervals))
    if median <= 0:
        raise InputError("variable_frame_rate", f"{where}: frame timestamps do not increase")
    worst = max(abs(i - median) for i in intervals) / median
    if worst > FRAME_INTERVAL_TOLERANCE:
        raise InputError("variable_frame_rate", f"{where}: frame intervals vary by {worst:.0%} around "
                         f"{median * 1000:.2f} ms (variable frame rate); re-encode it at a constant rate")


def preprocess(images, height, width):
    """Upstream's VideoProcessor(vae_scale_factor=16).preprocess of each frame: a Lanczos resize to
    (height, width), then [0, 255] -> [-1, 1]. Returns [1, 3, F, H, W] fp32."""
    from diffusers.video_processor import VideoProcessor

    processor = VideoProcessor(vae_scale_factor=spec.VAE_SPATIAL_STRIDE)
    frames = [processor.preprocess(image, height=height, width=width) for image in images]  # each [1, 3, H, W]
    return torch.cat(frames).permute(1, 0, 2, 3).unsqueeze(0)


def latent_normalization(vae):
    """Upstream's (mean, 1 / std) per latent channel, from the VAE's config (diffusers keeps the
    tables upstream's Wan2_2_VAE hard-codes in its config as latents_mean / latents_std)."""
    mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32)
    std = torch.tensor(vae.config.latents_std, dtype=torch.float32)
    return mean, 1.0 / std


@torch.no_grad()
def encode(vae, video, dtype):
    """The normalized VAE mean (upstream's encode takes mu, never a sample): [z, T', h, w] fp32."""
    device = next(vae.parameters()).device
    mu = vae.encode(video.to(device=device, dtype=dtype)).latent_dist.mean.float()[0]
    mean, inverse_std = latent_normalization(vae)
    view = (-1, 1, 1, 1)
    return (mu - mean.to(mu.device).view(view)) * inverse_std.to(mu.device).view(view)


def patchify(latent):
    """[z, T, h, w] -> tokens [T * h/2 * w/2, 4z], channel c * 4 + kh * 2 + kw (UnfoldNd 1x2x2)."""
    z, t, h, w = latent.shape
    if h % spec.PATCH or w % spec.PATCH:
        raise ValueError(f"latent {h}x{w} is not divisible by the patch {spec.PATCH}")
    x = latent.reshape(z, t, h // 2, 2, w // 2, 2).permute(1, 2, 4, 0, 3, 5)
    return x.reshape(t * (h // 2) * (w // 2), z * 4).contiguous()


def unpatchify(tokens, grid):
    """Inverse of patchify: tokens [T * H' * W', 4z] and grid (T, H', W') -> [z, T, 2H', 2W']."""
    t, h, w = (int(v) for v in grid)
    n, c = tokens.shape
    if n != t * h * w or c % 4:
        raise InputError("bad_latent", f"video tokens {list(tokens.shape)} do not fit grid {[t, h, w]}")
    x = tokens.reshape(t, h, w, c // 4, 2, 2).permute(3, 0, 1, 4, 2, 5)
    return x.reshape(c // 4, t, h * 2, w * 2)


@torch.no_grad()
def decode(vae, latent, dtype):
    """Normalized latent [z, T', h, w] -> frames [F, H, W, 3] uint8, as upstream's decode_video."""
    device = next(vae.parameters()).device
    mean, inverse_std = latent_normalization(vae)
    view = (-1, 1, 1, 1)
    z = latent.float() / inverse_std.view(view) + mean.view(view)
    video = vae.decode(z.unsqueeze(0).to(device=device, dtype=dtype)).sample.float().clamp(-1, 1)[0]
    video = (video.mul(0.5).add(0.5).clamp(0, 1).permute(1, 2, 3, 0) * 255).cpu().numpy().astype(np.uint8)
    return video


def grid_of(latent):
    _, t, h, w = latent.shape
    return [t, h // spec.PATCH, w // spec.PATCH]
