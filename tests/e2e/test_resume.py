"""Resume: 10 steps + save + 10 resumed steps equals 20 straight steps; a 2-rank checkpoint
resumes on 4 ranks; a checkpoint whose global batch cannot be kept on the new world is refused."""
import shutil

from conftest import read_metrics, run_mmtrain, tiny_config, write_config


def test_resume_is_bitwise_identical(tmp_path, token_file):
    straight = tmp_path / "straight"
    straight.mkdir()
    cfg = write_config(straight / "c.yaml", tiny_config(straight, token_file, iters=20))
    run_mmtrain(["train", str(cfg)], world=2)
    expected = read_metrics(straight / "run")

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    cfg = write_config(resumed / "c.yaml", tiny_config(resumed, token_file, iters=20, save_interval=10))
    # Stop at 10 with the 20-step schedule (exit_interval), then resume from the checkpoint.
    run_mmtrain(["train", str(cfg), "--set", "training.exit_interval=10"], world=2)
    shutil.rmtree(resumed / "run")
    run_mmtrain(["train", str(cfg), "--set", f"training.load={resumed / 'ckpt'}"], world=2)
    got = read_metrics(resumed / "run")
    assert [m["iteration"] for m in got] == list(range(11, 21))
    for a, b in zip(got, expected[10:]):
        # CPU kernels, Gloo sums in rank order, counter-based data RNG: nothing may differ.
        assert a["loss"] == b["loss"], (a, b)
        assert a["grad_norm"] == b["grad_norm"], (a, b)
        assert a["lr"] == b["lr"]


def stop_at_10_then_resume_on_4(run_dir, token_file, accum, first_sets, resume_sets):
    """Trains 10 of 20 steps on 2 ranks (micro 2, `first_sets`), resumes on 4 ranks with
    `resume_sets`; returns the resumed run's metrics and its config."""
    run_dir.mkdir()
    cfg = write_config(run_dir / "c.yaml", tiny_config(run_dir, token_file, mbs=2, accum=accum, iters=20))
    run_mmtrain(["train", str(cfg), *first_sets, "--set", "training.exit_interval=10"], world=2)
    shutil.rmtree(run_dir / "run")
    run_mmtrain(["train", str(cfg), *resume_sets, "--set", f"training.load={run_dir / 'ckpt'}"], world=4)
    return read_metrics(run_dir / "run"), cfg


def test_resume_two_rank_checkpoint_on_four_ranks(tmp_path, token_file):
    # Global batch 8 both ways: 2 ranks x micro 2 x accum 2, then 4 ranks x micro 2 x accum 1.
    straight = tmp_path / "straight"
    straight.mkdir()
    cfg = write_config(straight / "c.yaml", tiny_config(straight, token_file, mbs=2, accum=2, iters=20))
    run_mmtrain(["train", str(cfg)], world=2)
    expected = read_metrics(straight / "run")

    # The accumulation set by hand on each world, then derived from a pinned global batch (0 =
    # derive: 2 micro-batches on 2 ranks, 1 on 4).
    moved, _ = stop_at_10_then_resume_on_4(tmp_path / "moved", token_file, 2, [],
                                           ["--set", "training.gradient_accumulation_steps=1"])
    pin = ["--set", "training.global_batch_size=8"]
    pinned, pinned_cfg = stop_at_10_then_resume_on_4(tmp_path / "pinned", token_file, 0, pin, pin)
    for got in (moved, pinned):
        assert [m["iteration"] for m in got] == list(range(11, 21))
        for a, b in zip(got, expected[10:]):
            assert a["global_batch_size"] == 8
            assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]), (a, b)
    # A world whose micro x data-parallel size does not divide the pinned batch is refused with the numbers.
    proc = run_mmtrain(["train", str(pinned_cfg), "--set", "training.global_batch_size=8",
                        "--set", f"training.load={tmp_path / 'pinned' / 'ckpt'}"], world=3, check=False)
    assert proc.returncode != 0
    assert "training.global_batch_size 8 is not a multiple of micro_batch_size * data-parallel size = 2 * 3 = 6" \
        in proc.stderr, proc.stderr[-2000:]


def test_resume_refuses_a_global_batch_it_cannot_keep(tmp_path, token_file):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, mbs=2, accum=1, iters=4))
    run_mmtrain(["train", str(cfg)], world=2)
    # 2 x 2 x 1 = 4 samples per step were consumed; 1 rank x 2 x 1 = 2 cannot continue that run.
    proc = run_mmtrain(["train", str(cfg), "--set", f"training.load={tmp_path / 'ckpt'}",
                        "--set", "training.train_iters=8"], world=1, check=False)
    assert proc.returncode != 0
    assert "global batch size 4" in proc.stderr and "this run has 2" in proc.stderr, proc.stderr


def test_shuffled_epochs_resume_exactly_and_workers_change_nothing(tmp_path, token_file):
    # 64 samples, global batch 2 ranks x 3 = 6: 10 steps per epoch with drop_last (4 dropped), so
    # 20 steps run epochs 0 and 1 in two different permutations.
    loader = ["--set", "data.dataloader_param.shuffle=true", "--set", "data.dataloader_param.drop_last=true"]
    runs = {}
    for name, extra in [("in_order", []), ("straight", loader),
                        ("workers", loader + ["--set", "data.dataloader_param.num_workers=2"])]:
        d = tmp_path / name
        d.mkdir()
        cfg = write_config(d / "c.yaml", tiny_config(d, token_file, mbs=3, iters=20))
        proc = run_mmtrain(["train", str(cfg), *extra], world=2)
        runs[name] = read_metrics(d / "run")
    assert "epoch 1 begins at iteration 11" in proc.stdout, proc.stdout
    assert "64 samples, global batch 6, shuffled every epoch, 10 full steps per epoch" in proc.stdout
    assert [m["epoch"] for m in runs["straight"]] == [0] * 10 + [1] * 10
    # Shuffle is not a no-op, and background loading changes nothing.
    assert [m["loss"] for m in runs["in_order"]] != [m["loss"] for m in runs["straight"]]
    assert [m["loss"] for m in runs["workers"]] == [m["loss"] for m in runs["straight"]]

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    cfg = write_config(resumed / "c.yaml", tiny_config(resumed, token_file, mbs=3, iters=20, save_interval=7))
    run_mmtrain(["train", str(cfg), *loader, "--set", "training.exit_interval=7"], world=2)
    shutil.rmtree(resumed / "run")
    run_mmtrain(["train", str(cfg), *loader, "--set", f"training.load={resumed / 'ckpt'}"], world=2)
    got = read_metrics(resumed / "run")
    assert [m["iteration"] for m in got] == list(range(8, 21))
    assert [(m["loss"], m["grad_norm"]) for m in got] == [(m["loss"], m["grad_norm"]) for m in runs["straight"][7:]]

