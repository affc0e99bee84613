"""The offload features: activation offload (`features.enable_activation_offload`), FSDP CPU offload
(`parallel.fsdp_plan.cpu_offload`), AdamW moments swapped to the host tier (`training.optimizer:
adamw_swap`) or to disk (with `training.offload_dir`), and all three together. Tiny MagiHuman and
tiny Magistral on 2 ranks, recompute on, fp32, 20 steps: each trains bitwise like no offload
(losses, grad norms, and every tensor of the checkpoint, moments included); a run resumes bitwise
across the settings; bad settings are refused before training, naming the key; a disk that fails
mid-run stops the run naming the file and errno, and the last checkpoint stays intact."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import mmtrain_bin, read_metrics, run_mmtrain, strace_usable, write_config
import test_magihuman_ranks as magihuman
import test_mistral3_training as mistral3

fixture_dirs = magihuman.fixture_dirs  # tiny MagiHuman data and weights (module fixture)
data = mistral3.data                    # tiny Magistral conversations with images


@pytest.fixture(scope="module")
def mixed_lengths(tmp_path_factory, fixture_dirs):
    """Tiny MagiHuman samples of two odd lengths (21 and 23 tokens: 12 video + 5 or 7 audio + 4
    text), so that a micro-batch of two packs unequal samples; the weights of fixture_dirs."""
    root = tmp_path_factory.mktemp("offload_mixed")
    data_dir, weights = fixture_dirs
    shutil.copytree(data_dir, root / "data")
    run_mmtrain(["fixture", "magihuman", "--out", str(root / "longer"), "--samples", "16", "--seed", "4",
                 "--video-grid", "2,2,3", "--audio-tokens", "7", "--text-tokens", "4", "--video-channels", "16",
                 "--audio-channels", "8", "--text-channels", "24"])
    for sub in ("latents", "audio_latents", "conditions"):
        for f in (root / "longer" / sub).iterdir():
            shutil.copy(f, root / "data" / sub / f.name.replace("sample_", "sample_longer_"))
    return root / "data", weights

ITERS = 20


def offload_dir(tmp: Path) -> Path:
    (tmp / "offload").mkdir(parents=True, exist_ok=True)
    return tmp / "offload"


def on_disk(tmp: Path) -> list:
    return ["--set", "training.optimizer=adamw_swap", "--set", f"training.offload_dir={offload_dir(tmp)}"]


RECOMPUTED = {"magihuman": '["dit.block.layers.{*}"]', "mistral3": '["model.language_model.layers.{*}"]'}


def offload_sets(feature: str, model: str, tmp: Path) -> list:
    """The --set arguments that switch `feature` on."""
    activations = ["--set", "features.enable_activation_offload=true",
                   "--set", f"features.activation_offload_plan.apply_modules={RECOMPUTED[model]}"]
    cpu_offload = ["--set", "parallel.fsdp_plan.cpu_offload=true"]
    return {"activations": activations,
            "activations_no_recompute": activations + ["--set", "features.recompute=false"],
            "cpu_offload": cpu_offload,
            "shards_on_disk": cpu_offload + ["--set", f"training.offload_dir={offload_dir(tmp)}"],
            "swap_host": ["--set", "training.optimizer=adamw_swap"],
            "all_three": activations + cpu_offload + on_disk(tmp)}[feature]


def magihuman_config(tmp: Path, fixture_dirs, iters=ITERS, micro_batch=1) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    data_dir, weights = fixture_dirs
    text = magihuman.config(tmp, data_dir, weights, accum=1, iters=iters)
    return write_config(tmp / "c.yaml", text.replace("micro_batch_size: 1,", f"micro_batch_size: {micro_batch},"))


def mistral3_config(tmp: Path, data, iters=ITERS) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    return write_config(tmp / "c.yaml", mistral3.config(tmp, data, mbs=1, iters=iters, basic_extra=", packing: true"))


def train(cfg: Path, *sets, world=2):
    proc = run_mmtrain(["train", str(cfg), "--set", "training.save_interval=10", *sets], world=world, timeout=600)
    return read_metrics(cfg.parent / "run"), proc


def checkpoint_tensors(iter_dir: Path) -> dict:
    out = {}
    for rank_file in sorted(iter_dir.glob("rank_*.safetensors")):
        for name, tensor in load_file(str(rank_file)).items():
            out[(rank_file.name, name)] = tensor
    return out


def make_config(request, model: str, tmp: Path) -> Path:
    if model == "magihuman":  # two packed samples of unequal odd lengths per micro-batch
        return magihuman_config(tmp, request.getfixturevalue("mixed_lengths"), micro_batch=2)
    return mistral3_config(tmp, request.getfixturevalue("data"))


def assert_bitwise_equal_runs(a_dir: Path, a_metrics, b_dir: Path, b_metrics):
    assert [(m["iteration"], m["loss"], m["grad_norm"]) for m in a_metrics] == \
           [(m["iteration"], m["loss"], m["grad_norm"]) for m in b_metrics]
    a = checkpoint_tensors(a_dir / "ckpt" / f"iter_{ITERS:07d}")
    b = checkpoint_tensors(b_dir / "ckpt" / f"iter_{ITERS:07d}")
    assert a.keys() == b.keys()
    assert any("exp_avg_sq" in name for _, name in a)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert a[key].reshape(-1).view(torch.uint8).equal(b[key].reshape(-1).view(torch.uint8)), key


@pytest.mark.parametrize("model", ["magihuman", "mistral3"])
def test_each_offload_feature_and_all_three_train_bitwise_like_none(tmp_path, request, model):
    none_metrics, _ = train(make_config(request, model, tmp_path / "none"))
    if model == "magihuman":  # micro-batches pack samples of 21 and 23 tokens in varying mixes
        assert len({m["tokens"] for m in none_metrics}) > 1
    moved = {}
    for feature in ("activations", "activations_no_recompute", "cpu_offload", "shards_on_disk", "swap_host",
                    "all_three"):
        run = tmp_path / feature
        metrics, proc = train(make_config(request, model, run), *offload_sets(feature, model, run))
        assert_bitwise_equal_runs(tmp_path / "none", none_metrics, run, metrics)
        moved[feature] = metrics[-1]["offload"]["host"]
        if feature in ("shards_on_disk", "all_three"):  # the shards (and moments) pass through the disk tier
            assert all(m["offload"]["disk"]["read_mib"] > m["offload"]["disk"]["written_mib"] > 0 for m in metrics)
        assert all(m["offload"]["host"]["to_host_mib"] > 0 for m in metrics), feature
    assert "offload" not in none_metrics[-1]
    # What moved is each feature's own traffic: the block inputs out and back, the shards to the
    # device (forward and backward gathers) and the grads back, or the moments through the windows.
    act = moved["activations"]
    assert act["to_host_mib"] == act["to_device_mib"] and act["held_mib"] == 0
    # Without recompute a block keeps every tensor autograd saves in it, not only its input.
    saved = moved["activations_no_recompute"]
    assert saved["to_host_mib"] == saved["to_device_mib"] > act["to_host_mib"] and saved["held_mib"] == 0
    cpu = moved["cpu_offload"]
    assert cpu["to_device_mib"] > cpu["to_host_mib"] > 0 and cpu["held_mib"] > 0
    swap = moved["swap_host"]
    assert swap["to_host_mib"] == swap["to_device_mib"] and swap["held_mib"] > 0
    assert moved["all_three"]["to_host_mib"] == pytest.approx(act["to_host_mib"] + cpu["to_host_mib"])


@pytest.mark.parametrize("model", ["magihuman", "mistral3"])
def test_moments_on_disk_train_bitwise_like_moments_in_ram(tmp_path, request, model):
    make = lambda t: make_config(request, model, t)
    ram_metrics, _ = train(make(tmp_path / "ram"))
    disk_metrics, proc = train(make(tmp_path / "disk"), *on_disk(tmp_path / "disk"))
    assert "AdamW moments on disk in" in proc.stdout and "of windows" in proc.stdout
    assert_bitwise_equal_runs(tmp_path / "ram", ram_metrics, tmp_path / "disk", disk_metrics)
    # Every step streamed the moments through the disk tier, and says so.
    assert all(m["offload"]["disk"]["read_mib"] > 0 and m["offload"]["disk"]["written_mib"] > 0 for m in disk_metrics)
    assert all("offload" not in m for m in ram_metrics)
    # The files are scratch: gone with the run.
    assert list((tmp_path / "disk" / "offload").iterdir()) == []

    # Resume across the settings: from the RAM run's iteration 10 with all three features on
    # (moments on disk), and from the disk run's with none; both end as the straight runs did.
    for source, sets in (("ram", offload_sets("all_three", model, tmp_path / "ram_then_all")), ("disk", [])):
        cfg = make(tmp_path / f"{source}_resumed")
        resumed, proc = train(cfg, "--set", f"training.load={tmp_path / source / 'ckpt' / 'iter_0000010'}", *sets)
        assert "resumed from" in proc.stdout
        assert [(m["loss"], m["grad_norm"]) for m in resumed] == [(m["loss"], m["grad_norm"]) for m in ram_metrics[10:]]


def test_bad_offload_settings_are_refused_before_training(tmp_path, fixture_dirs):
    cfg = magihuman_config(tmp_path / "bad", fixture_dirs, iters=2)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [
        (["--set", "features.enable_activation_offload=true",
          "--set", "features.activation_offload_plan.apply_modules=[dit.block.nothing.{*}]"],
         "features.activation_offload_plan.apply_modules"),
        (["--set", f"training.offload_dir={tmp_path}"], "training.offload_dir: expected empty unless "
                                                        "training.optimizer is adamw_swap or adamw8bit, "
                                                        "parallel.fsdp_plan.cpu_offload is true or "
                                                        "training.ema.offload is disk"),
        (["--set", "training.ema.enable=true", "--set", "training.ema.offload=disk"],
         "training.ema.offload disk: set training.offload_dir"),
        (["--set", "training.ema.offload=host"], "training.ema.offload: host set while training.ema.enable is false"),
        ([*on_disk(tmp_path), "--set", "training.mem_fraction_static=1.5"], "training.mem_fraction_static: "
                                                                            "expected in (0, 1], found 1.5"),
        ([*on_disk(tmp_path), "--set", "training.async_save=true"], "training.async_save: its staging copy would "
                                                                     "hold this rank's weights and moments in host "
                                                                     "RAM, "),
        (["--set", "training.optimizer=adamw_swap", "--set", f"training.offload_dir={tmp_path / 'missing'}"],
         f"training.offload_dir '{tmp_path / 'missing'}' is not a directory"),
        (["--set", "training.optimizer=adamw_swap", "--set", f"training.offload_dir={a_file}"],
         f"training.offload_dir '{a_file}' is not a directory"),
    ]
    for sets, message in cases:
        proc = run_mmtrain(["train", str(cfg), *sets], check=False)
        assert proc.returncode != 0 and message in proc.stderr, (sets, proc.stderr[-2000:])
        assert not (tmp_path / "bad" / "run" / "metrics.jsonl").exists()


def test_a_disk_that_fails_mid_run_stops_it_naming_the_file(tmp_path, fixture_dirs):
    why = strace_usable()
    if why:
        pytest.skip(why)
    cfg = magihuman_config(tmp_path / "run_dir", fixture_dirs, iters=6)
    offload = tmp_path / "run_dir" / "offload"
    offload.mkdir()
    # The 40th write to the moments' file (a few steps in, after the save of iteration 2) fails. The
    # file is unlinked at creation (no path for strace -P), but the run's only other pwrite64 is the
    # save-root lock's, once at start: the 41st pwrite64 is the moments' 40th.
    cmd = ["strace", "-f", "-qq", "-o", "/dev/null", "--seccomp-bpf", "-e", "trace=pwrite64",
           "-e", "inject=pwrite64:error=ENOSPC:when=41", str(mmtrain_bin()), "train", str(cfg),
           "--set", "training.save_interval=2", *on_disk(tmp_path / "run_dir")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode != 0
    assert f"offload file {offload}/mmtrain_rank_00000." in proc.stderr and ".offload: writing " in proc.stderr \
        and "No space left on device" in proc.stderr, proc.stderr[-3000:]
    assert list(offload.iterdir()) == []  # the file went with the process
    done = read_metrics(tmp_path / "run_dir" / "run")
    assert 2 <= len(done) < 6
    latest = (tmp_path / "run_dir" / "ckpt" / "latest").read_text().strip()
    run_mmtrain(["ckpt", "verify", str(tmp_path / "run_dir" / "ckpt" / latest)])
    shutil.rmtree(offload)


def test_two_jobs_on_one_offload_dir_each_train_as_alone(tmp_path, token_file):
    """Two jobs of one YAML started together on one node share offload_dir: each rank file is its
    job's alone (created exclusively under its pid, unlinked at creation), so both train bitwise like
    a job alone (before, the second truncated the first's file and both trained on the mix). The
    start-up write probes are per process too: a file at the name every rank 0 once probed under
    stays another job's (before, the jobs unlinked each other's probes and one failed to start)."""
    from conftest import tiny_config
    offload = tmp_path / "offload"
    offload.mkdir()
    other_jobs_probe = offload / ".mmtrain_write_probe_rank0"
    other_jobs_probe.write_text("probe\n")
    disk = ["--set", "parallel.fsdp_plan.cpu_offload=true", "--set", f"training.offload_dir={offload}"]
    dirs = [tmp_path / name for name in ("alone", "job_a", "job_b")]
    for d in dirs:
        d.mkdir()
        write_config(d / "c.yaml", tiny_config(d, token_file, iters=30))
    run_mmtrain(["train", str(dirs[0] / "c.yaml"), *disk])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    jobs = [subprocess.Popen([str(mmtrain_bin()), "train", str(d / "c.yaml"), *disk], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env) for d in dirs[1:]]
    for job in jobs:
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0, err[-2000:]
    alone = [(m["loss"], m["grad_norm"]) for m in read_metrics(dirs[0] / "run")]
    assert len(alone) == 30
    for d in dirs[1:]:
        assert [(m["loss"], m["grad_norm"]) for m in read_metrics(d / "run")] == alone, d.name
    assert list(offload.iterdir()) == [other_jobs_probe]  # nothing left behind, nothing else's touched
