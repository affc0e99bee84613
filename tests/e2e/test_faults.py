"""Faults and damage lose nothing silently: a checkpoint with a flipped bit is refused (and
`mmtrain ckpt verify` finds it), a resume into a different model is refused naming the first
difference, a torchrun restart resumes by itself from `latest` with `training.load: auto` (and a
save iteration's record is on disk before its checkpoint is `latest`), and a fatal signal is reported with its name and a backtrace."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import free_port, mmtrain_bin, read_metrics, run_mmtrain, strace_usable, tiny_config, write_config


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), bit by bit: an independent reference for the checksums mmtrain writes."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


@pytest.fixture(scope="module")
def saved(tmp_path_factory, token_file):
    """A 2-rank run of 6 iterations with checkpoints at 3 and 6."""
    d = tmp_path_factory.mktemp("saved")
    cfg = write_config(d / "c.yaml", tiny_config(d, token_file, iters=6, save_interval=3))
    run_mmtrain(["train", str(cfg)], world=2)
    return d


def test_checksums_match_an_independent_crc32c(saved):
    iter_dir = saved / "ckpt" / "iter_0000006"
    index = json.loads((iter_dir / "index.json").read_text())
    name = "model.layers.0.attn.wq.weight"
    assert name in index["tensors"], sorted(index["tensors"])[:10]
    shard = index["tensors"][name]["shards"][1]
    raw = (iter_dir / shard["file"]).read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])
    begin, end = header[name]["data_offsets"]
    data = raw[8 + header_len + begin:8 + header_len + end]
    assert f"{crc32c(data):08x}" == shard["crc32c"]


def test_a_flipped_bit_stops_the_resume_and_ckpt_verify_finds_it(saved, tmp_path, token_file):
    good = run_mmtrain(["ckpt", "verify", str(saved / "ckpt")])
    assert "iter_0000006" in good.stdout and "shards match their checksums" in good.stdout
    assert json.loads(good.stdout.strip().splitlines()[-1])["ok"] is True

    damaged = tmp_path / "ckpt"
    subprocess.run(["cp", "-r", str(saved / "ckpt"), str(damaged)], check=True)
    rank_file = damaged / "iter_0000006" / "rank_00001.safetensors"
    raw = bytearray(rank_file.read_bytes())
    raw[-3] ^= 0x01  # a mantissa bit of the last tensor's last element
    rank_file.write_bytes(bytes(raw))

    bad = run_mmtrain(["ckpt", "verify", str(damaged)], check=False)
    assert bad.returncode != 0 and str(rank_file) in bad.stderr and "damaged" in bad.stderr, bad.stderr
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=8))
    proc = run_mmtrain(["train", str(cfg), "--set", f"training.load={damaged}"], world=2, check=False)
    assert proc.returncode != 0 and "is damaged" in proc.stderr and "rank_00001.safetensors" in proc.stderr, \
        proc.stderr[-3000:]
    # Only rank 1 reads that file; rank 0 then loses its peer. torchrun's root cause is rank 1's
    # own error (its error file), not rank 0's lost connection.
    root_cause = proc.stderr[proc.stderr.index("Root Cause"):]
    assert "rank      : 1" in root_cause.split("Other Failures")[0] and "is damaged" in root_cause, root_cause


@pytest.mark.parametrize("change, key", [
    ("model.config.num_layers=1", "model.config.num_layers was 2, this config has 1"),
    # Same tensor shapes, another model: 4 query / 2 KV heads of 8 vs 2 / 1 of 16.
    ("model.config.num_heads=2", "model.config.num_heads was 4, this config has 2"),
])
def test_resume_refuses_a_different_model(saved, tmp_path, token_file, change, key):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=8))
    extra = ["--set", "model.config.num_kv_heads=1"] if "num_heads" in change else []
    proc = run_mmtrain(["train", str(cfg), "--set", f"training.load={saved / 'ckpt'}", "--set", change, *extra],
                       world=2, check=False)
    assert proc.returncode != 0 and key in proc.stderr, proc.stderr[-3000:]


def test_a_model_only_checkpoint_with_tensors_the_model_lacks_is_refused(tmp_path, token_file):
    # A 2-layer model-only checkpoint loaded into a 1-layer model: layer 1 would vanish silently.
    two = write_config(tmp_path / "two.yaml", tiny_config(tmp_path, token_file, iters=2))
    run_mmtrain(["fixture", "test_transformer-weights", "--config", str(two), "--out", str(tmp_path / "hf")])
    run_mmtrain(["convert", "test_transformer", "hf-to-ckpt", "--hf_dir", str(tmp_path / "hf"), "--save_dir",
                 str(tmp_path / "base"), "--config", str(two)])
    proc = run_mmtrain(["train", str(two), "--set", f"training.load={tmp_path / 'base'}", "--set",
                        "model.config.num_layers=1"], check=False)
    assert proc.returncode != 0 and "'model.layers.1." in proc.stderr and "does not have" in proc.stderr, \
        proc.stderr[-2000:]


def test_a_save_iterations_record_is_on_disk_before_its_checkpoint_is_latest(tmp_path, token_file):
    """A run killed after checkpoint N became `latest` but before iteration N's metrics record was
    written lost that record for good: the resume starts at N + 1 (a CI run of the torchrun restart
    test below found iteration 20 missing). strace holds the write of record 10 (a save iteration)
    for a minute: while it is held, `latest` must still name iteration 5; killed there and resumed,
    metrics.jsonl has every iteration once."""
    why = strace_usable()
    if why:
        pytest.skip(why)
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=12, save_interval=5))
    metrics = tmp_path / "run" / "metrics.jsonl"
    held_record = ["strace", "-f", "-qq", "-o", "/dev/null", "--seccomp-bpf", "-P", str(metrics), "-e", "trace=write",
                   "-e", "inject=write:delay_enter=60000000:when=10"]
    proc = subprocess.Popen([*held_record, str(mmtrain_bin()), "train", str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
    try:
        written = [tmp_path / "ckpt" / "iter_0000010.tmp" / "rank_00000.safetensors",
                   tmp_path / "ckpt" / "iter_0000010" / "rank_00000.safetensors"]
        deadline = time.time() + 120
        while time.time() < deadline and not any(f.exists() for f in written) and proc.poll() is None:
            time.sleep(0.05)
        assert any(f.exists() for f in written), "the save of iteration 10 never wrote its rank file"
        time.sleep(2.0)  # a commit racing ahead of the held record would be done by now
        assert len(metrics.read_text().splitlines()) == 9
        assert (tmp_path / "ckpt" / "latest").read_text().strip() == "iter_0000005"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    resumed = run_mmtrain(["train", str(cfg), "--set", "training.load=auto"])
    assert "resumed from" in resumed.stdout and "iter_0000005 at iteration 5" in resumed.stdout, resumed.stdout[-2000:]
    assert [m["iteration"] for m in read_metrics(tmp_path / "run")] == list(range(1, 13))


def test_torchrun_restart_resumes_from_latest(tmp_path, token_file):
    """Kill a rank mid-run under torchrun --max-restarts 1: the restarted ranks resume from `latest`
    (training.load: auto) and the loss curve equals an uninterrupted run."""
    straight = tmp_path / "straight"
    straight.mkdir()
    cfg = write_config(straight / "c.yaml", tiny_config(straight, token_file, iters=30))
    run_mmtrain(["train", str(cfg), "--set", "training.save="], world=2)
    reference = read_metrics(straight / "run")

    run_dir = tmp_path / "restarted"
    run_dir.mkdir()
    cfg = write_config(run_dir / "c.yaml", tiny_config(run_dir, token_file, iters=30, save_interval=10))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--nproc-per-node", "2", "--max-restarts", "1", "--master-port", str(free_port()), "--no-python",
           str(mmtrain_bin()), "train", str(cfg), "--set", "training.load=auto"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    metrics = run_dir / "run" / "metrics.jsonl"
    killed = False
    deadline = time.time() + 240
    while time.time() < deadline and not killed:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 15:
            ranks = subprocess.run(["pgrep", "-f", f"{mmtrain_bin()} train {cfg}"], capture_output=True, text=True)
            pids = [int(p) for p in ranks.stdout.split()]
            if pids:
                os.kill(max(pids), signal.SIGKILL)  # one rank dies after iteration 15 (latest = 10)
                killed = True
        time.sleep(0.05)
    output, _ = launcher.communicate(timeout=300)
    assert killed, "the run never reached iteration 15"
    assert launcher.returncode == 0, output[-4000:]
    assert "training.load: auto: resuming from the newest checkpoint" in output, output[-4000:]
    got = read_metrics(run_dir / "run")
    assert [m["iteration"] for m in got] == list(range(1, 31))
    assert [m["loss"] for m in got] == [m["loss"] for m in reference]


@pytest.mark.parametrize("sig, name", [(signal.SIGFPE, "SIGFPE"), (signal.SIGBUS, "SIGBUS"), (signal.SIGILL, "SIGILL"),
                                       (signal.SIGSEGV, "SIGSEGV")])
def test_a_fatal_signal_is_named_with_a_backtrace(tmp_path, token_file, sig, name):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=100000))
    proc = subprocess.Popen([str(mmtrain_bin()), "train", str(cfg), "--set", "training.save="],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -sig, (proc.returncode, err[-2000:])
    assert f"mmtrain: fatal signal {name}" in err and "backtrace:" in err, err[-2000:]


@pytest.mark.parametrize("edit, needles", [
    (lambda s: s.pop("global_batch_size"), ["trainer_state.json", "'global_batch_size' must be an integer, found nothing"]),
    (lambda s: s.update(iteration=-5), ["trainer_state.json", "'iteration' must be in [6, 6], found -5"]),
    (lambda s: s.update(iteration=2 ** 62), ["'iteration' must be in [6, 6]"]),
    (lambda s: s.update(optimizer_step="7"), ["'optimizer_step' must be an integer, found \"7\""]),
    (lambda s: s.update(model_id=3), ["'model_id' must be a string, found 3"]),
])
def test_a_damaged_trainer_state_names_the_file_and_key(saved, tmp_path, token_file, edit, needles):
    damaged = tmp_path / "ckpt"
    subprocess.run(["cp", "-r", str(saved / "ckpt"), str(damaged)], check=True)
    path = damaged / "iter_0000006" / "trainer_state.json"
    state = json.loads(path.read_text())
    edit(state)
    path.write_text(json.dumps(state))
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=8))
    # 1 rank x 2 accumulation steps keeps the saved global batch of 4.
    proc = run_mmtrain(["train", str(cfg), "--set", f"training.load={damaged}", "--set",
                        "training.gradient_accumulation_steps=2"], check=False)
    assert proc.returncode != 0, proc.stdout[-2000:]
    for needle in needles:
        assert needle in proc.stderr, proc.stderr[-2000:]
    assert "internal error" not in proc.stderr and "fatal signal" not in proc.stderr


def test_preflight_refuses_before_building(tmp_path, token_file):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=2))
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    proc = run_mmtrain(["train", str(cfg), "--set", f"training.save={a_file}/ckpt"], check=False)
    assert proc.returncode != 0 and "training.save" in proc.stderr and "cannot be created" in proc.stderr, proc.stderr
    proc = run_mmtrain(["train", str(cfg), "--set", f"model.model_name_or_path={tmp_path / 'no_weights'}"], check=False)
    assert proc.returncode != 0 and "model.model_name_or_path" in proc.stderr and "does not exist" in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_15b_model_on_one_process_is_refused_with_the_numbers(tmp_path):
    """It used to allocate ~245 GB of shards and be OOM-killed with no message."""
    data = tmp_path / "data"
    run_mmtrain(["fixture", "magihuman", "--out", str(data), "--samples", "2", "--video-grid", "1,2,2",
                 "--audio-tokens", "3", "--text-tokens", "2", "--video-channels", "192", "--audio-channels", "64",
                 "--text-channels", "3584"])
    from conftest import REPO
    started = time.time()
    proc = run_mmtrain(["train", str(REPO / "examples/magihuman/magihuman_config_t2av.yaml"),
                        "--set", "model.model_name_or_path=", "--set", "model.checkpoint_path=",
                        "--set", f"data.dataset_param.data_root={data}", "--set", f"training.save={tmp_path / 'ckpt'}",
                        "--set", f"logging.output_dir={tmp_path / 'run'}", "--set", "training.micro_batch_size=1",
                        "--set", "training.gradient_accumulation_steps=1"], check=False)
    assert proc.returncode != 0, proc.stdout[-2000:]
    for needle in ["cannot fit this machine's memory", "fp32 shards 56.99 GiB", "optimizer state 113.99 GiB", "are available"]:
        assert needle in proc.stderr, proc.stderr
    assert time.time() - started < 30
    # Full fine-tuning DPO keeps a frozen reference copy beside: counted too (bf16, one rank).
    proc = run_mmtrain(["train", *proc.args[2:], "--set", "training.objective=dpo"], check=False)
    assert proc.returncode != 0 and "the dpo reference copy 28.54 GiB" in proc.stderr, proc.stderr


def rank_pids(cfg) -> dict:
    """{RANK: pid} of the `mmtrain train cfg` processes running now."""
    found = subprocess.run(["pgrep", "-f", f"{mmtrain_bin()} train {cfg}"], capture_output=True, text=True)
    ranks = {}
    for pid in (int(p) for p in found.stdout.split()):
        try:
            environ = (open(f"/proc/{pid}/environ", "rb").read()).split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                ranks[int(item[5:])] = pid
    return ranks


def test_the_survivors_name_the_killed_rank(tmp_path, token_file):
    """Two torchrun agents as two nodes. Gloo only tells rank 0 that a socket closed; its
    heartbeat check names rank 1, which died on the other node (where node 0's agent cannot see it)."""
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=100000))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    port = str(free_port())
    agents = [subprocess.Popen([torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
                                "--master-addr", "127.0.0.1", "--master-port", port, "--no-python", str(mmtrain_bin()),
                                "train", str(cfg), "--set", "training.save="],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
              for node in (0, 1)]
    metrics = tmp_path / "run" / "metrics.jsonl"
    killed = False
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not killed:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
                ranks = rank_pids(cfg)
                if 1 in ranks:
                    os.kill(ranks[1], signal.SIGKILL)
                    killed = True
            time.sleep(0.05)
        assert killed, "the run never reached iteration 3"
        node0, _ = agents[0].communicate(timeout=120)
        agents[1].communicate(timeout=120)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    assert agents[0].returncode != 0 and agents[1].returncode != 0
    errors = [line for line in node0.splitlines() if "mmtrain: error" in line]
    assert errors and "rank 1 has stopped answering" in errors[0], node0[-4000:]


def stop_rank_1_at_iteration_3(tmp_path, token_file, *extra):
    """Trains on 2 ranks, SIGSTOPs rank 1 after iteration 3; returns (launcher exit code, output,
    seconds from the stop to the survivor's error)."""
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=100000))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()), "--no-python", str(mmtrain_bin()),
           "train", str(cfg), "--set", "training.save=", *extra]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
    metrics = tmp_path / "run" / "metrics.jsonl"
    stopped = None
    try:
        deadline = time.time() + 120
        while time.time() < deadline and stopped is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
                ranks = rank_pids(cfg)
                if 1 in ranks:
                    stopped = ranks[1]
                    os.kill(stopped, signal.SIGSTOP)  # hung: alive, holding its sockets, doing nothing
            time.sleep(0.05)
        assert stopped is not None, "the run never reached iteration 3"
        hung_at = time.time()
        # The survivor's error is the measured moment; then the stopped rank is killed, so that
        # torchrun's teardown does not wait out its 30 s grace on a process that cannot take SIGTERM.
        lines, reported = [], None
        watchdog = threading.Timer(180, launcher.kill)  # a run that never reports ends its output
        watchdog.start()
        try:
            for line in launcher.stdout:
                lines.append(line)
                if "mmtrain: error" in line and reported is None:
                    reported = time.time()
                    os.kill(stopped, signal.SIGKILL)
        finally:
            watchdog.cancel()
        launcher.wait(timeout=60)
        return launcher.returncode, "".join(lines), (reported or time.time()) - hung_at
    finally:
        if stopped is not None:
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(stopped, sig)
                except ProcessLookupError:
                    pass
        if launcher.poll() is None:
            launcher.kill()


def test_a_hung_rank_is_reported_after_parallel_timeout_s(tmp_path, token_file):
    code, output, waited = stop_rank_1_at_iteration_3(tmp_path, token_file, "--set", "parallel.timeout_s=5")
    assert code != 0
    assert waited < 120, "the survivors waited far longer than parallel.timeout_s"
    assert "timed out" in output.lower(), output[-4000:]
    assert "rank 1 has stopped answering" in output, output[-4000:]


def test_a_stopped_rank_is_reported_by_its_silent_heartbeat(tmp_path, token_file):
    # parallel.timeout_s is 120 here: the heartbeat, silent for 10 s, ends the wait long before.
    code, output, waited = stop_rank_1_at_iteration_3(tmp_path, token_file)
    assert code != 0
    assert waited < 60, f"the survivor waited {waited:.0f} s for a rank whose heartbeat stopped"
    assert "rank 1 has stopped answering: its heartbeat in the rendezvous store has been silent for 10 s" in output, \
        output[-4000:]
