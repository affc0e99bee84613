"""Samples during training (training.sample_interval, sample_prompts, sample_at_start):
- MagiHuman writes <output_dir>/samples/iter_N/ at the iterations asked, and training is bitwise the
  one without samples (losses, grad norms, the saved weights): sampling draws from its own generators,
  reads no data and runs forward-only gathers;
- a training sample equals `mmtrain sample magihuman` on that iteration's checkpoint, bitwise;
- Magistral writes its completions; a text prompt for MagiHuman and prompts without an interval
  are refused by name;
- `mmtrain plan` counts the sampling phase's forwards, memory and time."""
import json

import torch
from safetensors.torch import save_file

from conftest import REPO, read_metrics, run_mmtrain, write_config

MODEL = ("{num_layers: 2, hidden_size: 64, head_dim: 16, num_query_groups: 2, video_in_channels: 16, "
         "audio_in_channels: 8, text_in_channels: 24, mm_layers: [0], gelu7_layers: [0]}")


def magihuman_setup(tmp):
    run_mmtrain(["fixture", "magihuman", "--out", str(tmp / "data"), "--samples", "8", "--video-grid", "2,2,3",
                 "--audio-tokens", "5", "--text-tokens", "6", "--video-channels", "16", "--audio-channels", "8",
                 "--text-channels", "24", "--format", "safetensors"])
    gen = torch.Generator().manual_seed(0)
    for name, rows in (("a", 7), ("neg", 9)):
        save_file({"prompt_embeds": torch.randn(rows, 24, generator=gen)}, str(tmp / f"{name}.safetensors"))
    (tmp / "prompts.jsonl").write_text(
        '{"conditions": "a.safetensors", "negative_conditions": "neg.safetensors", "seed": 3, "seconds": 0.16, '
        '"resolution": "64x64", "steps": 3}\n'
        '{"conditions": "a.safetensors", "seed": 4, "seconds": 0.16, "resolution": "32x64", "steps": 2}\n')


def magihuman_config(tmp, name, sampling=""):
    return write_config(tmp / f"{name}.yaml", f"""
parallel: {{fsdp_plan: {{apply_modules: ["dit.block.layers.{{*}}"]}}}}
model: {{model_id: magihuman, config: {MODEL}}}
data:
  dataset_param: {{dataset_type: magihuman_precomputed, data_root: {tmp / 'data'}}}
  dataloader_param: {{collate_param: {{model_name: magihuman}}}}
training: {{micro_batch_size: 2, train_iters: 4, seed: 9, lr: 1.0e-3, save: {tmp / name / 'ckpt'}, save_interval: 2
           {sampling}}}
logging: {{output_dir: {tmp / name}}}
""")


def test_magihuman_samples_leave_training_untouched_and_equal_mmtrain_sample(tmp_path):
    magihuman_setup(tmp_path)
    sampling = f", sample_interval: 2, sample_at_start: true, sample_prompts: {tmp_path / 'prompts.jsonl'}"
    run_mmtrain(["train", str(magihuman_config(tmp_path, "plain"))], world=2)
    run_mmtrain(["train", str(magihuman_config(tmp_path, "sampled", sampling))], world=2)
    keys = ("loss", "grad_norm")
    plain = [{k: r[k] for k in keys} for r in read_metrics(tmp_path / "plain") if "loss" in r]
    sampled = [{k: r[k] for k in keys} for r in read_metrics(tmp_path / "sampled") if "loss" in r]
    assert plain == sampled and len(plain) == 4
    for shard in sorted((tmp_path / "plain" / "ckpt" / "iter_0000004").glob("*.safetensors")):
        twin = tmp_path / "sampled" / "ckpt" / "iter_0000004" / shard.name
        assert shard.read_bytes() == twin.read_bytes(), shard.name
    samples = tmp_path / "sampled" / "samples"
    assert sorted(p.name for p in samples.iterdir()) == ["iter_0000000", "iter_0000002", "iter_0000004"]
    for it in samples.iterdir():
        assert sorted(p.name for p in it.iterdir()) == ["0000.json", "0000.safetensors", "0001.json", "0001.safetensors"]
    record = json.loads((samples / "iter_0000002" / "0000.json").read_text())
    assert record["cfg_number"] == 2 and record["steps"] == 3 and record["resolution"] == [64, 64]
    assert json.loads((samples / "iter_0000002" / "0001.json").read_text())["cfg_number"] == 1

    out = tmp_path / "cli"
    run_mmtrain(["sample", "magihuman", str(magihuman_config(tmp_path, "plain")), "--load",
                 str(tmp_path / "plain" / "ckpt" / "iter_0000002"), "--prompts", str(tmp_path / "prompts.jsonl"),
                 "--out", str(out)])
    for name in ("0000.safetensors", "0001.safetensors"):
        assert (out / name).read_bytes() == (samples / "iter_0000002" / name).read_bytes()


