"""scripts/gpu_check.py without a GPU: every check on the CPU (--device cpu, --width tiny), through
the CPU build. It tests the script, its JSON, and the tests and metrics it relies on; the GPU side
of each comparison is the CPU here, so parity is exact (docs/gpu.md)."""
import json
import os
import subprocess
import sys

from conftest import REPO, mmtrain_bin


def run_gpu_check(out, *args, timeout=600):
    build = mmtrain_bin().parent.parent
    return subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--build", str(build), "--out", str(out),
                           "--device", "cpu", "--width", "tiny", *args],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_every_check_runs_on_the_cpu_and_writes_its_json(tmp_path):
    proc = run_gpu_check(tmp_path, "--features", "none,adamw_swap")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["checks"] == {name: "ok" for name in ["comm", "tiny_parity", "attention", "magihuman_real", "sampling",
                                                          "qlora", "offload"]}

    comm = json.loads((tmp_path / "comm.json").read_text())
    assert [t["name"] for t in comm["tests"]] == ["DeviceComm.EveryCollectiveOfOneRankOnTheRunsDevice"]
    attention = json.loads((tmp_path / "attention.json").read_text())
    assert sorted(t["name"] for t in attention["tests"]) == ["Masks/DeviceAttention.PackedSamplesMatchEachSampleAlone/causal",
                                                            "Masks/DeviceAttention.PackedSamplesMatchEachSampleAlone/full"]

    parity = json.loads((tmp_path / "tiny_parity.json").read_text())
    assert [(r["model"], r["feature"]) for r in parity["runs"]] == [
        ("magihuman", "none"), ("magihuman", "adamw_swap"), ("mistral3", "none"), ("mistral3", "adamw_swap")]
    for run in parity["runs"]:
        assert [i["iteration"] for i in run["iterations"]] == [1, 2]
        for i in run["iterations"]:  # the CPU against itself: the same numbers
            assert i["loss"][0] == i["loss"][1] and i["grad_norm"][0] == i["grad_norm"][1], run

    real = json.loads((tmp_path / "magihuman_real.json").read_text())
    assert real["measured_bf16_gemm_flops"] > 0 and real["datasheet_bf16_flops"] == 989.5e12
    for arm in ["seed_config", "mlp_layout_transform_off"]:
        result = real["arms"][arm]
        assert result["step_time_ms"] > 0 and result["tflops_per_device"] > 0, result
        assert 0 < result["mfu_datasheet"] < result["mfu_measured_gemm"], result
        assert len(result["loss"]) == 4 and all(0 < loss < 10 for loss in result["loss"]), result

    sampling = json.loads((tmp_path / "sampling.json").read_text())
    assert sampling["samples_s"] > 0 and sampling["predicted_samples_s"] > 0 and sampling["predicted_forwards"] == 8
    assert sampling["sample_peak_device_allocated_mb"] is None  # no CUDA allocator on the CPU

    qlora = json.loads((tmp_path / "qlora.json").read_text())["arms"]
    assert qlora["nf4"]["fsdp_gather_mib"] == qlora["none"]["fsdp_gather_mib"] == 0  # one rank gathers nothing from others
    assert qlora["nf4"]["step_time_ms"] > 0 and len(qlora["nf4"]["loss"]) == 3

    offload = json.loads((tmp_path / "offload.json").read_text())
    assert set(offload["features"]) == {"none", "activation_offload", "adamw_swap", "cpu_offload"}
    for feature, result in offload["features"].items():
        assert result["step_time_ms"] > 0 and result["peak_rss_mb"] > 0, (feature, result)
        assert result["peak_device_allocated_mb"] is None  # no CUDA allocator on the CPU
    assert offload["saves"]["sync"]["checkpoint_stall_ms"][1] > 0  # iteration 2 saved
    assert offload["saves"]["async"]["checkpoint_stall_ms"][1] is not None


def test_an_unknown_check_is_refused_by_name(tmp_path):
    proc = run_gpu_check(tmp_path, "--only", "comm,nccl_speed")
    assert proc.returncode != 0 and "nccl_speed" in proc.stderr


def test_a_failing_check_fails_the_run_and_says_which(tmp_path):
    # A build folder without the binaries: every check fails, each with its error, none hangs.
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--build", str(tmp_path / "nothing"),
                           "--out", str(tmp_path / "out"), "--device", "cpu", "--width", "tiny", "--only", "comm,tiny_parity"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["checks"]["comm"] == "FAILED" and summary["checks"]["tiny_parity"] == "FAILED"
    assert summary["checks"]["magihuman_real"] == "not asked for"
    assert "error" in json.loads((tmp_path / "out" / "comm.json").read_text())
