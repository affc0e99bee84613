"""PyTorch Distributed Checkpoint (DCP) <-> one flat safetensors file, tensor by tensor.

`mmtrain convert MODEL dcp-to-ckpt` and `ckpt-to-dcp` run this with the project's Python (the venv
with torch), so that DCP is read and written by PyTorch's own reader and writer, never parsed by
hand. The flat file holds every tensor of the DCP under its flattened key ("model.layers.0.attn.wq.weight",
"optim.state.<fqn>.exp_avg", ...); the DCP's non-tensor entries (optimizer hyperparameters,
train_state.step) travel as JSON in its metadata under "dcp_objects". Memory stays bounded by the
largest tensor: `read` loads one key at a time with dcp.load and appends its bytes; `write` hands
DCP's writer a planner that fetches each tensor from the flat file only when it is written.

  python -P -m mmtrain_py.dcp.bridge list DCP_DIR OUT.json                 what the DCP holds, from its metadata alone
  python -P -m mmtrain_py.dcp.bridge read DCP_DIR OUT.safetensors [KEYS.json]  only the keys listed, when given
  python -P -m mmtrain_py.dcp.bridge write IN.safetensors DCP_DIR

`list` lets the caller refuse keys it cannot place before any of their data is read.

Errors (a missing or truncated .distcp file, a key DCP cannot load) exit 1 with one line on stderr
that names the file and the key.

A DCP directory is foreign data, never code. Its `.metadata` is a pickle: it is read by an unpickler
that builds only the classes DCP's metadata is made of (SAFE_METADATA_GLOBALS) and refuses any other
global by name, so a crafted pickle cannot call anything. Bytes entries (optimizer hyperparameters,
train_state.step) are read with torch.load(weights_only=True). The data file names the metadata
lists must be plain names inside the directory (no separator, no "..", not a symlink): a path in the
pickle is rebuilt here as a plain string from its parts (never trusting a path object's own idea of
its string), checked in that form, and opened in that form relative to the directory's descriptor
with O_NOFOLLOW and O_NONBLOCK (a FIFO is refused, never waited on). A bytes entry's value is walked
within a budget (nodes, depth): a pickle of shared references cannot expand without bound. A tensor
is read only when the bytes that back it can hold what it declares (a stride-0 tensor declaring
2^27 elements over 1.6 KB is refused before anything is allocated). Offsets and lengths must be
non-negative integers inside the file.
"""
from __future__ import annotations

import errno
import io
import json
import os
import pickle
import stat
import struct
import sys
import warnings
from contextlib import contextmanager

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta, TensorStorageMetadata

# DCP in one process warns that it assumes one process: that is the intent here.
warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process.*")
warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")

SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
                      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                      torch.uint8: "U8", torch.bool: "BOOL"}


class BridgeError(Exception):
    pass


def _jsonable(value, budget=None, depth=0):
    """value as JSON, visiting at most MAX_OBJECT_NODES nodes and MAX_OBJECT_DEPTH levels (shared
    references count each time they are reached: that is what the JSON would hold)."""
    budget = budget if budget is not None else [MAX_OBJECT_NODES]
    budget[0] -= 1
    if budget[0] < 0:
        raise BridgeError(f"refused: the value has more than {MAX_OBJECT_NODES} elements (a plain setting has a few)")
    if depth > MAX_OBJECT_DEPTH:
        raise BridgeError(f"refused: the value nests deeper than {MAX_OBJECT_DEPTH} levels")
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, budget, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, budget, depth + 1) for k, v in value.items()}
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    raise BridgeError(f"a value of type {type(value).__name__} cannot be carried as JSON")


# The globals a DCP .metadata pickle may name: DCP's own dataclasses, torch.Size, dtypes, the
# layout helper torch pickles torch.strided with, and the path type of checkpoint_id. Anything else
# (os.system, builtins.eval, a class with a __setstate__ of its own) is refused before it is built.
SAFE_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
}
# Path classes a checkpoint_id or relative_path may be pickled as: rebuilt as plain strings from
# their parts (_path_from_parts), so that no state the pickle attaches (a cached `_str`) survives.
PATH_GLOBALS = {("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")}

# A bytes entry (optimizer hyperparameters, a step counter) is a small plain value; a walk past
# these is a crafted pickle of shared references.
MAX_OBJECT_NODES = 100_000
MAX_OBJECT_DEPTH = 64


def _path_from_parts(*parts):
    if not all(type(part) is str for part in parts):
        raise BridgeError("refused: a pickled path whose parts are not strings")
    return os.path.join(*parts) if parts else ""


