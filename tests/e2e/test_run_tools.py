"""The tools around a run, through the binary: the profiler's traces and memory records, the
figures of `logs plot` / `logs compare --plot`, `ablate`'s table, rerun hygiene (a second run into
the same output_dir is refused; `training.load: auto` resumes), the CLI's messages, and the launch
scripts' seed variable names."""
import json
import os
import subprocess

import pytest

from conftest import REPO, read_metrics, run_mmtrain, tiny_config, write_config

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def trace_event_names(path):
    trace = json.loads(path.read_text())  # Perfetto and chrome://tracing load this JSON
    return {e.get("name", "") for e in trace["traceEvents"]}


def test_profiler_writes_a_trace_per_rank_and_memory_peaks(tmp_path, token_file):
    tools = """tools:
  profile: {enable: true, ranks: [-1], start_step: 2, end_step: 3, record_shapes: true}
  memory_profile: {enable: true}
"""
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=4, extra=tools))
    proc = run_mmtrain(["train", str(cfg)], world=2)
    for rank in (0, 1):
        path = tmp_path / "run" / "profile" / f"rank{rank}.pt.trace.json"
        assert path.exists(), proc.stdout
        names = trace_event_names(path)
        for expected in ["ProfilerStep#2", "ProfilerStep#3", "mmtrain::data", "mmtrain::forward", "mmtrain::backward",
                         "mmtrain::optimizer", "fsdp::all_gather layers.0", "fsdp::reduce_scatter layers.1", "aten::mm"]:
            assert expected in names, f"rank {rank}: no '{expected}' event in {path}"
        assert "ProfilerStep#1" not in names and "ProfilerStep#4" not in names
    assert "profile/rank0.pt.trace.json" in proc.stdout
    records = read_metrics(tmp_path / "run")
    assert [bool(r.get("profiled")) for r in records] == [False, True, True, False]
    for r in records:
        m = r["memory"]
        assert 0 < m["live_start_mb"] <= m["step_peak_mb"]
        assert max(m["data_peak_mb"], m["forward_peak_mb"], m["backward_peak_mb"], m["optimizer_peak_mb"]) \
            == pytest.approx(m["step_peak_mb"])
        assert m["backward_peak_mb"] > m["live_start_mb"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, token_file):
    """The test transformer at two learning rates, 12 iterations each on 1 rank."""
    runs = []
    for name, lr in [("lr3e-3", "3e-3"), ("lr1e-2", "1e-2")]:
        d = tmp_path_factory.mktemp(name)
        cfg = write_config(d / "c.yaml", tiny_config(d, token_file, iters=12))
        run_mmtrain(["train", str(cfg), "--set", f"training.lr={lr}", "--set", "training.save="])
        runs.append((name, d / "run"))
    return runs


def test_logs_plot_and_compare_draw_figures(tmp_path, two_runs):
    (a_name, a), (b_name, b) = two_runs
    png = tmp_path / "runs.png"
    proc = run_mmtrain(["logs", "plot", f"{a_name}={a}", f"{b_name}={b / 'metrics.jsonl'}", "--out", str(png),
                        "--title", "two learning rates"])
    assert f"wrote {png} (2 runs: {a_name}, {b_name})" in proc.stdout
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 20_000
    svg = tmp_path / "runs.svg"
    run_mmtrain(["logs", "plot", str(a), "--out", str(svg)])
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text and "grad norm" in text and "step time" in text

    cmp_png = tmp_path / "cmp.png"
    proc = run_mmtrain(["logs", "compare", str(a), str(b), "--plot", str(cmp_png)])
    assert cmp_png.read_bytes()[:8] == PNG_MAGIC
    assert f"wrote {cmp_png}" in proc.stdout
    assert json.loads(proc.stdout.strip().splitlines()[-1])["loss_rel_diff"] > 0

    bad = run_mmtrain(["logs", "plot", str(a), "--out", str(tmp_path / "x.jpg")], check=False)
    assert bad.returncode != 0 and "expected a .png, .svg or .pdf" in bad.stderr


