"""Finding the clips: a directory of <stem>.mp4|mkv|webm|mov with <stem>.txt captions (and an
optional <stem>.wav|flac soundtrack), or a JSONL manifest of {video, caption, audio?, start?, end?}."""

import os
import stat
from dataclasses import dataclass, field

from .files import InputError, confined, parse_json_text, printable, read_regular
from .text import MAX_CAPTION_BYTES

VIDEO_SUFFIXES = (".mp4", ".mkv", ".webm", ".mov")
AUDIO_SUFFIXES = (".wav", ".flac")
MAX_MANIFEST_BYTES = 64 << 20


@dataclass
class Clip:
    stem: str              # the output files' name
    video: str             # path of the video file
    caption: str = None    # the caption text, or None when `problem` says why not
    audio: str = None      # a separate soundtrack, or None: the video's own audio track
    start: float = 0.0     # seconds from the video's first frame
    end: float = None      # None: to the end (or --max-seconds)
    problem: InputError = None  # found before any decoding: a collision, a bad caption, ...
    warnings: list = field(default_factory=list)


def read_caption(path):
    try:
        data = read_regular(path, "caption", MAX_CAPTION_BYTES)
    except InputError as error:
        if error.code == "file_too_large":
            raise InputError("caption_too_large", f"caption {path} is larger than {MAX_CAPTION_BYTES} bytes") from None
        raise
    if len(data) > MAX_CAPTION_BYTES:
        raise InputError("caption_too_large", f"caption {path} is larger than {MAX_CAPTION_BYTES} bytes")
    return decode_caption(data, path)


def decode_caption(data, where):
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as error:
        raise InputError("caption_not_utf8", f"caption {where} is not UTF-8 (byte {error.start})") from None
    text = text.strip()
    if not text:
        raise InputError("empty_caption", f"caption {where} is empty")
    if len(text.encode()) > MAX_CAPTION_BYTES:
        raise InputError("caption_too_large", f"caption {where} is larger than {MAX_CAPTION_BYTES} bytes")
    return text


def check_name(clip):
    """A clip's stem names its output files and its record: it must be UTF-8 (a record is JSON, a
    log line text) and not hidden (names starting with '.' are the outputs' temporary files)."""
    for name in (clip.stem, clip.video) + ((clip.audio,) if clip.audio else ()):
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError("bad_file_name", f"'{printable(name)}' is not a UTF-8 name; rename it") from None
    if not clip.stem or clip.stem.startswith("."):
        raise InputError("bad_file_name", f"'{printable(clip.video)}': a hidden name (starting with '.') or an empty "
                         "stem is refused: the outputs' temporary files start with '.'")


def _stem_collisions(clips):
    by_stem = {}
    for clip in clips:
        by_stem.setdefault(clip.stem, []).append(clip)
    for stem, group in by_stem.items():
        if len(group) > 1:
            names = ", ".join(clip.video for clip in group)
            for clip in group:
                clip.problem = InputError("stem_collision", f"{names} share the output name '{stem}'; rename one")


def from_directory(directory):
    entries = sorted(os.listdir(directory))
    clips = []
    for name in entries:
        stem, suffix = os.path.splitext(name)
        if suffix.lower() not in VIDEO_SUFFIXES:
            continue
        path = os.path.join(directory, name)
        clip = Clip(stem=stem, video=path)
        clips.append(clip)
        try:
            mode = os.lstat(path).st_mode
            if not stat.S_ISREG(mode):
                raise InputError("not_regular_file", f"{path} is not a regular file (links, FIFOs and devices are refused)")
            clip.caption = read_caption(os.path.join(directory, stem + ".txt"))
            sidecars = [stem + s for s in AUDIO_SUFFIXES if stem + s in entries]
            if len(sidecars) > 1:
                raise InputError("stem_collision", f"{stem}: two soundtracks ({', '.join(sidecars)}); keep one")
            clip.audio = os.path.join(directory, sidecars[0]) if sidecars else None
            check_name(clip)
        except InputError as error:
            clip.problem = error
    _stem_collisions(clips)
    return clips


def _seconds(record, key, where):
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < 1e6):
        raise InputError("bad_manifest", f"{where}: '{key}' must be seconds >= 0, found {value!r}")
    return float(value)


def from_manifest(path):
    """Each line a JSON object; paths are relative to the manifest's directory and may not leave it."""
    base = os.path.dirname(os.path.abspath(path))
    data = read_regular(path, "manifest", MAX_MANIFEST_BYTES)
    if len(data) > MAX_MANIFEST_BYTES:
        raise InputError("file_too_large", f"manifest {path} is larger than {MAX_MANIFEST_BYTES} bytes")
    clips = []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = parse_json_text(line, where)
        except InputError as error:
            raise InputError("bad_manifest", f"{error} (not a JSON line)") from None
        if not isinstance(record, dict):
            raise InputError("bad_manifest", f"{where}: expected an object")
        unknown = set(record) - {"video", "caption", "audio", "start", "end"}
        if unknown:
            raise InputError("bad_manifest", f"{where}: unknown keys {sorted(unknown)} (video, caption, audio, start, end)")
        name = record.get("video")
        clip = Clip(stem=os.path.splitext(os.path.basename(str(name)))[0], video=str(name))
        clips.append(clip)
        try:
            clip.video = confined(base, name, f"{where}: video")
            caption = record.get("caption")
            if not isinstance(caption, str):
                raise InputError("empty_caption", f"{where}: 'caption' must be a string, found {caption!r}")
            clip.caption = decode_caption(caption, where)
            if record.get("audio") is not None:
                clip.audio = confined(base, record["audio"], f"{where}: audio")
            clip.start = _seconds(record, "start", where) or 0.0
            clip.end = _seconds(record, "end", where)
            if clip.end is not None and clip.end <= clip.start:
                raise InputError("bad_manifest", f"{where}: end {clip.end} is not after start {clip.start}")
            check_name(clip)
        except InputError as error:
            clip.problem = error
    _stem_collisions(clips)
    return clips


def find_clips(source):
    if os.path.isdir(source):
        return from_directory(source)
    return from_manifest(source)
