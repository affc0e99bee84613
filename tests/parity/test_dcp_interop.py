"""PyTorch Distributed Checkpoints in and out (`mmtrain convert test_transformer dcp-to-ckpt /
ckpt-to-dcp`), against the project's PyTorch FSDP2 reference on 2 gloo ranks, fp32.

  * PyTorch trains 5 of 10 steps and saves DCP (get_state_dict: model, optim, train_state).
    mmtrain converts it and trains steps 6-10; PyTorch resumes its own DCP for the same steps:
    per-step losses agree within LOSS_TOL (two implementations from the same state).
  * The same DCP through mmtrain and back (dcp-to-ckpt, then ckpt-to-dcp) resumes PyTorch
    bitwise like the original: nothing is lost or rounded on the way.
  * mmtrain trains 5 steps and saves; ckpt-to-dcp; PyTorch resumes that DCP for steps 6-10 and
    agrees with mmtrain's own resume within LOSS_TOL.
  * Bad DCP input (an unknown key, a missing optimizer entry, a shape mismatch, a truncated
    .distcp file) is an error naming the key or file, and nothing is written.
"""
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp

import config_io
import mmtrain_util as mu
import reference_transformer as rt

WORLD = 2
STEPS, HALF = 10, 5
MODEL = dict(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
             ffn_hidden_size=128, rope_theta=10000.0, rms_norm_eps=1e-6)
LOSS_TOL = 1e-6
MAGIHUMAN_LOSS_TOL = 1e-6


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("dcp_interop")
    model_path, tokens_path = rt.make_fixture(str(d), MODEL, num_samples=64, seq_len=33, seed=2024)
    cfg = mu.mmtrain_config(model_path, tokens_path, MODEL, str(d / "unused"), train_iters=STEPS)
    cfg_path = config_io.write_yaml(cfg, str(d / "config.yaml"))
    # PyTorch: 5 steps, then its DCP; and its own resume of that DCP (steps 6-10).
    torch_dcp = str(d / "torch_dcp")
    rt.train(config_io.apply_overrides(cfg, [f"logging.output_dir={d / 'torch_first'}"]), WORLD, threads=1,
             stop=HALF, dcp_save=torch_dcp)
    resumed = rt.train(config_io.apply_overrides(cfg, [f"logging.output_dir={d / 'torch_resumed'}"]), WORLD,
                       threads=1, dcp_load=torch_dcp)
    return d, cfg, cfg_path, torch_dcp, resumed.metrics


def convert_model(mmtrain_bin, model, *args, check=True):
    proc = subprocess.run([mmtrain_bin, "convert", model, *args], capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def convert(mmtrain_bin, *args, check=True):
    return convert_model(mmtrain_bin, "test_transformer", *args, check=check)


def mmtrain_resume(mmtrain_bin, d, cfg_path, ckpt, name):
    out = d / name
    mu.run_mmtrain(mmtrain_bin, cfg_path, WORLD, str(d / f"{name}.log"),
                   [f"training.load={ckpt}", f"logging.output_dir={out}"])
    return mu.read_metrics(str(out / "metrics.jsonl"))


def worst_rel(a, b):
    assert [m["iteration"] for m in a] == [m["iteration"] for m in b] == list(range(HALF + 1, STEPS + 1))
    return max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b))


def test_torch_dcp_into_mmtrain_and_back(mmtrain_bin, setup, parity_report):
    d, cfg, cfg_path, torch_dcp, torch_resumed = setup
    ckpt = d / "from_torch"
    proc = convert(mmtrain_bin, "dcp-to-ckpt", "--config", cfg_path, "--load_dir", torch_dcp, "--save_dir", str(ckpt))
    assert "AdamW moments and step, iteration 5" in proc.stdout
    ours = mmtrain_resume(mmtrain_bin, d, cfg_path, ckpt, "mmtrain_from_torch")
    worst = worst_rel(ours, torch_resumed)
    parity_report(f"[dcp] PyTorch DCP at step 5 -> mmtrain, steps 6-10 vs PyTorch's own resume: max loss rel {worst:.2e}")
    assert worst <= LOSS_TOL, worst

    # Back out: PyTorch resumes the round-tripped DCP exactly like its own.
    back = str(d / "back_to_torch")
    convert(mmtrain_bin, "ckpt-to-dcp", "--load_dir", str(ckpt), "--save_dir", back)
    again = rt.train(config_io.apply_overrides(cfg, [f"logging.output_dir={d / 'torch_again'}"]), WORLD, threads=1,
                     dcp_load=back)
    assert [(m["loss"], m["grad_norm"], m["lr"]) for m in again.metrics] == \
           [(m["loss"], m["grad_norm"], m["lr"]) for m in torch_resumed]