def test_logs_plot_of_one_run_defaults_into_its_directory_and_skips_odd_sample_entries(tmp_path, two_runs):
    """Issue 65: `logs plot RUN` (as docs/sampling.md writes it) needs no --out: the figure goes into the run
    directory, named by its last iteration, and is never replaced; odd entries under samples/ (a name
    with 20 digits, a file, a link) are not samples and do not stop it."""
    import shutil
    _, run = two_runs[0]
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    samples = copy / "samples"
    samples.mkdir()
    (samples / ("iter_" + "9" * 20)).mkdir()
    (samples / "iter_0000001").write_text("not a directory")
    (samples / "iter_0000002").symlink_to(tmp_path)
    (samples / "notes").mkdir()
    proc = run_mmtrain(["logs", "plot", str(copy)])
    figure = copy / "metrics_iter_0000012.png"
    assert f"wrote {figure}" in proc.stdout and figure.read_bytes()[:8] == PNG_MAGIC
    again = run_mmtrain(["logs", "plot", str(copy)], check=False)
    assert again.returncode != 0 and "exists (the figure of the same iteration); give --out" in again.stderr
    both = run_mmtrain(["logs", "plot", str(copy), str(two_runs[1][1])], check=False)
    assert both.returncode != 0 and "--out is required when plotting 2 runs" in both.stderr


def test_logs_summary_prints_text_then_json(two_runs):
    _, run = two_runs[0]
    lines = run_mmtrain(["logs", "summary", str(run / "metrics.jsonl")]).stdout.strip().splitlines()
    assert lines[0].startswith("run: ") and "12 iterations" in lines[1], lines
    assert json.loads(lines[-1])["iterations"] == 12


def test_ablate_judges_features_against_the_control_repeats(tmp_path, token_file):
    # Deep and wide enough that recompute's saved activations are ~17 MiB (the memory floor is >= 1 MiB).
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, mbs=16, iters=6))
    out = tmp_path / "ablation"
    proc = run_mmtrain(["ablate", str(cfg), "--steps", "6", "--skip", "2", "--control-repeats", "2", "--nproc", "2",
                        "--out", str(out),
                        "--set", "model.config.hidden_size=256", "--set", "model.config.ffn_hidden_size=1024",
                        "--set", "model.config.num_layers=6",
                        "--feature", "no_progress:logging.progress=false",
                        "--feature", "no_recompute:features.recompute=false",
                        "--feature", "lr_x3:training.lr=9e-3"], timeout=600)
    table = json.loads(proc.stdout.strip().splitlines()[-1])
    assert table == json.loads((out / "ablation.json").read_text())
    assert (out / "ablation.png").read_bytes()[:8] == PNG_MAGIC
    assert "| no_recompute |" in (out / "ablation.md").read_text()
    # The repeats run between the features, the last at the end.
    order = [line.split("] ")[1].split(" ")[0] for line in proc.stdout.splitlines()
             if line.startswith("ablate: [") and " done in " in line]
    assert order == ["control", "no_progress", "control_repeat_1", "no_recompute", "lr_x3", "control_repeat_2"], order
    assert len(table["control"]["step_time_ms_per_run"]) == 3
    assert table["noise"]["loss_rel_diff"] == 0.0  # CPU runs are deterministic
    f = {row["name"]: row for row in table["features"]}
    # A switch that changes nothing the step computes lands inside every noise floor.
    assert f["no_progress"]["loss_rel_diff"] == 0.0
    # (Its step time is judged too, but against 2 standard errors: a true null lands outside about
    # 1 time in 20, so this test does not assert it; tests/analysis/ablate_test.cpp checks the rule.)
    inside = f["no_progress"]["inside_noise"]
    assert inside["loss_rel_diff"] and inside["allocated_change_pct"], inside
    assert inside["rss_change_pct"] is None  # reported, not judged
    # Recompute off keeps the activations: same losses, more allocated memory, outside the floor.
    assert f["no_recompute"]["loss_rel_diff"] == 0.0
    assert f["no_recompute"]["allocated_change_pct"] > 10
    assert f["no_recompute"]["inside_noise"]["allocated_change_pct"] is False
    # Another learning rate changes the loss, not the memory.
    assert f["lr_x3"]["loss_rel_diff"] > 1e-3 and f["lr_x3"]["inside_noise"]["loss_rel_diff"] is False
    assert f["lr_x3"]["inside_noise"]["allocated_change_pct"] is True