def plan_json(config, *flags):
    return json.loads(run_mmtrain(["plan", str(config), *flags]).stdout.strip().splitlines()[-1])


def test_the_plan_counts_the_sampling_phase(tmp_path):
    """Prompt 0: 8 video tokens + 5 audio + 7 text (22 with the negative's 9), 3 steps with guidance;
    prompt 1: 4 + 5 + 7, 2 steps. One rank runs both (8 forwards); two run them side by side, as long
    as the longer (6). The forwards fit in the step's activations, so nothing beyond it."""
    magihuman_setup(tmp_path)
    config = magihuman_config(tmp_path, "planned", f", sample_interval: 2, sample_prompts: {tmp_path / 'prompts.jsonl'}")
    one = plan_json(config, "--device", "h100", "--seqlen", "23")
    assert one["sampling"]["forwards"] == 8 and one["sampling"]["beyond_step_device_bytes"] == 0
    assert 0 < one["sampling"]["forward_bytes"] <= one["activation_bytes_no_recompute"]
    assert one["phases"]["sampling"]["device_bytes"] == 0
    two = plan_json(config, "--device", "h100", "--seqlen", "23", "--world-size", "2")
    assert two["sampling"]["forwards"] == 6 and two["sampling"]["time_ms"] > 0
    # A config that does not sample has no phase.
    assert "sampling" not in plan_json(magihuman_config(tmp_path, "plain"), "--seqlen", "23")


def test_bad_sampling_settings_are_refused_by_name(tmp_path):
    magihuman_setup(tmp_path)
    (tmp_path / "text.jsonl").write_text('{"prompt": "a face"}\n')
    cases = [
        (f", sample_interval: 2, sample_prompts: {tmp_path / 'text.jsonl'}", "the text encoder is not loaded"),
        (f", sample_prompts: {tmp_path / 'prompts.jsonl'}", "training.sample_prompts"),
        (", sample_interval: 2", "training.sample_prompts"),
        (", sample_interval: -1, sample_prompts: x", "training.sample_interval"),
    ]
    for index, (sampling, message) in enumerate(cases):
        proc = run_mmtrain(["train", str(magihuman_config(tmp_path, f"bad{index}", sampling))], check=False)
        assert proc.returncode != 0 and message in proc.stderr, (sampling, proc.stderr[-1500:])