def test_mmtrain_checkpoint_into_torch(mmtrain_bin, setup, parity_report):
    d, cfg, cfg_path, _, _ = setup
    ckpt = d / "mmtrain_ckpt"
    mu.run_mmtrain(mmtrain_bin, cfg_path, WORLD, str(d / "mmtrain_first.log"),
                   [f"training.save={ckpt}", f"training.exit_interval={HALF}", f"logging.output_dir={d / 'mm_first'}"])
    ours = mmtrain_resume(mmtrain_bin, d, cfg_path, ckpt, "mmtrain_own_resume")
    out = str(d / "mmtrain_dcp")
    proc = convert(mmtrain_bin, "ckpt-to-dcp", "--load_dir", str(ckpt), "--save_dir", out)
    assert "iteration 5" in proc.stdout
    theirs = rt.train(config_io.apply_overrides(cfg, [f"logging.output_dir={d / 'torch_from_mmtrain'}"]), WORLD,
                      threads=1, dcp_load=out).metrics
    worst = worst_rel(theirs, ours)
    parity_report(f"[dcp] mmtrain checkpoint at step 5 -> DCP -> PyTorch, steps 6-10 vs mmtrain's own resume: "
                  f"max loss rel {worst:.2e}")
    assert worst <= LOSS_TOL, worst


def _torch_dcp_with(path, edit):
    """A DCP like the reference's, after edit(state) changed its state dict (one process)."""
    state = {"model": {}, "optim": {"state": {}, "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999),
                                                                   "eps": 1e-8, "weight_decay": 0.01}]},
             "train_state": {"step": 5}}
    for name, shape in rt.param_shapes(rt.ModelConfig.from_dict(MODEL)).items():
        state["model"][name] = torch.randn(shape)
        state["optim"]["state"][name] = {"exp_avg": torch.zeros(shape), "exp_avg_sq": torch.zeros(shape),
                                         "step": torch.tensor(5.0)}
    edit(state)
    dcp.save(state, checkpoint_id=str(path))


@pytest.mark.parametrize("case,edit,message", [
    ("unknown_key", lambda s: s["model"].update(extra_head=torch.zeros(3)),
     "holds 1 key(s) model 'test_transformer' cannot place (nothing written):\n  model.extra_head"),
    ("missing_moment", lambda s: s["optim"]["state"]["norm.weight"].pop("exp_avg_sq"),
     "has optimizer state but no 'exp_avg_sq' for 'norm.weight'"),
    ("shape", lambda s: s["model"].update({"norm.weight": torch.zeros(65)}),
     "'model.norm.weight' has shape [65], the model's 'norm.weight' is [64]"),
])
def test_bad_dcp_input_is_named_and_nothing_is_written(mmtrain_bin, setup, tmp_path, case, edit, message):
    _, _, cfg_path, _, _ = setup
    bad = tmp_path / case
    _torch_dcp_with(bad, edit)
    out = tmp_path / "ckpt"
    proc = convert(mmtrain_bin, "dcp-to-ckpt", "--config", cfg_path, "--load_dir", str(bad), "--save_dir", str(out),
                   check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert not out.exists() or not (out / "latest").exists()
    assert not any(p.name.endswith(".safetensors") for p in tmp_path.iterdir())  # the flat file is gone too
    if case == "unknown_key":  # the same DCP converts when the key is dropped on purpose
        proc = convert(mmtrain_bin, "dcp-to-ckpt", "--config", cfg_path, "--load_dir", str(bad), "--save_dir",
                       str(out), "--drop", "model.extra_*")
        assert "dropped 'model.extra_head' (--drop)" in proc.stdout and (out / "latest").exists()


def test_a_truncated_distcp_file_is_named(mmtrain_bin, setup, tmp_path):
    _, _, cfg_path, torch_dcp, _ = setup
    import shutil
    bad = tmp_path / "truncated"
    shutil.copytree(torch_dcp, bad)
    victim = sorted(p for p in bad.iterdir() if p.suffix == ".distcp")[-1]
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)
    proc = convert(mmtrain_bin, "dcp-to-ckpt", "--config", cfg_path, "--load_dir", str(bad), "--save_dir",
                   str(tmp_path / "ckpt"), check=False)
    assert proc.returncode != 0 and f"{victim}: truncated:" in proc.stderr, proc.stderr
    assert not (tmp_path / "ckpt" / "latest").exists()