def test_ablate_names_the_run_that_failed(tmp_path, token_file):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=4))
    proc = run_mmtrain(["ablate", str(cfg), "--steps", "4", "--skip", "1", "--nproc", "1", "--out",
                        str(tmp_path / "a"), "--feature", "typo:training.lrr=1"], check=False)
    assert proc.returncode != 0
    assert "run 'typo' failed" in proc.stderr and "did you mean 'training.lr'" in proc.stderr, proc.stderr


def test_a_rerun_is_refused_and_load_auto_resumes(tmp_path, token_file):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=10, save_interval=5))
    straight_dir = tmp_path / "straight"
    straight_dir.mkdir()
    straight_cfg = write_config(straight_dir / "c.yaml", tiny_config(straight_dir, token_file, iters=10))
    run_mmtrain(["train", str(straight_cfg), "--set", "training.save="], world=2)
    straight = read_metrics(straight_dir / "run")

    # load: auto with no checkpoint yet starts fresh; the run stops at 5 (as if killed after a save).
    run_mmtrain(["train", str(cfg), "--set", "training.load=auto", "--set", "training.exit_interval=5"], world=2)
    again = run_mmtrain(["train", str(cfg)], world=2, check=False)
    assert again.returncode != 0
    assert "already holds a run" in again.stderr and "iterations 1-5" in again.stderr, again.stderr[-2000:]
    proc = run_mmtrain(["train", str(cfg), "--set", "training.load=auto", "--set", "training.keep_latest_k=1"], world=2)
    assert "resum" in proc.stdout.lower()
    # keep_latest_k 1: the checkpoint of iteration 5 went once iteration 10's was complete.
    assert "training.keep_latest_k 1: removed iter_0000005" in proc.stdout, proc.stdout[-2000:]
    assert not (tmp_path / "ckpt" / "iter_0000005").exists() and (tmp_path / "ckpt" / "iter_0000010").exists()
    got = read_metrics(tmp_path / "run")
    assert [m["iteration"] for m in got] == list(range(1, 11))  # each iteration once
    assert [m["loss"] for m in got] == [m["loss"] for m in straight]

    # The run is finished: a requeued `auto` run says so and exits 0; the checkpoint named
    # explicitly is an error that names the iteration and train_iters.
    done = run_mmtrain(["train", str(cfg), "--set", "training.load=auto"], world=2)
    assert "this run has finished, nothing to train" in done.stdout, done.stdout[-2000:]
    named = run_mmtrain(["train", str(cfg), "--set", f"training.load={tmp_path / 'ckpt'}"], world=2, check=False)
    assert named.returncode != 0, named.stdout[-2000:]
    assert "is at iteration 10 and training.train_iters is 10: nothing to train" in named.stderr, named.stderr[-2000:]


def test_cli_names_unknown_commands():
    proc = run_mmtrain(["bogus"], check=False)
    assert proc.returncode == 2 and "'bogus' is not a command of mmtrain" in proc.stderr, proc.stderr
    proc = run_mmtrain(["logs", "plto"], check=False)
    assert proc.returncode == 2 and "did you mean 'plot'" in proc.stderr, proc.stderr


