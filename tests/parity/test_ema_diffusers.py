"""training.ema against diffusers' EMAModel (PyPI) on the same weight trajectory (optim/ema.h).

A tiny MagiHuman trains 5 steps, full fine-tuning, saving every step. diffusers' EMAModel, fed the
trained weights each checkpoint holds (`model.*`), one `step()` per EMA update (every update_every
optimizer steps), must end with exactly the shadows the last checkpoint holds (`ema.*`), bitwise:
with the warm-up off and on, update_after_step, min_decay and update_every 2. The EMA on 2 ranks
equals 1 rank; a run stopped and resumed keeps it bitwise; `ckpt-to-hf --ema` exports it (with
decay 0 the EMA is the weights: byte-identical to the plain export); and a checkpoint with or
without EMA weights continues only a run that keeps them or not, by name.
"""
import math
from pathlib import Path
import sys

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import reference_magihuman as R  # noqa: E402
import mmtrain_util as mu  # noqa: E402

diffusers_training = pytest.importorskip("diffusers.training_utils")
_e2e = mu.e2e_helpers()
run_mmtrain, write_config, mmtrain_bin = _e2e.run_mmtrain, _e2e.write_config, _e2e.mmtrain_bin

TINY = R.make_config(num_layers=2, hidden_size=64, head_dim=16, num_query_groups=2, video_in_channels=16,
                     audio_in_channels=8, text_in_channels=24, mm_layers=[0], gelu7_layers=[0])
STEPS = 5
CASES = {
    "plain": {"decay": 0.9, "update_after_step": 1},
    "warmup": {"decay": 0.999, "min_decay": 0.2, "use_ema_warmup": True, "inv_gamma": 1.5, "power": 0.75},
    "every2": {"decay": 0.95, "update_every": 2},
}


class Setup:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.weights, self.data = tmp / "weights", tmp / "data"
        training = {"micro_batch_size": 2, "global_batch_size": 4, "seed": 7, "lr": 1.0e-2,
                    "lr_decay_style": "constant", "weight_decay": 0.0, "clip_grad": 1.0, "train_iters": STEPS}
        self.cfg = write_config(tmp / "ema.yaml", mu.magihuman_yaml("EMA parity: the tiny MagiHuman", TINY,
                                                                    self.weights, self.data, training, tmp / "run"))
        run_mmtrain(["fixture", "magihuman-weights", "--config", str(self.cfg), "--out", str(self.weights), "--seed", "3"])
        run_mmtrain(["fixture", "magihuman", "--out", str(self.data), "--samples", "8", "--seed", "4", "--video-grid",
                     "2,2,3", "--audio-tokens", "5", "--text-tokens", "7", "--video-channels", "16",
                     "--audio-channels", "8", "--text-channels", "24"])
        self.runs = {}

    def initial_weights(self) -> dict:
        """The fixture's weights in mmtrain's own layout (a model-only checkpoint of them)."""
        ckpt = self.tmp / "initial_ckpt"
        if not ckpt.exists():
            run_mmtrain(["convert", "magihuman", "hf-to-ckpt", "--hf_dir", str(self.weights), "--save_dir", str(ckpt)])
        found = sorted(ckpt.glob("iter_*"))
        return mu.checkpoint_tensors(found[-1] if found else ckpt)

    def train(self, name, ema: dict, world=1, extra=()):
        """A run saving every step; its save root."""
        if name not in self.runs:
            save = self.tmp / name / "ckpt"
            args = ["train", str(self.cfg), "--set", f"logging.output_dir={self.tmp / name}", "--set",
                    f"training.save={save}", "--set", "training.save_interval=1", *extra]
            for key, value in {"enable": True, **ema}.items():
                args += ["--set", f"training.ema.{key}={str(value).lower() if isinstance(value, bool) else value}"]
            run_mmtrain(args, world=world, timeout=600)
            self.runs[name] = save
        return self.runs[name]


@pytest.fixture(scope="module")
def ema_setup(tmp_path_factory):
    mmtrain_bin()
    return Setup(tmp_path_factory.mktemp("ema"))


def iter_dir(save: Path, step: int) -> Path:
    return save / f"iter_{step:07d}"