# ---------------------------------------------------------------------------------------------
# A DCP directory is data: its pickle runs no code, its file names stay inside it; a conversion
# never writes over what is there unless told to.

def test_a_metadata_pickle_that_would_run_code_is_refused(mmtrain_bin, setup, tmp_path):
    _, _, cfg_path, _, _ = setup
    evil, marker = tmp_path / "evil_dcp", tmp_path / "MARKER"
    evil.mkdir()

    class RunsCode:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    import pickle
    (evil / ".metadata").write_bytes(pickle.dumps(RunsCode()))
    out = tmp_path / "ckpt"
    proc = convert(mmtrain_bin, "dcp-to-ckpt", "--config", cfg_path, "--load_dir", str(evil), "--save_dir", str(out),
                   check=False)
    assert proc.returncode != 0
    assert "refused: the pickle names posix.system, which is not one of the classes DCP metadata is made of" \
        in proc.stderr, proc.stderr
    assert not marker.exists()
    assert not out.exists()  # a conversion that fails leaves no directory it created


def _edited_metadata(dcp_dir, edit):
    """Rewrites dcp_dir/.metadata after edit(metadata) (the test trusts its own pickle)."""
    import pickle
    path = os.path.join(dcp_dir, ".metadata")
    with open(path, "rb") as f:
        metadata = pickle.load(f)
    edit(metadata)
    with open(path, "wb") as f:
        pickle.dump(metadata, f)


def test_dcp_file_names_stay_inside_the_directory(mmtrain_bin, setup, tmp_path):
    _, _, cfg_path, torch_dcp, _ = setup
    import shutil
    outside = tmp_path / "outside.distcp"
    escaping = tmp_path / "escaping"
    shutil.copytree(torch_dcp, escaping)
    first = sorted(p for p in escaping.iterdir() if p.suffix == ".distcp")[0]
    shutil.copy(first, outside)

    def point_outside(metadata):
        for info in metadata.storage_data.values():
            if info.relative_path == first.name:
                info.relative_path = "../outside.distcp"
    _edited_metadata(escaping, point_outside)
    proc = convert(mmtrain_bin, "dcp-to-ckpt", "--config", cfg_path, "--load_dir", str(escaping), "--save_dir",
                   str(tmp_path / "ckpt1"), check=False)
    assert proc.returncode != 0 and "is stored in '../outside.distcp', which is not a plain file name" in proc.stderr, \
        proc.stderr

    linked = tmp_path / "linked"
    shutil.copytree(torch_dcp, linked)
    (linked / first.name).unlink()
    (linked / first.name).symlink_to(outside)
    proc = convert(mmtrain_bin, "dcp-to-ckpt", "--config", cfg_path, "--load_dir", str(linked), "--save_dir",
                   str(tmp_path / "ckpt2"), check=False)
    assert proc.returncode != 0 and f"{linked / first.name}: refused: a symlink" in proc.stderr, proc.stderr


