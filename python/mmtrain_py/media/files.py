"""The trust boundary (docs/security.md): every input is hostile until checked, every output atomic.

Inputs are opened without following a link and must be regular files (a FIFO or a device would
block or never end); what is read is the descriptor that was checked, never the path again.
Outputs are written to a temporary file beside the target, opened O_EXCL | O_NOFOLLOW, then
renamed over it, so a reader sees a whole file or none and nothing is written through a link.
"""

import json
import os
import secrets
import stat
import sys

from safetensors.torch import save as safetensors_bytes


class InputError(Exception):
    """A named problem with one input: `code` is a stable identifier, the message says what and where."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def utf8_safe(text):
    """`text` encodable as UTF-8 (what JSON needs): a file name's undecodable bytes (os.fsdecode's
    surrogates) become \\xNN."""
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    out = []
    for ch in str(text):
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:      # an undecodable byte, as os.fsdecode keeps it
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:    # any other lone surrogate
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def printable(text):
    """`text` safe to print: utf8_safe, and control characters (a terminal's escape sequences) as
    their repr escapes."""
    return "".join(repr(ch)[1:-1] if not ch.isprintable() and ch != " " else ch for ch in utf8_safe(text))


def say(message):
    """One line on stderr, printable whatever file names it carries."""
    print(printable(message), file=sys.stderr, flush=True)


def open_regular(path, what, max_bytes=None, follow_links=False):
    """The file at `path` opened for reading, refusing FIFOs, devices, (optionally) size, and links
    unless `follow_links` (a model directory in the HF cache is links into its blobs)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InputError("missing_file", f"{what} {path} does not exist") from None
    except OSError as error:
        if os.path.islink(path):
            raise InputError("not_regular_file", f"{what} {path} is a symbolic link") from None
        raise InputError("unreadable", f"{what} {path}: {error.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise InputError("not_regular_file", f"{what} {path} is not a regular file")
    if max_bytes is not None and info.st_size > max_bytes:
        os.close(fd)
        raise InputError("file_too_large", f"{what} {path} holds {info.st_size} bytes, more than {max_bytes}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(path, what, max_bytes, follow_links=False):
    with open_regular(path, what, max_bytes, follow_links) as f:
        return f.read(max_bytes + 1)


def confined(base_dir, relative, what):
    """`relative` joined to `base_dir`, refused when it is absolute, climbs out with '..', or leads
    out through a linked directory: what is opened must lie under the directory itself."""
    if not isinstance(relative, str) or not relative or "\0" in relative:
        raise InputError("bad_manifest", f"{what}: expected a relative path, found {relative!r}")
    path = os.path.join(base_dir, relative)
    real_base = os.path.realpath(base_dir)
    real_dir = os.path.realpath(os.path.dirname(path))
    if os.path.isabs(relative) or os.path.commonpath([real_base, real_dir]) != real_base:
        raise InputError("path_outside_input", f"{what} '{relative}' must stay inside {base_dir}")
    return path


def make_dir(path):
    """Creates `path` (and its missing parents) or accepts it when it is a real directory, never a link."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(path)
    except FileExistsError:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode):
            raise InputError("output_not_directory", f"{path} exists and is not a directory (a link is refused)")


def write_atomic(path, data, replace=False):
    """Writes bytes to `path` through a temporary file and a rename; an existing file is an error
    unless `replace` (what --resume asks for its own incomplete clips)."""
    if not replace and os.path.lexists(path):
        raise InputError("output_exists", f"{path} exists; mmtrain never overwrites an output")
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.tmp-{secrets.token_hex(6)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise


def write_safetensors(path, tensors, metadata=None, replace=False):
    write_atomic(path, safetensors_bytes({k: v.contiguous() for k, v in tensors.items()}, metadata), replace)


def utf8_safe_tree(value):
    """A JSON value with every string (keys too) through utf8_safe()."""
    if isinstance(value, str):
        return utf8_safe(value)
    if isinstance(value, dict):
        return {utf8_safe(k): utf8_safe_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [utf8_safe_tree(v) for v in value]
    return value


def write_json(path, value, replace=False):
    """Every string through utf8_safe(): a record may carry a file name that is not UTF-8."""
    write_atomic(path, (json.dumps(utf8_safe_tree(value), indent=2, ensure_ascii=False) + "\n").encode(), replace)


MAX_JSON_DEPTH = 64


def json_depth(text):
    """The deepest nesting of [ and { in JSON text, outside strings: checked before parsing, since
    Python's parser recurses (a deep line would end in a RecursionError)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_json_text(text, where):
    """JSON text parsed, refusing nesting deeper than MAX_JSON_DEPTH and non-finite numbers
    (1e400 parses as inf; NaN and Infinity are not JSON)."""
    if json_depth(text) > MAX_JSON_DEPTH:
        raise InputError("bad_json", f"{where}: nested deeper than {MAX_JSON_DEPTH} levels")

    def finite(token):
        value = float(token)
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"the number {token} is not finite")
        return value

    def refuse_constant(token):
        raise ValueError(f"{token} is not a JSON number")

    try:
        return json.loads(text, parse_float=finite, parse_constant=refuse_constant)
    except (json.JSONDecodeError, ValueError, RecursionError) as error:
        raise InputError("bad_json", f"{where}: {error}") from None


def parse_json(data, where):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError("bad_json", f"{where}: not UTF-8 (byte {error.start})") from None
    return parse_json_text(text, where)


def read_json(path, what, max_bytes=1 << 26, follow_links=False):
    return parse_json(read_regular(path, what, max_bytes, follow_links), f"{what} {path}")


def read_json_object(path, what, max_bytes=1 << 26, follow_links=False):
    value = read_json(path, what, max_bytes, follow_links)
    if not isinstance(value, dict):
        raise InputError("bad_json", f"{what} {path}: expected a JSON object, found {type(value).__name__}")
    return value


def remove_quietly(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

