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
"""
from __future__ import annotations

import json
import os
import struct
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

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


def _check_files(dcp_dir: str, metadata) -> None:
    """Every storage entry's file exists and is long enough (a truncated file named up front)."""
    sizes = {}
    for index, info in metadata.storage_data.items():
        path = os.path.join(dcp_dir, info.relative_path)
        if path not in sizes:
            if not os.path.isfile(path):
                raise BridgeError(f"{path}: missing (the DCP's .metadata names it for '{index.fqn}')")
            sizes[path] = os.path.getsize(path)
        if info.offset + info.length > sizes[path]:
            raise BridgeError(f"{path}: truncated: {sizes[path]} bytes, but '{index.fqn}' is stored at bytes "
                              f"[{info.offset}, {info.offset + info.length})")


def read(dcp_dir: str, out_path: str) -> None:
    if not os.path.isfile(os.path.join(dcp_dir, ".metadata")):
        raise BridgeError(f"{dcp_dir}: not a DCP checkpoint (no .metadata file)")
    reader = dcp.FileSystemReader(dcp_dir)
    metadata = reader.read_metadata()
    _check_files(dcp_dir, metadata)
    tensors, objects = [], {}
    for key, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            if entry.properties.dtype not in SAFETENSORS_DTYPES:
                raise BridgeError(f"{dcp_dir}: '{key}' has dtype {entry.properties.dtype}, which safetensors cannot hold")
            tensors.append((key, entry.properties.dtype, list(entry.size)))
        elif isinstance(entry, BytesStorageMetadata):
            state = {key: None}
            dcp.load(state, storage_reader=dcp.FileSystemReader(dcp_dir), planner=DefaultLoadPlanner())
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
            try:
                dcp.load({key: t}, storage_reader=dcp.FileSystemReader(dcp_dir), planner=DefaultLoadPlanner())
            except Exception as e:  # DCP raises CheckpointException wrapping the rank's error
                raise BridgeError(f"{dcp_dir}: cannot load '{key}': {str(e).splitlines()[-1][:300]}") from None
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