def test_a_conversion_refuses_a_non_empty_target_unless_told(mmtrain_bin, setup, tmp_path):
    _, _, cfg_path, torch_dcp, _ = setup
    target = tmp_path / "target"
    target.mkdir()
    (target / "notes.txt").write_text("someone's notes")
    for args in (["dcp-to-ckpt", "--config", cfg_path, "--load_dir", torch_dcp],):
        proc = convert(mmtrain_bin, *args, "--save_dir", str(target), check=False)
        assert proc.returncode != 0 and f"--save_dir {target} is not empty (it holds notes.txt)" in proc.stderr, \
            proc.stderr
        assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]  # as it was: no lock file left
        assert (target / "notes.txt").read_text() == "someone's notes"
    # --overwrite replaces the contents whole: the notes go, the checkpoint is complete.
    convert(mmtrain_bin, "dcp-to-ckpt", "--config", cfg_path, "--load_dir", torch_dcp, "--save_dir", str(target),
            "--overwrite")
    assert sorted(p.name for p in target.iterdir()) == ["iter_0000005", "latest"]
    # ckpt-to-dcp into a non-empty directory: refused; into a new one: a DCP and nothing else.
    dcp_out = tmp_path / "dcp_out"
    dcp_out.mkdir()
    (dcp_out / "keep.me").write_text("x")
    proc = convert(mmtrain_bin, "ckpt-to-dcp", "--load_dir", str(target), "--save_dir", str(dcp_out), check=False)
    assert proc.returncode != 0 and "is not empty (it holds keep.me)" in proc.stderr, proc.stderr
    fresh = tmp_path / "dcp_fresh"
    convert(mmtrain_bin, "ckpt-to-dcp", "--load_dir", str(target), "--save_dir", str(fresh))
    names = sorted(p.name for p in fresh.iterdir())
    assert ".metadata" in names and not [n for n in names if n.startswith(".convert-")], names


# ---------------------------------------------------------------------------------------------
# Tiny MagiHuman against the project's reference DiT under FSDP2 (bench/torch_magihuman_fsdp.py):
# its DCP names parameters by their HF keys and holds the HF rows (`--layout hf`), while mmtrain
# trains on the de-interleaved SwiGLU7 rows.

MAGIHUMAN_KNOBS = dict(LAYERS="4", HIDDEN="64", HEAD_DIM="16", KV_HEADS="2", VIDEO_GRID="2,2,3", AUDIO_TOKENS="5",
                       TEXT_TOKENS="4", SAMPLES="8", STEPS="8", WARMUP="2", WORLD="2", SEED="7")
REFERENCE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench",
                         "torch_magihuman_fsdp.py")