def test_fixture_says_what_it_wrote(tmp_path):
    proc = run_mmtrain(["fixture", "mistral3", "--out", str(tmp_path / "m3"), "--samples", "4"])
    assert "wrote" in proc.stdout and str(tmp_path / "m3") in proc.stdout, proc.stdout


@pytest.mark.parametrize("script, seed_env, expected", [
    ("examples/magihuman/finetune_magihuman_t2av.sh", {"NPUS_PER_NODE": "3", "MAGIHUMAN_NPU_FUSED_OPS": "0"},
     ["--nproc-per-node 3", "model.config.fused_ops=false"]),
    ("examples/magistral/finetune_magistral_2509.sh", {"NPUS_PER_NODE": "5"}, ["--nproc-per-node 5"]),
])
def test_launch_scripts_accept_the_seeds_variable_names(script, seed_env, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC_PER_NODE", "MAGIHUMAN_FUSED_OPS")}
    env.update(seed_env, TORCHRUN="echo")
    proc = subprocess.run(["bash", str(REPO / script)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for text in expected:
        assert text in proc.stdout, proc.stdout
    for name in seed_env:
        assert f"from the seed's {name}" in proc.stderr, proc.stderr


def test_a_second_run_into_the_same_save_root_is_refused_up_front(tmp_path, token_file):
    """A job started twice: the second run stops before training, naming the first's pid; once
    the first is gone (killed), the next run takes its lock over and says whose it was."""
    import signal
    import time
    from conftest import mmtrain_bin
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=100000, save_interval=0))
    first = subprocess.Popen([str(mmtrain_bin()), "train", str(cfg)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        lock = tmp_path / "ckpt" / ".mmtrain.lock"
        deadline = time.time() + 120
        while time.time() < deadline and not (lock.exists() and lock.read_text()):
            assert first.poll() is None, "the first run exited early"
            time.sleep(0.05)
        second = run_mmtrain(["train", str(cfg), "--set", f"logging.output_dir={tmp_path / 'other'}"], check=False)
        assert second.returncode != 0
        assert "is in use by another run" in second.stderr and f"pid {first.pid}," in second.stderr, second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    third = run_mmtrain(["train", str(cfg), "--set", f"logging.output_dir={tmp_path / 'third'}",
                         "--set", "training.train_iters=1"])
    assert f"took over the lock of an earlier run that is gone (host " in third.stdout, third.stdout[-2000:]
    assert f"pid {first.pid}," in third.stdout


def test_tensorboard_reads_the_run_live(tmp_path, token_file):
    """logging.tensorboard: rank 0 writes every record to <output_dir>/tensorboard/ as it trains;
    TensorBoard's own reader (its EventAccumulator, which checks the record CRCs) finds each
    scalar of metrics.jsonl at its step. A resumed run adds a file to the same directory."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=6, save_interval=3))
    run_mmtrain(["train", str(cfg), "--set", "logging.tensorboard=true", "--set", "training.exit_interval=3"], world=2)
    run_mmtrain(["train", str(cfg), "--set", "logging.tensorboard=true", "--set", "training.load=auto"], world=2)
    records = read_metrics(tmp_path / "run")
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    for tag in ("loss", "grad_norm", "lr", "step_time_ms", "tflops_per_device", "phases_ms/forward",
                "phases_max_ms/backward"):
        assert tag in tags, tags
    for key in ("loss", "grad_norm", "lr"):
        got = {e.step: e.value for e in events.Scalars(key)}
        assert sorted(got) == [r["iteration"] for r in records] == list(range(1, 7))
        for r in records:
            assert abs(got[r["iteration"]] - r[key]) <= 1e-6 * abs(r[key]) + 1e-12, (key, r)
    assert len(list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))) == 2

    # Live: while a run is still training, the reader already finds the steps logged so far.
    import time
    from conftest import mmtrain_bin
    live = tmp_path / "live"
    live.mkdir()
    live_cfg = write_config(live / "c.yaml", tiny_config(live, token_file, iters=100000))
    proc = subprocess.Popen([str(mmtrain_bin()), "train", str(live_cfg), "--set", "logging.tensorboard=true",
                             "--set", "training.save="], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.time() + 120
        jsonl = live / "run" / "metrics.jsonl"
        while time.time() < deadline and (not jsonl.exists() or jsonl.read_text().count("\n") < 3):
            assert proc.poll() is None, "the live run exited"
            time.sleep(0.1)
        so_far = EventAccumulator(str(live / "run" / "tensorboard"))
        so_far.Reload()
        steps = [e.step for e in so_far.Scalars("loss")]
        assert proc.poll() is None and len(steps) >= 3 and steps == list(range(1, len(steps) + 1)), steps
    finally:
        proc.kill()
        proc.wait()


def test_each_step_records_the_balance_of_its_ranks(tmp_path, token_file):
    # Equal samples: every rank gets the same predicted work.
    (tmp_path / "even").mkdir()
    cfg = write_config(tmp_path / "even" / "c.yaml", tiny_config(tmp_path / "even", token_file, mbs=2, iters=3))
    run_mmtrain(["train", str(cfg), "--set", "training.save="], world=2)
    even = read_metrics(tmp_path / "even" / "run")
    assert all(r["dp_work_imbalance"] == 1.0 and r["dp_compute_imbalance"] >= 1.0 for r in even), even
    # Tiny MagiHuman, short and long samples alternating in the data set (stems sort s000_long,
    # s000_short, s001_long, ...): with one sample per micro-batch, rank 0 always draws a long one.
    data = tmp_path / "mixed"
    for kind, grid in [("short", "1,2,3"), ("long", "4,4,6")]:
        run_mmtrain(["fixture", "magihuman", "--out", str(tmp_path / kind), "--samples", "4", "--seed", "2",
                     "--video-grid", grid, "--audio-tokens", "5", "--text-tokens", "4", "--video-channels", "16",
                     "--audio-channels", "8", "--text-channels", "24"])
        for sub in ("latents", "audio_latents", "conditions"):
            (data / sub).mkdir(parents=True, exist_ok=True)
            for f in sorted((tmp_path / kind / sub).iterdir()):
                stem = f.name.replace("sample_000", "s").replace(".", f"_{kind}.", 1)
                f.rename(data / sub / stem)
    run_dir = tmp_path / "mixed_run"
    run_mmtrain(["train", str(REPO / "examples/magihuman/magihuman_tiny.yaml"), "--set", "model.model_name_or_path=",
                 "--set", f"data.dataset_param.data_root={data}", "--set", "training.micro_batch_size=1",
                 "--set", "training.train_iters=3", "--set", "training.save=", "--set", f"logging.output_dir={run_dir}"],
                world=2)
    mixed = read_metrics(run_dir)
    # 105 tokens against 15: the long rank carries nearly all the work (its FLOPs over the mean).
    assert all(r["dp_work_imbalance"] > 1.5 for r in mixed), [r["dp_work_imbalance"] for r in mixed]
    # One long and one short micro-batch a step: no assignment does better than this one.
    assert all(r["dp_work_imbalance_bound"] == r["dp_work_imbalance"] for r in mixed)
    assert all(r["dp_work_imbalance_bound"] == 1.0 for r in even)
    assert len({round(r["dp_work_imbalance"], 12) for r in mixed}) == 1  # the same pair of lengths every step
    lines = run_mmtrain(["logs", "summary", str(run_dir / "metrics.jsonl"), "--skip-first", "0"]).stdout.splitlines()
    summary = json.loads(lines[-1])
    assert summary["dp_work_imbalance_median"] == mixed[0]["dp_work_imbalance"]
    assert any("rank balance (max / mean, median): compute" in line for line in lines)
