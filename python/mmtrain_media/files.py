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

from safetensors.torch import save as safetensors_bytes


class InputError(Exception):
    """A named problem with one input: `code` is a stable identifier, the message says what and where."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


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


def write_json(path, value, replace=False):
    write_atomic(path, (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode(), replace)


def parse_json(data, where):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError("bad_json", f"{where}: {error}") from None


def read_json(path, what, max_bytes=1 << 26, follow_links=False):
    return parse_json(read_regular(path, what, max_bytes, follow_links), f"{what} {path}")


def remove_quietly(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