def reference_dit(d, *args):
    env = dict(os.environ, **MAGIHUMAN_KNOBS, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, REFERENCE, *args, "--dir", str(d)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def magihuman_bench(mmtrain_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("magihuman_dcp") / "bench"
    reference_dit(d, "prepare", "--mmtrain", mmtrain_bin)
    return d


def test_magihuman_reference_dcp_into_mmtrain_and_back(mmtrain_bin, magihuman_bench, tmp_path, parity_report):
    d = magihuman_bench
    torch_dcp = str(tmp_path / "torch_dcp")
    reference_dit(d, "torch", "--out", str(tmp_path / "first"), "--stop", str(HALF), "--dcp-save", torch_dcp)
    reference_dit(d, "torch", "--out", str(tmp_path / "resumed"), "--dcp-load", torch_dcp)
    theirs = mu.read_metrics(str(tmp_path / "resumed" / "metrics.jsonl"))

    ckpt = tmp_path / "from_torch"
    proc = convert_model(mmtrain_bin, "magihuman", "dcp-to-ckpt", "--config", str(d / "bench.yaml"), "--load_dir",
                         torch_dcp, "--save_dir", str(ckpt), "--layout", "hf")
    assert "AdamW moments and step, iteration 5" in proc.stdout
    ours = mmtrain_resume(mmtrain_bin, tmp_path, str(d / "bench.yaml"), ckpt, "mmtrain_from_torch")
    worst = worst_rel(ours, theirs)
    parity_report(f"[dcp] MagiHuman reference DiT DCP at step 5 -> mmtrain, steps 6-10 vs the reference's own "
                  f"resume: max loss rel {worst:.2e}")
    assert worst <= MAGIHUMAN_LOSS_TOL, worst

    back = str(tmp_path / "back")
    convert_model(mmtrain_bin, "magihuman", "ckpt-to-dcp", "--load_dir", str(ckpt), "--save_dir", back, "--layout", "hf")
    reference_dit(d, "torch", "--out", str(tmp_path / "again"), "--dcp-load", back)
    again = mu.read_metrics(str(tmp_path / "again" / "metrics.jsonl"))
    assert [(m["loss"], m["grad_norm"]) for m in again] == [(m["loss"], m["grad_norm"]) for m in theirs]


def test_magihuman_mmtrain_checkpoint_into_the_reference(mmtrain_bin, magihuman_bench, tmp_path, parity_report):
    d = magihuman_bench
    ckpt = tmp_path / "mmtrain_ckpt"
    mu.run_mmtrain(mmtrain_bin, str(d / "bench.yaml"), WORLD, str(tmp_path / "first.log"),
                   [f"training.save={ckpt}", f"training.exit_interval={HALF}", f"logging.output_dir={tmp_path / 'first'}"])
    ours = mmtrain_resume(mmtrain_bin, tmp_path, str(d / "bench.yaml"), ckpt, "own_resume")
    out = str(tmp_path / "mmtrain_dcp")
    convert_model(mmtrain_bin, "magihuman", "ckpt-to-dcp", "--load_dir", str(ckpt), "--save_dir", out, "--layout", "hf")
    reference_dit(d, "torch", "--out", str(tmp_path / "reference"), "--dcp-load", out)
    theirs = mu.read_metrics(str(tmp_path / "reference" / "metrics.jsonl"))
    worst = worst_rel(theirs, ours)
    parity_report(f"[dcp] MagiHuman mmtrain checkpoint at step 5 -> DCP -> reference DiT, steps 6-10 vs mmtrain's "
                  f"own resume: max loss rel {worst:.2e}")
    assert worst <= MAGIHUMAN_LOSS_TOL, worst


def test_a_torchtitan_layout_converts(mmtrain_bin, setup, tmp_path):
    """torchtitan's layout: the model's FQNs at the top level, "optimizer" and "lr_scheduler" keys, and
    train_state.step as a tensor."""
    _, _, cfg_path, _, _ = setup

    def torchtitan(state):
        state.update(state.pop("model"))
        state["optimizer"] = state.pop("optim")
        state["lr_scheduler"] = {"last_epoch": 5, "_step_count": 6}
        state["train_state"] = {"step": torch.tensor(5)}
    _torch_dcp_with(tmp_path / "titan", torchtitan)
    proc = convert(mmtrain_bin, "dcp-to-ckpt", "--config", cfg_path, "--load_dir", str(tmp_path / "titan"),
                   "--save_dir", str(tmp_path / "ckpt"))
    assert "AdamW moments and step, iteration 5" in proc.stdout
    assert (tmp_path / "ckpt" / "latest").read_text() == "iter_0000005\n"


# ---------------------------------------------------------------------------------------------
# Issue 47: what the .metadata claims is checked in the form it is opened in; no FIFO is waited on;
# no bytes entry or tensor expands past what backs it.

def _convert_refused(mmtrain_bin, cfg_path, dcp_dir, out):
    proc = subprocess.run([mmtrain_bin, "convert", "test_transformer", "dcp-to-ckpt", "--config", cfg_path,
                           "--load_dir", str(dcp_dir), "--save_dir", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert not out.exists()  # no lock, no staging directory, nothing of a conversion left
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".convert-")]
    return proc


class _LyingPath:
    """Pickles as pathlib.PosixPath('/elsewhere/...') carrying a cached string of a plain name:
    str() of the object PyTorch's unpickler would build says 'name', opening it reads 'target'."""

    def __init__(self, target, name):
        self.target, self.name = target, name

    def __reduce__(self):
        import pathlib
        return (pathlib.PosixPath, (self.target,), (None, {"_str": self.name}))


def test_a_path_object_cannot_say_one_name_and_open_another(mmtrain_bin, setup, tmp_path):
    _, _, cfg_path, torch_dcp, _ = setup
    import shutil
    lying = tmp_path / "lying"
    shutil.copytree(torch_dcp, lying)
    first = sorted(p for p in lying.iterdir() if p.suffix == ".distcp")[0]
    secret = tmp_path / "elsewhere" / "secret.distcp"
    secret.parent.mkdir()
    shutil.copy(first, secret)

    def lie(metadata):
        for info in metadata.storage_data.values():
            if info.relative_path == first.name:
                info.relative_path = _LyingPath(str(secret), first.name)
    _edited_metadata(lying, lie)
    proc = _convert_refused(mmtrain_bin, cfg_path, lying, tmp_path / "ckpt")
    assert "refused" in proc.stderr or "not a DCP metadata pickle" in proc.stderr, proc.stderr

    # A path object without a cached string is rebuilt from its parts, and the absolute name refused.
    plain = tmp_path / "plain_path"
    shutil.copytree(torch_dcp, plain)

    def absolute(metadata):
        import pathlib
        for info in metadata.storage_data.values():
            if info.relative_path == first.name:
                info.relative_path = pathlib.PosixPath(str(secret))
    _edited_metadata(plain, absolute)
    proc = _convert_refused(mmtrain_bin, cfg_path, plain, tmp_path / "ckpt")
    assert f"is stored in '{secret}', which is not a plain file name" in proc.stderr, proc.stderr


def test_a_fifo_as_a_data_file_is_refused_not_waited_on(mmtrain_bin, setup, tmp_path):
    _, _, cfg_path, torch_dcp, _ = setup
    import shutil
    with_fifo = tmp_path / "fifo"
    shutil.copytree(torch_dcp, with_fifo)
    first = sorted(p for p in with_fifo.iterdir() if p.suffix == ".distcp")[0]
    first.unlink()
    os.mkfifo(first)
    proc = _convert_refused(mmtrain_bin, cfg_path, with_fifo, tmp_path / "ckpt")
    assert f"{first}: not a regular file" in proc.stderr, proc.stderr


def test_a_bytes_entry_of_shared_references_does_not_expand(mmtrain_bin, setup, tmp_path):
    _, _, cfg_path, _, _ = setup
    laughs = [1]
    # 2^18 leaves in a few hundred bytes pickled: past the reader's 100000-element bound, which
    # refuses it; and cheap for DCP's own save, which walks every leaf (2^22 took it 14 s).
    for _ in range(18):
        laughs = [laughs, laughs]
    bad = tmp_path / "laughs"
    _torch_dcp_with(bad, lambda s: s["train_state"].update(step=laughs))
    import time
    began = time.monotonic()
    proc = _convert_refused(mmtrain_bin, cfg_path, bad, tmp_path / "ckpt")
    assert "refused: the value has more than 100000 elements" in proc.stderr, proc.stderr
    assert time.monotonic() - began < 60


def test_a_tensor_declaring_more_than_its_bytes_is_refused_before_it_is_built(mmtrain_bin, setup, tmp_path):
    _, _, cfg_path, torch_dcp, _ = setup
    import shutil
    big = tmp_path / "amplified"
    shutil.copytree(torch_dcp, big)

    def amplify(metadata):
        entry = metadata.state_dict_metadata["model.norm.weight"]
        entry.size = torch.Size([2 ** 27])
        for chunk in entry.chunks:
            chunk.sizes = torch.Size([2 ** 27])
    _edited_metadata(big, amplify)
    proc = _convert_refused(mmtrain_bin, cfg_path, big, tmp_path / "ckpt")
    assert "refused: 'model.norm.weight' declares shape [134217728] (536870912 bytes of torch.float32) but its " \
           "stored data is" in proc.stderr, proc.stderr


def test_negative_offsets_are_named_without_a_traceback(mmtrain_bin, setup, tmp_path):
    _, _, cfg_path, torch_dcp, _ = setup
    import shutil
    bad = tmp_path / "negative"
    shutil.copytree(torch_dcp, bad)

    def negative(metadata):
        next(iter(metadata.storage_data.values())).offset = -5
    _edited_metadata(bad, negative)
    proc = _convert_refused(mmtrain_bin, cfg_path, bad, tmp_path / "ckpt")
    assert "(non-negative integers expected)" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