def _printable(name) -> str:
    """A name from the file, safe to print: control characters escaped."""
    return repr(str(name))[1:-1] if not str(name).isprintable() else str(name)


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, stream, path: str):
        super().__init__(stream)
        self.path = path

    def find_class(self, module: str, name: str):
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)  # torch.float32 and the other dtypes are values, not code
        if (module, name) in PATH_GLOBALS:
            return _path_from_parts
        if (module, name) not in SAFE_METADATA_GLOBALS:
            raise BridgeError(f"{self.path}: refused: the pickle names {module}.{name}, which is not one of the "
                              f"classes DCP metadata is made of (a DCP directory is data; this one would run code)")
        return super().find_class(module, name)


def _open_no_follow(path: str, dir_fd=None):
    """A regular file opened for reading without following a symlink at its last component, and
    without blocking (a FIFO's open would wait for a writer); relative to dir_fd when given."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:  # the name is a symlink
            raise BridgeError(f"{_printable(path)}: refused: a symlink (a DCP's files must be plain files in its "
                              f"directory)") from None
        raise BridgeError(f"{_printable(path)}: cannot open: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BridgeError(f"{_printable(path)}: not a regular file (a DCP's files are plain files)")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


class _ConfinedFileSystem(FileSystem):
    """Opens only plain names directly inside dcp_dir, relative to the directory's descriptor: what
    is opened is the name that was checked, whatever string DCP hands over."""

    def __init__(self, dcp_dir: str):
        super().__init__()
        self.dcp_dir = os.path.abspath(dcp_dir)

    @contextmanager
    def create_stream(self, path, mode: str):
        if mode != "rb":
            raise BridgeError(f"{_printable(path)}: the DCP reader opens files for reading only, asked for mode {mode!r}")
        if type(path) is not str and not isinstance(path, os.PathLike):
            raise BridgeError(f"refused: a file path of type {type(path).__name__}")
        directory, name = os.path.split(os.fspath(path))
        if os.path.abspath(directory) != self.dcp_dir:
            raise BridgeError(f"{_printable(path)}: refused: outside the checkpoint directory {self.dcp_dir}")
        _require_plain_name(self.dcp_dir, name, "a data file")
        dir_fd = os.open(self.dcp_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            with _open_no_follow(name, dir_fd=dir_fd) as stream:
                yield stream
        finally:
            os.close(dir_fd)


class _SafeReader(dcp.FileSystemReader):
    """FileSystemReader whose metadata comes through _MetadataUnpickler and whose files open O_NOFOLLOW."""

    def __init__(self, dcp_dir: str):
        super().__init__(dcp_dir)
        self.fs = _ConfinedFileSystem(dcp_dir)

    def read_metadata(self, *args, **kwargs) -> Metadata:
        path = os.path.join(str(self.path), ".metadata")
        with _open_no_follow(path) as f:
            try:
                metadata = _MetadataUnpickler(f, path).load()
            except BridgeError:
                raise
            except Exception as e:  # a truncated or malformed pickle
                raise BridgeError(f"{path}: not a DCP metadata pickle ({type(e).__name__}: {e})") from None
        if not isinstance(metadata, Metadata):
            raise BridgeError(f"{path}: holds a {type(metadata).__name__}, not DCP Metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner, but a bytes entry is unpickled with weights_only=True (plain values only).
    The state dicts given to it are flat already (DCP's flattened keys), so nothing is re-nested."""

    def __init__(self):
        super().__init__(flatten_state_dict=False)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            self.original_state_dict[read_item.dest_index.fqn] = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            raise BridgeError(f"bytes entry '{read_item.dest_index.fqn}' refused: it is not plain data "
                              f"(torch.load weights_only: {str(e).splitlines()[0][:200]})") from None


def _require_plain_name(dcp_dir: str, name, fqn: str) -> None:
    """name is a plain str (not a subclass or a path object with a string of its own), a file name
    directly inside dcp_dir: no separator, not "." or "..", no NUL."""
    if type(name) is not str or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise BridgeError(f"{dcp_dir}/.metadata: refused: '{_printable(fqn)}' is stored in {name!r}, which is not a "
                          f"plain file name inside the checkpoint directory")


def _plain_file_name(dcp_dir: str, name, fqn: str) -> str:
    """The path of a data file the metadata names: a plain name inside dcp_dir, nothing else."""
    _require_plain_name(dcp_dir, name, fqn)
    return os.path.join(dcp_dir, name)