@pytest.mark.parametrize("case", list(CASES))
def test_the_shadows_are_diffusers_emamodels_bitwise(ema_setup, case):
    settings = CASES[case]
    save = ema_setup.train(case, settings)
    every = settings.get("update_every", 1)
    trajectory = [mu.checkpoint_tensors(iter_dir(save, s)) for s in range(1, STEPS + 1)]
    names = sorted(k[len("ema."):] for k in trajectory[-1] if k.startswith("ema."))
    assert names and all(f"model.{n}" in trajectory[-1] for n in names)
    # EMAModel starts from the weights before the first step, as a training script builds it: the
    # first update's decay is 0, but s - (s - w) rounds unless s is the start mmtrain's shadow had.
    start = ema_setup.initial_weights()
    params = [torch.nn.Parameter(start[f"model.{n}"].clone()) for n in names]
    ema = diffusers_training.EMAModel(params, **{k: v for k, v in settings.items() if k != "update_every"})
    for step in range(every, STEPS + 1, every):
        with torch.no_grad():
            for p, n in zip(params, names):
                p.copy_(trajectory[step - 1][f"model.{n}"])
        ema.step(params)
    want, got = ema.shadow_params, [trajectory[-1][f"ema.{n}"] for n in names]
    assert ema.optimization_step == STEPS // every
    moved = max((w - trajectory[-1][f"model.{n}"]).abs().max().item() for w, n in zip(want, names))
    assert moved > 0, "the EMA equals the weights: the comparison would be vacuous"
    different = [n for n, a, b in zip(names, got, want) if not torch.equal(a, b)]
    assert not different, f"{len(different)} shadows differ from diffusers' (first {different[0]})"


def test_two_ranks_equal_one_and_a_resume_is_bitwise(ema_setup):
    one = mu.checkpoint_tensors(iter_dir(ema_setup.train("plain", CASES["plain"]), STEPS))
    two = mu.checkpoint_tensors(iter_dir(ema_setup.train("plain_2ranks", CASES["plain"], world=2), STEPS))
    for name in (k for k in one if k.startswith("ema.")):
        scale = one[name].norm().item()
        assert (two[name] - one[name]).norm().item() <= 1e-6 * max(scale, 1e-12), name
    stopped = ema_setup.train("plain_stopped", CASES["plain"], extra=("--set", "training.exit_interval=2"))
    assert not iter_dir(stopped, 3).exists()
    run_mmtrain(["train", str(ema_setup.cfg), "--set", f"logging.output_dir={ema_setup.tmp / 'plain_stopped'}",
                 "--set", f"training.save={stopped}", "--set", "training.save_interval=1", "--set", "training.load=auto",
                 "--set", "training.ema.enable=true", "--set", "training.ema.decay=0.9", "--set",
                 "training.ema.update_after_step=1"])
    resumed = mu.checkpoint_tensors(iter_dir(stopped, STEPS))
    for name in (k for k in one if k.startswith("ema.")):
        assert torch.equal(resumed[name], one[name]), name


def test_the_export_and_the_refusals(ema_setup):
    tmp = ema_setup.tmp
    plain = ema_setup.train("plain", CASES["plain"])
    zero = ema_setup.train("zero_decay", {"decay": 0.0})
    for name, save, ema in (("zero_plain", zero, False), ("zero_ema", zero, True), ("plain_ema", plain, True),
                            ("plain_weights", plain, False)):
        run_mmtrain(["convert", "magihuman", "ckpt-to-hf", "--load_dir", str(iter_dir(save, STEPS)), "--save_dir",
                     str(tmp / name), "--model_assets_dir", str(ema_setup.weights), *(["--ema"] if ema else [])])
    files = lambda d: sorted(p.name for p in d.glob("*.safetensors"))  # noqa: E731
    assert all((tmp / "zero_ema" / f).read_bytes() == (tmp / "zero_plain" / f).read_bytes() for f in files(tmp / "zero_ema"))
    ema, weights = R.load_hf(tmp / "plain_ema"), R.load_hf(tmp / "plain_weights")
    assert any(not torch.equal(ema[k], weights[k]) for k in ema)
    # Continuing a checkpoint needs the same choice about the EMA.
    proc = run_mmtrain(["train", str(ema_setup.cfg), "--set", f"training.load={iter_dir(plain, 2)}", "--set",
                        f"logging.output_dir={tmp / 'no_ema'}", "--set", f"training.save={tmp / 'no_ema_ckpt'}"],
                       check=False)
    assert proc.returncode != 0 and "it holds EMA weights (training.ema)" in proc.stderr, proc.stderr[-1500:]
    run_mmtrain(["train", str(ema_setup.cfg), "--set", f"logging.output_dir={tmp / 'without'}", "--set",
                 f"training.save={tmp / 'without_ckpt'}", "--set", "training.train_iters=1"])
    proc = run_mmtrain(["train", str(ema_setup.cfg), "--set", f"training.load={tmp / 'without_ckpt'}", "--set",
                        "training.ema.enable=true", "--set", f"logging.output_dir={tmp / 'late'}", "--set",
                        f"training.save={tmp / 'late_ckpt'}"], check=False)
    assert proc.returncode != 0 and "holds no EMA weights" in proc.stderr, proc.stderr[-1500:]
    proc = run_mmtrain(["convert", "magihuman", "ckpt-to-hf", "--load_dir", str(tmp / "without_ckpt"), "--save_dir",
                        str(tmp / "refused_export"), "--model_assets_dir", str(ema_setup.weights), "--ema"], check=False)
    assert proc.returncode != 0 and "holds no EMA weights" in proc.stderr, proc.stderr[-1500:]
    assert math.isfinite(float(ema[next(iter(ema))].float().sum()))