def test_magistral_writes_its_completions(tmp_path):
    run_mmtrain(["fixture", "mistral3", "--out", str(tmp_path / "data"), "--samples", "8", "--seed", "1"])
    records = json.loads((tmp_path / "data" / "conversations.json").read_text())
    (tmp_path / "data" / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:3]))
    text = (REPO / "examples" / "magistral" / "magistral_tiny.yaml").read_text()
    text = text.replace("runs/magistral_tiny/data", str(tmp_path / "data")).replace("runs/magistral_tiny", str(tmp_path / "run"))
    text = text.replace("train_iters: 60", f"train_iters: 2\n  sample_interval: 2\n  sample_prompts: {tmp_path / 'data' / 'prompts.jsonl'}")
    text = text.replace("logging:\n", "logging:\n  tensorboard: true\n")
    config = write_config(tmp_path / "m3.yaml", text)
    run_mmtrain(["train", str(config)], world=2)
    lines = (tmp_path / "run" / "samples" / "iter_0000002" / "completions.jsonl").read_text().splitlines()
    assert [json.loads(line)["index"] for line in lines] == [0, 1, 2]
    assert all(1 <= len(json.loads(line)["token_ids"]) <= 128 for line in lines)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    texts = events.Tensors("samples/completion_0001")
    assert texts[0].step == 2 and records[1]["conversations"][0]["value"] in texts[0].tensor_proto.string_val[0].decode()
    # The plan prices the phase: 3 prompts over 2 ranks are 2 rounds of a prefill and 127 cached decode
    # steps, and the fp32 KV cache of the longest prompt + 128 tokens: 2 x 2 layers x 2 x 24 x (L + 128) x 4 B.
    plan = plan_json(config, "--world-size", "2", "--device", "h100")["sampling"]
    longest = max(len(json.loads(line)["prompt_ids"]) for line in lines[:2])
    assert plan["forwards"] == 2 * 128
    assert plan["held_device_bytes"] == 2 * 2 * 2 * 24 * (longest + 128) * 4
    assert plan["time_ms"] > 0


def test_a_lora_checkpoint_samples_with_its_adapters(tmp_path):
    """`mmtrain sample` on a LoRA checkpoint equals sampling its merge-lora weights, and differs from
    the base: the adapters are applied."""
    magihuman_setup(tmp_path)
    plain = magihuman_config(tmp_path, "plain")
    run_mmtrain(["fixture", "magihuman-weights", "--config", str(plain), "--out", str(tmp_path / "base"), "--seed", "1"])
    text = plain.read_text().replace("model: {model_id: magihuman,", f"model: {{model_id: magihuman, model_name_or_path: {tmp_path / 'base'},")
    text = text.replace("lr: 1.0e-3", "lr: 5.0e-2").replace(str(tmp_path / "plain"), str(tmp_path / "lora"))
    text = text.replace("\ndata:", "\nfeatures: {enable_lora: true, lora: {rank: 4, alpha: 8}}\ndata:", 1)
    lora = write_config(tmp_path / "lora.yaml", text)
    run_mmtrain(["train", str(lora)])
    ckpt = tmp_path / "lora" / "ckpt" / "iter_0000004"
    run_mmtrain(["convert", "magihuman", "merge-lora", "--load_dir", str(ckpt), "--save_dir", str(tmp_path / "merged"),
                 "--dtype", "fp32"])
    outs = {}
    for name, config, load in (("lora", lora, ckpt), ("merged", plain, tmp_path / "merged"), ("base", plain, tmp_path / "base")):
        outs[name] = tmp_path / f"s_{name}"
        run_mmtrain(["sample", "magihuman", str(config), "--load", str(load), "--prompts", str(tmp_path / "prompts.jsonl"),
                     "--out", str(outs[name])])
    from safetensors.torch import load_file
    got, merged, base = (load_file(str(outs[n] / "0000.safetensors"))["video_latent"] for n in ("lora", "merged", "base"))
    assert (got - merged).abs().max() <= 1e-4
    assert (got - base).abs().max() > 1e-2


