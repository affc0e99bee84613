"""Interop of mmtrain's hand-written safetensors code with the reference `safetensors` package.

Python writes files (every dtype safetensors.torch knows, 0-dim and empty tensors); the C++ gtest
SafetensorsInterop.* reads each and writes it back, and saves a 2-rank sharded checkpoint; Python
then checks the rewrites are identical (byte for byte where the reference layout is deterministic)
and that every checkpoint file opens with `safetensors.safe_open` and reassembles to the saved
tensors. Needs a built test binary: $MMTRAIN_BUILD_DIR/bin/mmtrain_tests (default build/).
"""
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[2]

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.float16, torch.bfloat16,
    torch.int32, torch.uint32, torch.float32, torch.float64, torch.int64, torch.uint64, torch.complex64,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
]
SHAPES = [(3, 5), (), (0, 4), (7,), (2, 1, 3)]


def random_tensor(shape, dtype, seed):
    """Random bytes reinterpreted as dtype (NaN payloads included); bool gets 0/1 only."""
    g = torch.Generator().manual_seed(seed)
    numel = 1
    for d in shape:
        numel *= d
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    itemsize = torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (numel * itemsize,), generator=g, dtype=torch.uint8).view(dtype).reshape(shape)


def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_bitwise_equal(actual, expected, what):
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    assert raw(actual) == raw(expected), f"{what}: bytes differ"


# name -> (tensors in write order, metadata, whether the reference bytes are deterministic)
def python_files():
    every = {}
    seed = 0
    for dtype in DTYPES:
        for i, shape in enumerate(SHAPES):
            seed += 1
            every[f"{str(dtype).removeprefix('torch.')}/{i}"] = random_tensor(shape, dtype, seed)
    small = {"b.weight": random_tensor((4, 4), torch.bfloat16, 900), "a.bias": random_tensor((4,), torch.float32, 901)}
    return {
        "all_dtypes": (every, {"format": "pt"}, True),
        "no_metadata": (small, None, True),
        # Several metadata keys: the reference writer orders them by hash, so compare contents only.
        "multi_metadata": (small, {"format": "pt", "step": "42", "note": "é {\"json\": 1}"}, False),
    }


@pytest.fixture(scope="module")
def interop_dir(tmp_path_factory):
    build = Path(os.environ.get("MMTRAIN_BUILD_DIR", "build"))
    if not build.is_absolute():
        build = REPO / build
    exe = build / "bin" / "mmtrain_tests"
    if not exe.exists():
        pytest.skip(f"{exe} does not exist: build mmtrain_tests first, or point MMTRAIN_BUILD_DIR at its build dir")
    out = tmp_path_factory.mktemp("interop")
    for name, (tensors, metadata, _) in python_files().items():
        save_file(tensors, str(out / f"{name}.safetensors"), metadata=metadata)
    run = subprocess.run(
        [str(exe), "--gtest_filter=SafetensorsInterop.*", "--gtest_brief=1"],
        env={**os.environ, "MMTRAIN_INTEROP_DIR": str(out)},
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"{exe} failed:\n{run.stdout}\n{run.stderr}"
    assert "1 test" in run.stdout and "SKIPPED" not in run.stdout, run.stdout
    return out


@pytest.mark.parametrize("name", list(python_files()))
def test_cpp_rewrites_python_files(interop_dir, name):
    tensors, metadata, deterministic = python_files()[name]
    original = interop_dir / f"{name}.safetensors"
    rewritten = interop_dir / f"{name}.roundtrip.safetensors"
    with safe_open(str(rewritten), framework="pt") as f:
        assert sorted(f.keys()) == sorted(tensors)
        assert (f.metadata() or None) == metadata
        for key, expected in tensors.items():
            assert_bitwise_equal(f.get_tensor(key), expected, f"{name}:{key}")
        # Row slices go through the same offsets the C++ read_rows uses.
        for key, expected in tensors.items():
            if expected.dim() >= 1 and expected.shape[0] >= 2:
                assert_bitwise_equal(f.get_slice(key)[1:2], expected[1:2], f"{name}:{key}[1:2]")
    if deterministic:
        assert rewritten.read_bytes() == original.read_bytes(), f"{name}: rewrite is not byte-identical"


def test_checkpoint_opens_with_python_safetensors(interop_dir):
    root = interop_dir / "ckpt"
    name = (root / "latest").read_text()
    assert name == "iter_0000007\n"
    ckpt = root / name.strip()
    index = json.loads((ckpt / "index.json").read_text())
    assert index["format"] == "mmtrain.sharded_checkpoint" and index["version"] == 2
    assert index["iteration"] == 7 and index["world_size"] == 2
    assert index["files"] == ["rank_00000.safetensors", "rank_00001.safetensors"]
    assert index["plan"] == {"fsdp": "chunk"}
    assert json.loads((ckpt / "trainer_state.json").read_text()) == {"consumed_samples": 70}

    for rank, file in enumerate(index["files"]):
        with safe_open(str(ckpt / file), framework="pt") as f:
            meta = f.metadata()
            assert meta["format"] == "pt"
            assert json.loads(meta["rank_state"]) == {"rank": rank, "rng": [1, 2, rank]}

    # Reassemble every tensor from the rank files, as docs/checkpoint_format.md describes.
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "I64": torch.int64}
    full = {}
    for tensor_name, entry in index["tensors"].items():
        t = torch.empty(entry["shape"], dtype=dtypes[entry["dtype"]])
        for shard in entry["shards"]:
            with safe_open(str(ckpt / shard["file"]), framework="pt") as f:
                if "rows" in shard:
                    begin, end = shard["rows"]
                    if end > begin:
                        t[begin:end] = f.get_tensor(tensor_name)
                else:
                    t = f.get_tensor(tensor_name)
        full[tensor_name] = t
    w = torch.arange(5, dtype=torch.float32)[:, None] * 10 + torch.arange(3, dtype=torch.float32)
    assert_bitwise_equal(full["w"], w, "w")
    assert_bitwise_equal(full["emb"], torch.arange(14, dtype=torch.float32).view(7, 2).bfloat16(), "emb")
    assert_bitwise_equal(full["step"], torch.tensor(42), "step")
    # torch.chunk rows: 5 over 2 ranks is 3 + 2.
    assert [s["rows"] for s in index["tensors"]["w"]["shards"]] == [[0, 3], [3, 5]]
