"""PyTorch Distributed Checkpoint (DCP) <-> one flat safetensors file, tensor by tensor.

`mmtrain convert MODEL dcp-to-ckpt` and `ckpt-to-dcp` run this with the project's Python (the venv
with torch), so that DCP is read and written by PyTorch's own reader and writer, never parsed by
hand. The flat file holds every tensor of the DCP under its flattened key ("model.layers.0.attn.wq.weight",
"optim.state.<fqn>.exp_avg", ...); the DCP's non-tensor entries (optimizer hyperparameters,
train_state.step) travel as JSON in its metadata under "dcp_objects". Memory stays bounded by the
largest tensor: `read` loads one key at a time with dcp.load and appends its bytes; `write` hands
DCP's writer a planner that fetches each tensor from the flat file only when it is written.

  python dcp_bridge.py read DCP_DIR OUT.safetensors
  python dcp_bridge.py write IN.safetensors DCP_DIR

Errors (a missing or truncated .distcp file, a key DCP cannot load) exit 1 with one line on stderr
that names the file and the key.

A DCP directory is foreign data, never code. Its `.metadata` is a pickle: it is read by an unpickler
that builds only the classes DCP's metadata is made of (SAFE_METADATA_GLOBALS) and refuses any other
global by name, so a crafted pickle cannot call anything. Bytes entries (optimizer hyperparameters,
train_state.step) are read with torch.load(weights_only=True). The data file names the metadata
lists must be plain names inside the directory (no separator, no "..", not a symlink), and every
file is opened with O_NOFOLLOW.
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


def _jsonable(value):
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
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
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, stream, path: str):
        super().__init__(stream)
        self.path = path

    def find_class(self, module: str, name: str):
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)  # torch.float32 and the other dtypes are values, not code
        if (module, name) not in SAFE_METADATA_GLOBALS:
            raise BridgeError(f"{self.path}: refused: the pickle names {module}.{name}, which is not one of the "
                              f"classes DCP metadata is made of (a DCP directory is data; this one would run code)")
        return super().find_class(module, name)


def _open_no_follow(path: str):
    """A regular file opened for reading without following a symlink at its last component."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:  # the name is a symlink
            raise BridgeError(f"{path}: refused: a symlink (a DCP's files must be plain files in its directory)") from None
        raise BridgeError(f"{path}: cannot open: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BridgeError(f"{path}: not a regular file")
    return os.fdopen(fd, "rb")


class _NoFollowFileSystem(FileSystem):
    @contextmanager
    def create_stream(self, path, mode: str):
        if mode != "rb":
            raise BridgeError(f"{path}: the DCP reader opens files for reading only, asked for mode {mode!r}")
        with _open_no_follow(str(path)) as stream:
            yield stream


class _SafeReader(dcp.FileSystemReader):
    """FileSystemReader whose metadata comes through _MetadataUnpickler and whose files open O_NOFOLLOW."""

    def __init__(self, dcp_dir: str):
        super().__init__(dcp_dir)
        self.fs = _NoFollowFileSystem()

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


def _plain_file_name(dcp_dir: str, name, fqn: str) -> str:
    """The path of a data file the metadata names: a plain name inside dcp_dir, nothing else."""
    name = str(name)
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise BridgeError(f"{dcp_dir}/.metadata: refused: '{fqn}' is stored in {name!r}, which is not a plain file "
                          f"name inside the checkpoint directory")
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
                raise BridgeError(f"{path}: missing (the DCP's .metadata names it for '{index.fqn}')")
            with _open_no_follow(path) as f:
                sizes[path] = os.fstat(f.fileno()).st_size
        if info.offset + info.length > sizes[path]:
            raise BridgeError(f"{path}: truncated: {sizes[path]} bytes, but '{index.fqn}' is stored at bytes "
                              f"[{info.offset}, {info.offset + info.length})")


def _load(dcp_dir: str, state: dict, key: str) -> None:
    """dcp.load of one key through the safe reader and planner; errors name the directory and key."""
    try:
        dcp.load(state, storage_reader=_SafeReader(dcp_dir), planner=_WeightsOnlyLoadPlanner())
    except Exception as e:  # DCP raises CheckpointException wrapping the rank's error (a BridgeError too)
        raise BridgeError(f"{dcp_dir}: cannot load '{key}': {str(e).strip().splitlines()[-1][:300]}") from None


def read(dcp_dir: str, out_path: str) -> None:
    if not os.path.isfile(os.path.join(dcp_dir, ".metadata")):
        raise BridgeError(f"{dcp_dir}: not a DCP checkpoint (no .metadata file)")
    metadata = _SafeReader(dcp_dir).read_metadata()
    _check_files(dcp_dir, metadata)
    tensors, objects = [], {}
    for key, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            if entry.properties.dtype not in SAFETENSORS_DTYPES:
                raise BridgeError(f"{dcp_dir}: '{key}' has dtype {entry.properties.dtype}, which safetensors cannot hold")
            tensors.append((key, entry.properties.dtype, list(entry.size)))
        elif isinstance(entry, BytesStorageMetadata):
            state = {key: None}
            _load(dcp_dir, state, key)
            try:
                objects[key] = _jsonable(state[key])
            except BridgeError as e:
                raise BridgeError(f"{dcp_dir}: '{key}': {e}") from None
    header, offset = {}, 0
    for key, dtype, shape in tensors:
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        header[key] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt", "dcp_objects": json.dumps(objects)}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = out_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for key, dtype, shape in tensors:
            t = torch.empty(shape, dtype=dtype)
            _load(dcp_dir, {key: t}, key)
            f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            del t
    os.replace(tmp, out_path)
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
    if len(argv) != 3 or argv[0] not in ("read", "write"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        (read if argv[0] == "read" else write)(argv[1], argv[2])
    except BridgeError as e:
        print(f"dcp_bridge: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
