"""Issue 47: every file mmtrain reads from a user path is regular, bounded and never waited on;
every file it creates in a directory it does not own is created without following a link; sizes
from flags and files are checked before arithmetic. Each test is one numbered item of the issue
(the DCP items are in tests/parity/test_dcp_interop.py)."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import mmtrain_bin, read_metrics, run_mmtrain, tiny_config, write_config

INT64_MAX = 2 ** 63 - 1


def refused(proc, *needles):
    assert proc.returncode != 0, proc.stdout + proc.stderr
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in stderr:\n{proc.stderr}"
    assert "internal error" not in proc.stderr, proc.stderr


def victim_file(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    return victim


@pytest.fixture
def config(tmp_path, token_file):
    return write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=2))


def test_5_the_write_probe_never_writes_through_a_link(tmp_path, config):
    victim = victim_file(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".mmtrain_write_probe_rank0").symlink_to(victim)
    offload = tmp_path / "offload"
    offload.mkdir()
    (offload / ".mmtrain_write_probe_rank0").symlink_to(victim)
    run_mmtrain(["train", str(config), "--set", "training.save=", "--set", "training.optimizer=adamw_swap",
                 "--set", f"training.offload_dir={offload}"])
    assert victim.read_text() == "precious\n"
    # The probes are new files under names of their own: a planted link is neither followed nor removed.
    for planted in (run_dir / ".mmtrain_write_probe_rank0", offload / ".mmtrain_write_probe_rank0"):
        assert planted.is_symlink() and planted.resolve() == victim
    assert list(offload.iterdir()) == [offload / ".mmtrain_write_probe_rank0"]
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".mmtrain_write_probe") and not p.is_symlink()]


def test_6_plan_json_and_metrics_are_never_written_through_a_link(tmp_path, config):
    victim = victim_file(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "plan.json").symlink_to(victim)
    proc = run_mmtrain(["train", str(config), "--set", "training.save="])
    assert victim.read_text() == "precious\n"
    assert "warning: plan.json: refused:" in proc.stdout and "is a symlink" in proc.stdout, proc.stdout
    assert len(read_metrics(run_dir)) == 2  # the plan is advice: the run goes on

    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").symlink_to(tmp_path / "dangling")
    proc = run_mmtrain(["train", str(config), "--set", "training.save=", "--set", f"logging.output_dir={other}"],
                       check=False)
    refused(proc, "metrics.jsonl: refused:", "is a symlink")
    assert not (tmp_path / "dangling").exists()


def test_a_fifo_at_metrics_jsonl_is_refused_at_start_not_waited_on(tmp_path, config):
    """Issue 65 item 12: the start-up check that refuses an earlier run reads <output_dir>/metrics.jsonl
    through the one no-follow, non-blocking, type-checked open: a FIFO there is named, every time."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / "metrics.jsonl")
    for _ in range(3):
        proc = run_mmtrain(["train", str(config), "--set", "training.save="], check=False, timeout=60)
        refused(proc, "metrics.jsonl: not a regular file (a FIFO, device or socket)")


def test_6_out_paths_refuse_a_dangling_link(tmp_path, config):
    out = tmp_path / "choice.txt"
    out.symlink_to(tmp_path / "elsewhere.txt")
    proc = run_mmtrain(["plan", str(config), "--auto", "--device", "h200", "--nodes", "1", "--devices-per-node", "1",
                        "--seqlen", "16", "--out", str(out)], check=False)
    refused(proc, "exists (remove it first)")
    assert not (tmp_path / "elsewhere.txt").exists()
    proc = run_mmtrain(["measure", "profile", "--out", str(out), "--overwrite"], check=False)
    refused(proc, "is a symlink")
    assert not (tmp_path / "elsewhere.txt").exists()


def test_7_plan_sizes_are_checked_before_arithmetic(config):
    for args in (["--auto", "--device", "h200", "--nodes", "1", "--devices-per-node", "1"], []):
        proc = run_mmtrain(["plan", str(config), *args, "--seqlen", str(INT64_MAX)], check=False)
        refused(proc, f"--seqlen: {INT64_MAX} tokens, more than the 2^32 a sample or micro-batch may hold")


