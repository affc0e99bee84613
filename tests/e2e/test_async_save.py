"""training.async_save: checkpoints written in the background hold what a synchronous save holds
and resume bitwise; a process SIGKILLed at any system call of the background save, or a disk that
fills under it, leaves `latest` naming a complete checkpoint that `mmtrain ckpt verify` passes and
that resumes exactly."""
import json
import os
import shutil
import subprocess

import pytest
import safetensors.torch
import torch
from safetensors import safe_open

from conftest import mmtrain_bin, read_metrics, run_mmtrain, strace_usable, tiny_config, write_config

ASYNC = ["--set", "training.async_save=true"]


def test_async_checkpoints_equal_sync_ones_and_resume_bitwise(tmp_path, token_file):
    runs = {}
    for name, sets in [("sync", []), ("async", ASYNC)]:
        d = tmp_path / name
        d.mkdir()
        cfg = write_config(d / "c.yaml", tiny_config(d, token_file, iters=12, save_interval=3))
        proc = run_mmtrain(["train", str(cfg), *sets, "--set", "training.keep_latest_k=2"], world=2)
        runs[name] = (d, read_metrics(d / "run"), proc.stdout)
    (sync_dir, sync_metrics, _), (async_dir, async_metrics, async_out) = runs["sync"], runs["async"]
    assert [m["loss"] for m in async_metrics] == [m["loss"] for m in sync_metrics]
    assert "checkpoint of iteration 3 staged in" in async_out and "writing it in the background" in async_out
    assert "training.keep_latest_k 2: removed iter_0000003" in async_out, async_out[-3000:]
    # Save iterations record how long the save held training up; the others do not.
    assert [m["iteration"] for m in async_metrics if "checkpoint_stall_ms" in m] == [3, 6, 9, 12]
    assert sorted(p.name for p in (async_dir / "ckpt").glob("iter_*")) == ["iter_0000009", "iter_0000012"]
    for iteration in ("iter_0000009", "iter_0000012"):
        a, b = (d / "ckpt" / iteration for d in (async_dir, sync_dir))
        assert (a / "index.json").read_bytes() == (b / "index.json").read_bytes(), iteration
        for f in ("rank_00000.safetensors", "rank_00001.safetensors"):
            # Equal tensors and shard metadata (the rank_state metadata may differ: it names the node).
            ta, tb = (safetensors.torch.load_file(str(d / f)) for d in (a, b))
            assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), (iteration, f)
            ma, mb = (safe_open(str(d / f), "pt").metadata() for d in (a, b))
            assert ma["shards"] == mb["shards"], (iteration, f)
        states = [json.loads((d / "ckpt" / iteration / "trainer_state.json").read_text()) for d in (async_dir, sync_dir)]
        assert states[0]["config"]["training"]["async_save"] is True
        assert states[1]["config"]["training"]["async_save"] is False
        assert states[0]["config"]["model"] == states[1]["config"]["model"]
        # The runs' paths differ, and each fresh run draws its own lineage.
        assert {**states[0], "config": None, "lineage": None} == {**states[1], "config": None, "lineage": None}

    # Resume from the async run's iteration 9 (a save that completed while training went on); its
    # 12 is another branch now, moved aside (docs/checkpoint_format.md, "Lineage").
    shutil.rmtree(async_dir / "run")
    cfg = async_dir / "c.yaml"
    run_mmtrain(["train", str(cfg), *ASYNC, "--set", f"training.load={async_dir / 'ckpt' / 'iter_0000009'}",
                 "--set", "training.archive_newer_checkpoints=true"], world=2)
    resumed = read_metrics(async_dir / "run")
    assert [m["iteration"] for m in resumed] == [10, 11, 12]
    assert [(m["loss"], m["grad_norm"]) for m in resumed] == [(m["loss"], m["grad_norm"]) for m in sync_metrics[9:]]


def interrupted_run(tmp_path, token_file):
    """A run stopped after its save at iteration 2 (train_iters 6): the next process resumes it and
    makes its first save, the one under test, at iteration 4."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=6, save_interval=2))
    run_mmtrain(["train", str(cfg), *ASYNC, "--set", "training.load=auto", "--set", "training.exit_interval=2"])
    return cfg


def traced(cfg, inject: str, paths) -> subprocess.CompletedProcess:
    """`mmtrain train cfg` (resuming, async saves, to iteration 6) under strace, which tampers with
    the first call of `inject`'s system call on any of `paths`."""
    cmd = ["strace", "-f", "-qq", "-o", "/dev/null", *[a for p in paths for a in ("-P", str(p))],
           "-e", f"trace={inject.split(':')[0]}", "-e", f"inject={inject}",
           str(mmtrain_bin()), "train", str(cfg), *ASYNC, "--set", "training.load=auto"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))


