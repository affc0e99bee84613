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


def test_resume_two_rank_checkpoint_on_four_ranks(tmp_path, token_file):
    # Global batch 8 both ways: 2 ranks x micro 2 x accum 2, then 4 ranks x micro 2 x accum 1.
    straight = tmp_path / "straight"
    straight.mkdir()
    cfg = write_config(straight / "c.yaml", tiny_config(straight, token_file, mbs=2, accum=2, iters=20))
    run_mmtrain(["train", str(cfg)], world=2)
    expected = read_metrics(straight / "run")

    moved = tmp_path / "moved"
    moved.mkdir()
    cfg = write_config(moved / "c.yaml", tiny_config(moved, token_file, mbs=2, accum=2, iters=20))
    run_mmtrain(["train", str(cfg), "--set", "training.exit_interval=10"], world=2)
    shutil.rmtree(moved / "run")
    run_mmtrain(["train", str(cfg), "--set", "training.gradient_accumulation_steps=1",
                 "--set", f"training.load={moved / 'ckpt'}"], world=4)
    got = read_metrics(moved / "run")
    assert [m["iteration"] for m in got] == list(range(11, 21))
    for a, b in zip(got, expected[10:]):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]), (a, b)


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


def test_a_pinned_global_batch_derives_the_accumulation_on_any_world(tmp_path, token_file):
    """training.global_batch_size 8 with the accumulation left to derive: 2 ranks x micro 2 take 2
    micro-batches a step, 4 ranks take 1, and the resumed run continues the 2-rank one."""
    straight = tmp_path / "straight"
    straight.mkdir()
    cfg = write_config(straight / "c.yaml", tiny_config(straight, token_file, mbs=2, accum=2, iters=8))
    run_mmtrain(["train", str(cfg)], world=2)
    expected = read_metrics(straight / "run")

    pinned = tmp_path / "pinned"
    pinned.mkdir()
    cfg = write_config(pinned / "c.yaml", tiny_config(pinned, token_file, mbs=2, accum=0, iters=8))
    run_mmtrain(["train", str(cfg), "--set", "training.global_batch_size=8", "--set", "training.exit_interval=4"],
                world=2)
    shutil.rmtree(pinned / "run")
    run_mmtrain(["train", str(cfg), "--set", "training.global_batch_size=8",
                 "--set", f"training.load={pinned / 'ckpt'}"], world=4)
    got = read_metrics(pinned / "run")
    assert [m["iteration"] for m in got] == list(range(5, 9))
    for a, b in zip(got, expected[4:]):
        assert a["global_batch_size"] == 8
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]), (a, b)
    # A world whose micro x data-parallel size does not divide the batch is refused with the numbers.
    proc = run_mmtrain(["train", str(cfg), "--set", "training.global_batch_size=8",
                        "--set", f"training.load={pinned / 'ckpt'}"], world=3, check=False)
    assert proc.returncode != 0
    assert "training.global_batch_size 8 is not a multiple of micro_batch_size * data-parallel size = 2 * 3 = 6" \
        in proc.stderr, proc.stderr[-2000:]