def _check_files(dcp_dir: str, metadata) -> None:
    """Every storage entry's file is a plain file of dcp_dir, exists and is long enough (a truncated
    file named up front)."""
    sizes = {}
    for index, info in metadata.storage_data.items():
        path = _plain_file_name(dcp_dir, info.relative_path, index.fqn)
        if getattr(info, "transform_descriptors", None):
            raise BridgeError(f"{path}: '{index.fqn}' is stored through transforms {list(info.transform_descriptors)}, "
                              f"which this bridge does not read")
        if path not in sizes:
            if not os.path.lexists(path):
                raise BridgeError(f"{_printable(path)}: missing (the DCP's .metadata names it for "
                                  f"'{_printable(index.fqn)}')")
            with _open_no_follow(path) as f:
                sizes[path] = os.fstat(f.fileno()).st_size
        offset, length = info.offset, info.length
        if type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
            raise BridgeError(f"{_printable(path)}: refused: '{_printable(index.fqn)}' is stored at offset {offset!r} "
                              f"length {length!r} (non-negative integers expected)")
        if offset + length > sizes[path]:
            raise BridgeError(f"{_printable(path)}: truncated: {sizes[path]} bytes, but '{_printable(index.fqn)}' is "
                              f"stored at bytes [{offset}, {offset + length})")


def _check_tensor_backed(dcp_dir: str, metadata, key: str, entry, nbytes: int) -> None:
    """A tensor's stored chunks must be able to hold what it declares: every chunk's bytes in the
    file at least its elements' (torch.save adds a header, never compresses), so that a few stored
    bytes cannot declare gigabytes (a stride-0 tensor) and be materialized before anything else."""
    stored = 0
    for index, info in metadata.storage_data.items():
        if index.fqn == key:
            stored += info.length
    if stored < nbytes:
        raise BridgeError(f"{dcp_dir}: refused: '{_printable(key)}' declares shape {list(entry.size)} "
                          f"({nbytes} bytes of {entry.properties.dtype}) but its stored data is {stored} bytes")


def _load(dcp_dir: str, state: dict, key: str) -> None:
    """dcp.load of one key through the safe reader and planner; errors name the directory and key."""
    try:
        dcp.load(state, storage_reader=_SafeReader(dcp_dir), planner=_WeightsOnlyLoadPlanner())
    except Exception as e:  # DCP raises CheckpointException wrapping the rank's error (a BridgeError too)
        raise BridgeError(f"{dcp_dir}: cannot load '{key}': {str(e).strip().splitlines()[-1][:300]}") from None


def _declared_bytes(dcp_dir: str, key: str, shape, dtype) -> int:
    if not all(type(d) is int and 0 <= d < 2**62 for d in shape):
        raise BridgeError(f"{dcp_dir}: refused: '{_printable(key)}' has shape {shape!r} (sizes must be non-negative integers)")
    nbytes = torch.empty((), dtype=dtype).element_size()
    for d in shape:
        nbytes *= d
    if nbytes >= 2**62:
        raise BridgeError(f"{dcp_dir}: refused: '{_printable(key)}' of shape {shape} is {nbytes} bytes")
    return nbytes


def _checked_entries(dcp_dir: str):
    """The DCP's metadata, every file and tensor checked, as ([(key, dtype, shape)], [bytes keys])."""
    if not os.path.isfile(os.path.join(dcp_dir, ".metadata")):
        raise BridgeError(f"{dcp_dir}: not a DCP checkpoint (no .metadata file)")
    metadata = _SafeReader(dcp_dir).read_metadata()
    _check_files(dcp_dir, metadata)
    tensors, objects = [], []
    for key, entry in metadata.state_dict_metadata.items():
        if type(key) is not str:
            raise BridgeError(f"{dcp_dir}/.metadata: refused: a key of type {type(key).__name__}")
        if isinstance(entry, TensorStorageMetadata):
            if entry.properties.dtype not in SAFETENSORS_DTYPES:
                raise BridgeError(f"{dcp_dir}: '{_printable(key)}' has dtype {entry.properties.dtype}, which "
                                  f"safetensors cannot hold")
            shape = list(entry.size)
            _check_tensor_backed(dcp_dir, metadata, key, entry, _declared_bytes(dcp_dir, key, shape, entry.properties.dtype))
            tensors.append((key, entry.properties.dtype, shape))
        elif isinstance(entry, BytesStorageMetadata):
            objects.append(key)
    return tensors, objects