def test_the_plan_counts_the_shadows_beside_the_shards(ema_setup):
    import json

    def plan(*sets):
        args = ["plan", str(ema_setup.cfg), "--world-size", "2", "--seqlen", "64"]
        for item in sets:
            args += ["--set", item]
        return json.loads(run_mmtrain(args).stdout.strip().splitlines()[-1])

    without, with_ema = plan(), plan("training.ema.enable=true")
    assert with_ema["ema_bytes"] == without["optimizer_bytes"] // 2 > 0  # one fp32 value a trained element
    assert with_ema["total_bytes"] - without["total_bytes"] == with_ema["ema_bytes"]
    offloaded = with_ema["offload"]["cpu_offload"]["host_bytes"] - without["offload"]["cpu_offload"]["host_bytes"]
    assert offloaded == with_ema["ema_bytes"]  # under cpu_offload the shadows sit with the shards on the host
    # training.ema.offload: the shadows in their tier, their windows beside the shards (host RAM for the disk's).
    (ema_setup.tmp / "plan_offload").mkdir(exist_ok=True)
    for tier, column in (("host", "host_bytes"), ("disk", "disk_bytes")):
        tiered = plan("training.ema.enable=true", f"training.ema.offload={tier}",
                      f"training.offload_dir={ema_setup.tmp / 'plan_offload'}")["offload"]["none"]
        plain = without["offload"]["none"]
        assert tiered[column] - plain[column] == with_ema["ema_bytes"], tier
        windows = tiered["device_bytes"] - plain["device_bytes"] + (tiered["host_bytes"] - plain["host_bytes"] if tier == "disk" else 0)
        # Three windows of one tensor, where adamw_swap's hold two: on a model this small the
        # chunk is the largest unit's whole shard, so the windows outweigh the shadows.
        assert windows == without["offload_window_bytes"] // 2 > 0, (tier, windows)