def test_8_a_token_budget_past_int64_is_refused_by_name(config):
    proc = run_mmtrain(["train", str(config), "--set", f"data.dataloader_param.micro_batch_tokens={INT64_MAX}",
                        "--set", "training.save="], check=False)
    refused(proc, "data.dataloader_param.micro_batch_tokens", "at most 2^32")


def test_9_files_read_from_user_paths_are_regular_and_bounded(tmp_path, config):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    for path in (fifo, zero):
        # A device profile: through the config and through plan's --device.
        proc = run_mmtrain(["train", str(config), "--set", f"logging.device_profile={path}", "--set", "training.save="],
                           check=False, timeout=60)
        refused(proc, f"device profile {path}: not a regular file")
        proc = run_mmtrain(["plan", str(config), "--device", str(path)], check=False, timeout=60)
        refused(proc, f"device profile {path}: not a regular file")
        proc = run_mmtrain(["train", str(config), "--set-file", str(path)], check=False, timeout=60)
        refused(proc, f"--set-file {path}: not a regular file")
        run = tmp_path / f"run_{path.stem}"
        run.mkdir()
        (run / "plan.json").symlink_to(path)
        proc = run_mmtrain(["plan", "--calibrate", str(run), "--device", "h200", "--out", str(tmp_path / "x.json")],
                           check=False, timeout=60)
        refused(proc, "plan.json: not a regular file")
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate((16 << 20) + 1)
    proc = run_mmtrain(["plan", str(config), "--device", str(big)], check=False)
    refused(proc, f"device profile {big}: {(16 << 20) + 1} bytes, over the {16 << 20} bytes")


def test_10_a_set_file_that_is_a_directory_is_refused(tmp_path, config):
    proc = run_mmtrain(["train", str(config), "--set-file", str(tmp_path)], check=False)
    refused(proc, f"--set-file {tmp_path}: not a regular file (a directory)")


def calibration_run(tmp_path, step_time):
    run = tmp_path / "calib"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({"device_profile": "h200", "step_time": step_time}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i, "step_time_ms": 100.0}) + "\n"
                                               for i in range(1, 6)))
    return run


def test_11_calibration_inputs_are_checked_for_sign_and_type(tmp_path):
    for step_time, message in (({"gemm_ms": 10.0, "total_ms": -1e9}, "'total_ms' -1e+09 is less than its compute part"),
                               ({"gemm_ms": -5.0, "total_ms": 50.0}, "'gemm_ms' must be >= 0 ms"),
                               ({"gemm_ms": "fast", "total_ms": 50.0}, "'gemm_ms' must be a number, found \"fast\"")):
        run = calibration_run(tmp_path, step_time)
        out = tmp_path / "profile.json"
        proc = run_mmtrain(["plan", "--calibrate", str(run), "--device", "h200", "--out", str(out)], check=False)
        refused(proc, message)
        assert not out.exists()
        for p in run.iterdir():
            p.unlink()
        run.rmdir()


def test_a_profile_with_wrong_types_is_named(tmp_path, config):
    profile = json.loads((mmtrain_bin().parent.parent / "share" / "mmtrain" / "profiles" / "h200.json").read_text())
    profile["name"] = 5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(profile))
    refused(run_mmtrain(["plan", str(config), "--device", str(bad)], check=False),
            f"device profile {bad}: 'name' must be a string, found 5")
    refused(run_mmtrain(["plan", str(config), "--device", str(tmp_path)], check=False),
            "not a regular file (a directory)")


def test_control_characters_in_a_name_are_escaped(tmp_path):
    name = tmp_path / "evil\x1b[2Jname.yaml"
    proc = run_mmtrain(["train", str(name)], check=False)
    assert proc.returncode != 0 and "\x1b" not in proc.stderr and "evil\\x1b[2Jname.yaml" in proc.stderr, proc.stderr


def test_measure_profile_checks_its_arguments_before_measuring(tmp_path):
    proc = run_mmtrain(["measure", "profile", "--out", str(tmp_path / "p.json"), "--disk-dir", str(tmp_path / "none")],
                       check=False, timeout=20)
    refused(proc, "--disk-dir", "is not a directory")
    assert "measure profile: GEMM" not in proc.stderr  # nothing was measured first
