"""Opening a media file the user gave: only real container formats, read from the descriptor that
was checked (docs/security.md).

FFmpeg probes a file's content, not its name, and some of its demuxers open other files: an
ffconcat script (a few bytes of text named a.mp4) names files by path, relative to the working
directory, so it would read a file outside --input or block on a FIFO; playlists (hls, dash) and
image sequences open more by name or URL. The demuxers allowed here read only the stream they
were given (mov keeps its external references off: enable_drefs defaults to 0).
"""

import av

from .files import InputError

# FFmpeg's demuxer names (`ffmpeg -demuxers`): mp4/mov, Matroska/WebM, AVI, and the soundtracks'
# WAV and FLAC.
ALLOWED_DEMUXERS = ("mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm", "avi", "wav", "flac")


def open_container(f, where):
    """An av container reading the open file `f`, or InputError naming `where` when FFmpeg does
    not recognise it as one of ALLOWED_DEMUXERS' formats."""
    try:
        container = av.open(f, mode="r", options={"format_whitelist": ",".join(ALLOWED_DEMUXERS)})
    except av.error.ArgumentError as error:  # no allowed demuxer takes it (random bytes, a script, ...)
        raise InputError("unsupported_container", f"{where}: not a file of an allowed container format "
                         f"(mp4/mov, mkv/webm, avi, wav, flac): {error}") from None
    except (av.error.FFmpegError, ValueError) as error:
        raise InputError("corrupt_file", f"{where}: not a readable media file ({error})") from None
    if container.format.name not in ALLOWED_DEMUXERS:  # the whitelist held; this says so once more
        container.close()
        raise InputError("unsupported_container", f"{where}: a '{container.format.name}' file is not allowed")
    return container