def expect_resumes_from_iteration_2(run_dir, cfg, reference):
    """`latest` names iteration 2, which verifies, and a resume ends equal to the straight run."""
    ckpt = run_dir / "ckpt"
    assert (ckpt / "latest").read_text() == "iter_0000002\n"
    run_mmtrain(["ckpt", "verify", str(ckpt)])
    run_mmtrain(["train", str(cfg), *ASYNC, "--set", "training.load=auto"])
    got = read_metrics(run_dir / "run")
    assert [m["iteration"] for m in got] == list(range(1, 7))
    assert [m["loss"] for m in got] == [m["loss"] for m in reference]


# Every system call of the save of iteration 4 on the paths it writes, in the order they happen:
# rank 0 creates iter_0000004.tmp, the background writer writes its rank file, the background
# commit reads its header back, writes index.json and trainer_state.json, fsyncs the directory,
# renames it into place and rewrites `latest`.
def save_syscalls(ckpt):
    tmp = ckpt / "iter_0000004.tmp"
    points = [("mkdir", tmp)]
    # The rank file is written with O_DIRECT where the filesystem allows (its padded last block is
    # cut back by ftruncate) and buffered elsewhere, where ftruncate is not called: that point
    # then kills nothing and is skipped.
    points += [(call, tmp / "rank_00000.safetensors.tmp") for call in ("openat", "write", "ftruncate", "fsync", "rename")]
    points.append(("openat", tmp / "rank_00000.safetensors"))
    for f in ("index.json.tmp", "trainer_state.json.tmp"):
        points += [(call, tmp / f) for call in ("openat", "write", "fsync", "rename")]
    points += [("openat", tmp), ("fsync", tmp), ("rename", tmp)]
    points += [(call, ckpt / "latest.tmp") for call in ("openat", "write", "fsync", "rename")]
    return points


@pytest.fixture
def reference(tmp_path, token_file):
    """The straight 6-step run the interrupted ones must end equal to (after checking strace works)."""
    why = strace_usable()
    if why:
        pytest.skip(why)
    straight = tmp_path / "straight"
    straight.mkdir()
    cfg = write_config(straight / "c.yaml", tiny_config(straight, token_file, iters=6))
    run_mmtrain(["train", str(cfg), "--set", "training.save="])
    return read_metrics(straight / "run")


def test_sigkill_at_every_system_call_of_a_background_save(tmp_path, token_file, reference):

    for i, (call, path) in enumerate(save_syscalls(tmp_path / "probe" / "ckpt")):
        run_dir = tmp_path / f"kill{i}"
        cfg = interrupted_run(run_dir, token_file)
        target = run_dir / path.relative_to(tmp_path / "probe")
        proc = traced(cfg, f"{call}:signal=SIGKILL:when=1", [target])
        if call == "ftruncate" and proc.returncode == 0:
            shutil.rmtree(run_dir)
            continue
        assert proc.returncode == -9, f"{call} {target}: not killed ({proc.returncode})\n{proc.stderr[-2000:]}"
        expect_resumes_from_iteration_2(run_dir, cfg, reference)
        shutil.rmtree(run_dir)


@pytest.mark.parametrize("call,file", [("write", "iter_0000004.tmp/rank_00000.safetensors.tmp"),
                                       ("fsync", "iter_0000004.tmp/index.json.tmp")])
def test_a_full_disk_under_the_background_save_stops_the_run(tmp_path, token_file, reference, call, file):

    run_dir = tmp_path / "run_dir"
    cfg = interrupted_run(run_dir, token_file)
    proc = traced(cfg, f"{call}:error=ENOSPC:when=1", [run_dir / "ckpt" / file])
    assert proc.returncode != 0
    assert f"{run_dir / 'ckpt' / file}: No space left on device" in proc.stderr, proc.stderr[-3000:]
    assert "still names the previous complete checkpoint" in proc.stderr
    # It stopped at the step boundary after the failure, not at the end of the run.
    assert max(m["iteration"] for m in read_metrics(run_dir / "run")) < 6
    expect_resumes_from_iteration_2(run_dir, cfg, reference)