def test_tensorboard_shows_the_samples(tmp_path):
    """With logging.tensorboard: MagiHuman's decoded samples as frame grids and audio, Magistral's
    completions as text; metrics.jsonl records each sampling phase and `logs parse` skips it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    magihuman_setup(tmp_path)
    run_mmtrain(["fixture", "magihuman-encoders", "--out", str(tmp_path / "enc"), "--config",
                 str(REPO / "examples" / "magihuman" / "magihuman_tiny.yaml")])
    sampling = (f", sample_interval: 4, sample_prompts: {tmp_path / 'prompts.jsonl'}, "
                f"sample_vae: {tmp_path / 'enc' / 'vae'}, sample_audio_vae: {tmp_path / 'enc' / 'audio_vae'}")
    config = magihuman_config(tmp_path, "tb", sampling)
    config.write_text(config.read_text().replace("logging: {", "logging: {tensorboard: true, "))
    run_mmtrain(["train", str(config)])
    samples = tmp_path / "tb" / "samples" / "iter_0000004"
    assert (samples / "0000.mp4").exists() and (samples / "0001.grid.png").exists()
    events = EventAccumulator(str(tmp_path / "tb" / "tensorboard"), size_guidance={"images": 0, "audio": 0}).Reload()
    assert sorted(events.Tags()["images"]) == ["samples/0000", "samples/0001"]
    image = events.Images("samples/0000")[0]
    assert image.step == 4 and (image.width, image.height) == (4 * 64, 2 * 64)
    audio = events.Audio("samples/0001")[0]
    assert audio.sample_rate == 44100 and audio.length_frames > 0
    records = read_metrics(tmp_path / "tb")
    assert [r["iteration"] for r in records if r.get("kind") == "samples"] == [4]
    parsed = run_mmtrain(["logs", "parse", str(tmp_path / "tb" / "metrics.jsonl")]).stdout.splitlines()
    assert len(parsed) == 4 and all('"kind"' not in line for line in parsed)

    # `logs plot` puts the latest sample's frames beside the curves: the figure spec names the grid,
    # and the real plotter draws it.
    spy = tmp_path / "spy" / "mmtrain_py" / "plots"
    spy.mkdir(parents=True)
    for package in (spy.parent, spy):
        (package / "__init__.py").write_text("")
    (spy / "figures.py").write_text(f"import sys\nopen({str(tmp_path / 'spec.json')!r}, 'w').write(sys.stdin.read())\n")
    run_mmtrain(["logs", "plot", str(tmp_path / "tb"), "--out", str(tmp_path / "spied.png")],
                env_extra={"MMTRAIN_PYTHON_PACKAGE": str(tmp_path / "spy")})
    grid = json.loads((tmp_path / "spec.json").read_text())["runs"][0]["sample_grid"]
    assert grid == {"path": str(samples / "0000.grid.png"), "iteration": 4}
    run_mmtrain(["logs", "plot", str(tmp_path / "tb"), "--out", str(tmp_path / "plot.png")])
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_sampling_settings_are_checked_before_the_first_step(tmp_path):
    """A typo in sample_vae, a plain file where the samples go, and a prompt line without its own shape
    are refused at start (no iteration runs), each by name."""
    magihuman_setup(tmp_path)
    (tmp_path / "unsized.jsonl").write_text('{"conditions": "a.safetensors", "seed": 1}\n')
    # 600 s at 8192 x 8192: ~245 million tokens, a forward far beyond this machine's memory.
    (tmp_path / "huge.jsonl").write_text('{"conditions": "a.safetensors", "seconds": 600, "resolution": "8192x8192"}\n')
    sampling = f", sample_interval: 2, sample_prompts: {tmp_path / 'prompts.jsonl'}"
    cases = [
        (sampling + f", sample_vae: {tmp_path / 'no_such_vae'}, sample_audio_vae: {tmp_path / 'no_such_vae'}",
         "training.sample_vae", None),
        (sampling, "samples is not a directory", "file"),
        (sampling, "samples is a symbolic link", "link"),
        (f", sample_interval: 2, sample_prompts: {tmp_path / 'unsized.jsonl'}", "gives no 'seconds' and 'resolution'", None),
        (f", sample_interval: 2, sample_prompts: {tmp_path / 'huge.jsonl'}", "more during a sampling phase", None),
    ]
    for index, (extra, message, samples_as) in enumerate(cases):
        name = f"start{index}"
        config = magihuman_config(tmp_path, name, extra)
        (tmp_path / name).mkdir()
        if samples_as == "file":
            (tmp_path / name / "samples").write_text("")
        elif samples_as == "link":
            (tmp_path / "elsewhere").mkdir(exist_ok=True)
            (tmp_path / name / "samples").symlink_to(tmp_path / "elsewhere")
        proc = run_mmtrain(["train", str(config)], check=False)
        assert proc.returncode != 0 and message in proc.stderr, (extra, proc.stderr[-1500:])
        assert not (tmp_path / name / "metrics.jsonl").exists() or '"loss"' not in (tmp_path / name / "metrics.jsonl").read_text()
    assert not any((tmp_path / "elsewhere").iterdir())


def test_a_failed_sampling_phase_costs_no_training(tmp_path):
    """Decoding the samples fails (a decoder whose config.json is not JSON): the iteration's checkpoint is
    saved before sampling, the failure is logged and recorded in metrics.jsonl, no samples directory that
    looks done is left, and training goes on bitwise as without samples. With sample_failure: stop the run
    ends after saving that iteration."""
    magihuman_setup(tmp_path)
    (tmp_path / "bad_vae").mkdir()
    (tmp_path / "bad_vae" / "config.json").write_text("{not json")
    sampling = (f", sample_interval: 2, sample_prompts: {tmp_path / 'prompts.jsonl'}, "
                f"sample_vae: {tmp_path / 'bad_vae'}, sample_audio_vae: {tmp_path / 'bad_vae'}")
    run_mmtrain(["train", str(magihuman_config(tmp_path, "plain"))])
    proc = run_mmtrain(["train", str(magihuman_config(tmp_path, "going", sampling))])
    assert "the samples after iteration 2 failed" in proc.stdout + proc.stderr
    records = read_metrics(tmp_path / "going")
    failures = [r for r in records if r.get("kind") == "samples"]
    assert [r["iteration"] for r in failures] == [2, 4] and all("error" in r and "dir" not in r for r in failures)
    keys = ("loss", "grad_norm")
    assert [{k: r[k] for k in keys} for r in records if "loss" in r] == \
        [{k: r[k] for k in keys} for r in read_metrics(tmp_path / "plain") if "loss" in r]
    assert not any((tmp_path / "going" / "samples").iterdir())  # nothing half-made, nothing that looks done
    assert (tmp_path / "going" / "ckpt" / "iter_0000004").is_dir()

    stop = magihuman_config(tmp_path, "stop", sampling + ", sample_failure: stop")
    proc = run_mmtrain(["train", str(stop), "--set", "training.save_interval=3"], check=False)
    assert proc.returncode != 0 and "training.sample_failure is stop, after saving iteration 2" in proc.stderr
    assert (tmp_path / "stop" / "ckpt" / "latest").read_text().strip().endswith("2")


def test_a_resume_samples_what_a_kill_cut_short(tmp_path):
    """The samples of an iteration come after its save: a run killed while sampling leaves its checkpoint
    and a hidden .partial directory. The resumed run removes the partial one and samples that iteration
    first, then goes on."""
    magihuman_setup(tmp_path)
    sampling = f", sample_interval: 2, sample_prompts: {tmp_path / 'prompts.jsonl'}"
    config = magihuman_config(tmp_path, "cut", sampling)
    run_mmtrain(["train", str(config), "--set", "training.train_iters=2"])
    samples = tmp_path / "cut" / "samples"
    # What a kill during the sampling of iteration 2 leaves: the checkpoint, and half a samples directory.
    (samples / "iter_0000002").rename(samples / ".iter_0000002.partial")
    (samples / ".iter_0000002.partial" / "0001.safetensors").unlink()
    run_mmtrain(["train", str(config), "--set", f"training.load={tmp_path / 'cut' / 'ckpt'}"])
    assert sorted(p.name for p in samples.iterdir()) == ["iter_0000002", "iter_0000004"]
    assert sorted(p.name for p in (samples / "iter_0000002").iterdir()) == \
        ["0000.json", "0000.safetensors", "0001.json", "0001.safetensors"]
