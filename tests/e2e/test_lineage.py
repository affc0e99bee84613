"""Lineage of checkpoints in one save root (docs/checkpoint_format.md#lineage): a run resumed from
an older checkpoint (a rollback) refuses to start while newer checkpoints of another branch are
there, names them, and with training.archive_newer_checkpoints moves them aside untouched; its
keep_latest_k then prunes only its own line. A fresh run never saves over another run's
checkpoints. And the default generators a checkpoint saves follow training.seed."""
import json
import struct

from conftest import run_mmtrain, tiny_config, write_config


def checkpoints(root):
    return sorted(p.name for p in root.iterdir() if p.name.startswith("iter_") and (p / "index.json").exists())


def tree_bytes(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_rollback_refuses_then_archives_the_other_branch(tmp_path, token_file):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=16, save_interval=4))
    run_mmtrain(["train", str(cfg)])
    root = tmp_path / "ckpt"
    assert checkpoints(root) == ["iter_0000004", "iter_0000008", "iter_0000012", "iter_0000016"]
    before = tree_bytes(root)

    # The rollback: back to iteration 8 with keep_latest_k 2. Refused, naming 12 and 16; nothing changes.
    rollback = ["--set", f"training.load={root / 'iter_0000008'}", "--set", "training.keep_latest_k=2",
                "--set", f"logging.output_dir={tmp_path / 'rollback'}"]
    proc = run_mmtrain(["train", str(cfg), *rollback], check=False)
    assert proc.returncode != 0
    assert ("holds checkpoints newer than this run's start at iteration 8: iter_0000012, iter_0000016"
            in proc.stderr), proc.stderr
    assert "training.archive_newer_checkpoints: true" in proc.stderr
    assert tree_bytes(root) == before

    # A fresh run into the same root is another lineage too.
    proc = run_mmtrain(["train", str(cfg), "--set", f"logging.output_dir={tmp_path / 'fresh'}"], check=False)
    assert proc.returncode != 0 and "newer than this run's start at iteration 0: iter_0000004" in proc.stderr

    # Archived: moved whole under a name that says so, then the rollback trains 8 -> 16, saving 12
    # and 16 anew and pruning only its own line (4, then 8 once 12 and 16 of this run are there).
    proc = run_mmtrain(["train", str(cfg), *rollback, "--set", "training.archive_newer_checkpoints=true"])
    archives = [p for p in root.iterdir() if p.name.startswith("archived_")]
    assert len(archives) == 1 and archives[0].name.endswith("_branch_at_iter_0000008"), archives
    assert sorted(p.name for p in archives[0].iterdir()) == ["iter_0000012", "iter_0000016"]
    for name, data in before.items():
        if name.startswith(("iter_0000012", "iter_0000016")):
            assert (archives[0] / name).read_bytes() == data, name  # the other branch, bitwise
    assert checkpoints(root) == ["iter_0000012", "iter_0000016"]
    assert (root / "latest").read_text() == "iter_0000016\n"
    assert "removed iter_0000004" in proc.stdout and "removed iter_0000008" in proc.stdout
    # The rollback's 16 is its own (trained from 8 again, same data and seed: the same bytes here,
    # which is why the old one had to go aside rather than be silently replaced).
    state = json.loads((root / "iter_0000016" / "trainer_state.json").read_text())
    old_state = json.loads(before["iter_0000016/trainer_state.json"])
    assert state["lineage"] == old_state["lineage"]  # a resume continues the lineage it loaded


def rng_state(iter_dir, rank=0):
    data = (iter_dir / f"rank_{rank:05d}.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return json.loads(header["__metadata__"]["rank_state"])["cpu_rng_state"]


def test_saved_rng_state_follows_the_seed(tmp_path, token_file):
    states = []
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        d = tmp_path / name
        d.mkdir()
        cfg = write_config(d / "c.yaml", tiny_config(d, token_file, iters=1))
        run_mmtrain(["train", str(cfg), "--set", f"training.seed={seed}"])
        states.append(rng_state(d / "ckpt" / "iter_0000001"))
    assert states[0] == states[1]  # two runs of one seed: the same stream
    assert states[0] != states[2]  # another seed: another stream