def list_keys(dcp_dir: str, out_path: str) -> None:
    tensors, objects = _checked_entries(dcp_dir)
    listing = {"tensors": {key: {"dtype": SAFETENSORS_DTYPES[dtype], "shape": shape} for key, dtype, shape in tensors},
               "objects": objects}
    with open(os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644), "w") as f:
        json.dump(listing, f)


def read(dcp_dir: str, out_path: str, keys_path: str | None = None) -> None:
    tensors, object_keys = _checked_entries(dcp_dir)
    if keys_path is not None:  # the caller placed these; nothing else is read
        with _open_no_follow(keys_path) as f:
            wanted = set(json.load(f))
        tensors = [t for t in tensors if t[0] in wanted]
        object_keys = [k for k in object_keys if k in wanted]
    objects = {}
    for key in object_keys:
        state = {key: None}
        _load(dcp_dir, state, key)
        try:
            objects[key] = _jsonable(state[key])
        except BridgeError as e:
            raise BridgeError(f"{dcp_dir}: '{_printable(key)}': {e}") from None
    header, offset = {}, 0
    for key, dtype, shape in tensors:
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        header[key] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt", "dcp_objects": json.dumps(objects)}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = out_path + ".tmp"
    if os.path.lexists(tmp):  # an interrupted earlier read's
        os.unlink(tmp)
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644), "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for key, dtype, shape in tensors:
                t = torch.empty(shape, dtype=dtype)
                _load(dcp_dir, {key: t}, key)
                f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
                del t
        os.replace(tmp, out_path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    print(f"dcp_bridge: read {len(tensors)} tensors and {len(objects)} objects from {dcp_dir}", file=sys.stderr)


class _LazySavePlanner(DefaultSavePlanner):
    """Plans from meta tensors; each tensor is read from the flat file when the writer asks for it,
    through a mapping opened for that tensor alone (a mapping kept open would keep every page
    read so far resident: the whole file by the end)."""

    def __init__(self, flat_path: str):
        super().__init__(flatten_state_dict=False)
        self.flat_path = flat_path

    def lookup_object(self, index):
        from safetensors import safe_open
        value = super().lookup_object(index)
        if isinstance(value, torch.Tensor) and value.is_meta:
            with safe_open(self.flat_path, "pt") as flat:
                return flat.get_tensor(index.fqn).clone()
        return value


def _adamw_group_defaults() -> dict:
    """The param_group keys this torch's AdamW has (they differ across versions), with its defaults."""
    group = torch.optim.AdamW([torch.zeros(1)]).param_groups[0]
    return {k: v for k, v in group.items() if k != "params"}


def write(in_path: str, dcp_dir: str) -> None:
    from safetensors import safe_open

    with safe_open(in_path, "pt") as flat:
        objects = json.loads((flat.metadata() or {}).get("dcp_objects", "{}"))
        state = {}
        for key in flat.keys():
            sl = flat.get_slice(key)
            dtype = {v: k for k, v in SAFETENSORS_DTYPES.items()}[sl.get_dtype()]
            state[key] = torch.empty(sl.get_shape(), dtype=dtype, device="meta")
    # The optimizer's param groups carry every key this torch's AdamW has, so that
    # get_state_dict + dcp.load in PyTorch finds each one.
    groups = sorted({k.split(".")[2] for k in objects if k.startswith("optim.param_groups.")})
    for g in groups:
        for name, default in _adamw_group_defaults().items():
            objects.setdefault(f"optim.param_groups.{g}.{name}", default)
    for key, value in objects.items():
        state[key] = tuple(value) if key.endswith(".betas") else value
    os.makedirs(dcp_dir, exist_ok=True)
    # One file per tensor: DCP's writer keeps every tensor of a file alive until that file is done.
    writer = dcp.FileSystemWriter(dcp_dir, single_file_per_rank=False, thread_count=1)
    dcp.save(state, storage_writer=writer, planner=_LazySavePlanner(in_path))
    print(f"dcp_bridge: wrote {dcp_dir} ({len(state)} entries)", file=sys.stderr)


def main(argv: list[str]) -> int:
    verbs = {"list": (list_keys, 3), "read": (read, 4), "write": (write, 3)}
    if not argv or argv[0] not in verbs or not 3 <= len(argv) <= verbs[argv[0]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        verbs[argv[0]][0](*argv[1:])
    except BridgeError as e:
        print(f"dcp_bridge: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # PyTorch's own error on a malformed entry: one line naming it, no traceback
        message = str(e).strip().splitlines()[-1][:300] if str(e).strip() else ""
        print(f"dcp_bridge: {_printable(argv[1])}: cannot be read: {type(e).__name__}: {_printable(message)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
