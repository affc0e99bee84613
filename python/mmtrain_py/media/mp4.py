"""Writing an mp4 with sound (H.264 + AAC through PyAV): decoded samples and the fixture clips."""

import os
import secrets

import av
import numpy as np

from .files import InputError

AAC_FRAME = 1024  # samples per AAC frame


def write(path, frames, fps, stereo, rate, crf=18):
    """frames [F, H, W, 3] uint8 and stereo [2, n] fp32 in [-1, 1] -> an mp4 at `path`, written to a
    new temporary file beside it (created O_EXCL | O_NOFOLLOW) and renamed into place when whole."""
    if os.path.lexists(path):
        raise InputError("output_exists", f"{path} exists; mmtrain never overwrites an output")
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.tmp-{secrets.token_hex(6)}")
    fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w+b") as f, av.open(f, mode="w", format="mp4") as container:
            video = container.add_stream("libx264", rate=fps)
            video.width, video.height, video.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
            video.options = {"crf": str(crf)}
            audio = container.add_stream("aac", rate=rate, layout="stereo")
            for frame in frames:
                container.mux(video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            container.mux(video.encode())
            samples = np.clip(stereo, -1, 1).astype(np.float32)
            for start in range(0, samples.shape[1], AAC_FRAME):
                chunk = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, start:start + AAC_FRAME]),
                                                   format="fltp", layout="stereo")
                chunk.sample_rate, chunk.pts = rate, start
                container.mux(audio.encode(chunk))
            container.mux(audio.encode())
        os.rename(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)