def test_evaluating_the_ema_weights_leaves_training_untouched_and_ranks_keep_best(ema_setup):
    """eval_with_ema swaps the shadows into the shards for one more evaluation and back: the run's
    losses and state are bitwise those of the same run without it; eval_ema_loss follows the EMA
    (equal to eval_loss while the EMA is the weights, after the first update), and keep_best_by
    eval_ema_loss keeps the checkpoint of the lowest one."""
    import json
    common = {"decay": 0.9}
    held = ("--set", "data.validation_split=0.25", "--set", "training.eval_interval=1")
    plain = ema_setup.train("held_plain", common, extra=held)
    with_ema = ema_setup.train("held_ema", common, extra=(*held, "--set", "training.eval_with_ema=true", "--set",
                                                          "training.keep_best=1", "--set",
                                                          "training.keep_best_by=eval_ema_loss"))
    records = lambda name: [json.loads(line) for line in (ema_setup.tmp / name / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    steps = lambda rs: [r["loss"] for r in rs if r.get("kind") != "eval"]  # noqa: E731
    assert steps(records("held_plain")) == steps(records("held_ema"))
    a, b = mu.checkpoint_tensors(iter_dir(plain, STEPS)), mu.checkpoint_tensors(iter_dir(with_ema, STEPS))
    assert all(torch.equal(a[k], b[k]) for k in a if k.startswith(("model.", "ema.")))
    evals = [r for r in records("held_ema") if r.get("kind") == "eval"]
    assert [e["iteration"] for e in evals] == list(range(1, STEPS + 1))
    assert evals[0]["eval_ema_loss"] == pytest.approx(evals[0]["eval_loss"], rel=1e-6)  # d_1 = 0
    assert any(abs(e["eval_ema_loss"] - e["eval_loss"]) > 1e-4 * abs(e["eval_loss"]) for e in evals[1:])
    best = min(evals, key=lambda e: e["eval_ema_loss"])
    listed = json.loads((with_ema / "best.json").read_text())["checkpoints"]
    assert listed[0]["dir"] == f"iter_{best['iteration']:07d}", (best, listed)
    assert listed[0]["eval_loss"] == pytest.approx(best["eval_ema_loss"], rel=1e-12)  # the EMA's loss ranked it
    assert best["eval_ema_loss"] != pytest.approx(best["eval_loss"], rel=1e-6)
    # `mmtrain eval --ema` of the last checkpoint: the run's last EMA evaluation; without: its weights'.
    out = {}
    for flag in ([], ["--ema"]):
        path = ema_setup.tmp / f"eval{''.join(flag)}.json"
        run_mmtrain(["eval", str(ema_setup.cfg), "--load", str(iter_dir(with_ema, STEPS)), "--out", str(path),
                     "--set", "data.validation_split=0.25", "--set", f"logging.output_dir={ema_setup.tmp / 'eval_out'}"]
                    + flag)
        out[bool(flag)] = json.loads(path.read_text())
    assert out[True]["weights"] == "ema" and out[False]["weights"] == "model"
    assert out[True]["eval_loss"] == pytest.approx(evals[-1]["eval_ema_loss"], rel=1e-6)
    assert out[False]["eval_loss"] == pytest.approx(evals[-1]["eval_loss"], rel=1e-6)
    proc = run_mmtrain(["eval", str(ema_setup.cfg), "--load", str(ema_setup.weights), "--ema", "--set",
                        "data.validation_split=0.25", "--set", f"logging.output_dir={ema_setup.tmp / 'eval_out'}"],
                       check=False)
    assert proc.returncode != 0 and "only an mmtrain checkpoint of a run with training.ema" in proc.stderr


def test_the_ema_in_a_tier_of_its_own_is_the_same_ema(ema_setup):
    """training.ema.offload host / disk stream the shadows past the shards a chunk at a time, for each
    update and each eval_with_ema swap: the weights, shadows and eval losses are bitwise those of the
    EMA beside the shards; so with the shards on disk too (cpu_offload + offload_dir), and for a
    2-rank run stopped and resumed into the disk tier."""
    import json
    tmp = ema_setup.tmp
    (tmp / "offload").mkdir(exist_ok=True)
    disk = ("--set", f"training.offload_dir={tmp / 'offload'}", "--set", "training.ema.offload=disk")
    held = ("--set", "data.validation_split=0.25", "--set", "training.eval_interval=1", "--set",
            "training.eval_with_ema=true", "--set", "training.keep_best=1", "--set", "training.keep_best_by=eval_ema_loss")
    evals = lambda name: [r for r in map(json.loads, (tmp / name / "metrics.jsonl").read_text().splitlines())  # noqa: E731
                          if r.get("kind") == "eval"]
    beside = mu.checkpoint_tensors(iter_dir(ema_setup.train("held_ema", {"decay": 0.9}, extra=held), STEPS))
    for name, extra in (("tier_host", (*held, "--set", "training.ema.offload=host")),
                        ("tier_disk_shards", (*held, *disk, "--set", "parallel.fsdp_plan.cpu_offload=true"))):
        got = mu.checkpoint_tensors(iter_dir(ema_setup.train(name, {"decay": 0.9}, extra=extra), STEPS))
        differ = [k for k in beside if k.startswith(("model.", "ema.")) and not torch.equal(got[k], beside[k])]
        assert not differ, f"{name}: {differ[:3]} differ from the EMA beside the shards"
        assert [e["eval_ema_loss"] for e in evals(name)] == [e["eval_ema_loss"] for e in evals("held_ema")]
    two = mu.checkpoint_tensors(iter_dir(ema_setup.train("plain_2ranks", CASES["plain"], world=2), STEPS))
    stopped = ema_setup.train("tier_disk_stopped", CASES["plain"], world=2,
                              extra=(*disk, "--set", "training.exit_interval=2"))
    args = ["train", str(ema_setup.cfg), "--set", f"logging.output_dir={tmp / 'tier_disk_stopped'}", "--set",
            f"training.save={stopped}", "--set", "training.save_interval=1", "--set", "training.load=auto", *disk]
    for key, value in {"enable": "true", "decay": 0.9, "update_after_step": 1}.items():
        args += ["--set", f"training.ema.{key}={value}"]
    run_mmtrain(args, world=2)
    resumed = mu.checkpoint_tensors(iter_dir(stopped, STEPS))
    differ = [k for k in two if k.startswith(("model.", "ema.")) and not torch.equal(resumed[k], two[k])]
    assert not differ, f"resumed into the disk tier: {differ[:3]} differ"


def test_a_magistral_ema_export_loads_in_transformers(tmp_path):
    """Magistral full fine-tuning with the EMA (decay 0.5, 3 steps, a checkpoint each, the vision tower
    frozen): `convert mistral3 ckpt-to-hf --ema` loads in transformers' Mistral3ForConditionalGeneration,
    and every one of its weights is bitwise diffusers' EMAModel fed the plain exports of steps 1-3
    (loaded the same way) from the base: the trained ones averaged, the frozen ones the base's."""
    import re
    from test_lora_peft import hf_model, yaml as mistral3_yaml
    from transformers import Mistral3ForConditionalGeneration
    hf_model().save_pretrained(tmp_path / "base", safe_serialization=True)
    run_mmtrain(["fixture", "mistral3", "--out", str(tmp_path / "data"), "--samples", "12", "--seed", "3"])
    text = mistral3_yaml(tmp_path, tmp_path / "base", tmp_path / "data",
                         f", save: {tmp_path / 'ckpt'}, save_interval: 1, ema: {{enable: true, decay: 0.5}}", iters=3)
    text = re.sub(r"features:\n  enable_lora: true\n  lora: .*\n", "", text).replace('"freeze_vision": false',
                                                                                    '"freeze_vision": true')
    run_mmtrain(["train", str(write_config(tmp_path / "train.yaml", text))])

    def exported(step, ema=False):
        out = tmp_path / f"hf_{step}{'_ema' if ema else ''}"
        run_mmtrain(["convert", "mistral3", "ckpt-to-hf", "--load_dir", str(iter_dir(tmp_path / "ckpt", step)),
                     "--save_dir", str(out), "--model_assets_dir", str(tmp_path / "base")] + (["--ema"] if ema else []))
        return dict(Mistral3ForConditionalGeneration.from_pretrained(str(out), dtype=torch.float32).named_parameters())

    base = dict(Mistral3ForConditionalGeneration.from_pretrained(str(tmp_path / "base"), dtype=torch.float32).named_parameters())
    names = sorted(base)
    params = [torch.nn.Parameter(base[n].detach().clone()) for n in names]
    ema = diffusers_training.EMAModel(params, decay=0.5)
    for step in (1, 2, 3):
        weights = exported(step)
        with torch.no_grad():
            for p, n in zip(params, names):
                p.copy_(weights[n])
        ema.step(params)
    got = exported(3, ema=True)
    assert set(got) == set(names)
    different = [n for n, want in zip(names, ema.shadow_params) if not torch.equal(got[n].detach(), want)]
    assert not different, f"{len(different)} of {len(names)} weights differ from EMAModel's (first {different[0]})"
    moved = [n for n in names if not torch.equal(got[n].detach(), weights[n].detach())]
    assert moved and all("vision_tower" not in n for n in moved), moved[:3]  # the frozen tower is the base's


def test_a_lora_runs_ema_merges_and_decay_zero_is_the_adapters(ema_setup):
    """Under LoRA the EMA averages the adapters; merge-lora --ema merges the averaged ones (decay 0:
    the adapters themselves, byte for byte)."""
    tmp = ema_setup.tmp
    lora = ("--set", "features.enable_lora=true", "--set", "features.lora.rank=4")
    outputs = {}
    for name, decay in (("lora_zero", 0.0), ("lora_ema", 0.9)):
        save = ema_setup.train(name, {"decay": decay}, extra=lora)
        for ema in (False, True):
            out = tmp / f"{name}_merged{'_ema' if ema else ''}"
            run_mmtrain(["convert", "magihuman", "merge-lora", "--load_dir", str(iter_dir(save, STEPS)), "--save_dir",
                         str(out)] + (["--ema"] if ema else []))
            outputs[(name, ema)] = {p.name: p.read_bytes() for p in out.glob("*.safetensors")}
    assert outputs[("lora_zero", True)] == outputs[("lora_zero", False)]
    assert outputs[("lora_ema", True)] != outputs[("lora_ema", False)]
