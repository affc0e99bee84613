"""Flow-DPO for MagiHuman and the full fine-tuning reference, end to end (docs/preference.md): a LoRA
run starts at the reference (loss log 2), evaluates held-out pairs and resumes bitwise; a full
fine-tuning run records its frozen reference and refuses to continue against another; bad pair
manifests and settings Flow-DPO has no form for are refused by name, before a step. (The numbers
against the formula: tests/parity/test_flow_dpo.py.)"""
import json
import math
import shutil
from pathlib import Path

import pytest

from conftest import read_metrics, run_mmtrain, write_config

MODEL = ("{num_layers: 2, hidden_size: 64, head_dim: 16, num_query_groups: 2, video_in_channels: 16, "
         "audio_in_channels: 8, text_in_channels: 24, mm_layers: [0], gelu7_layers: [0]}")
SHAPE = ["--video-grid", "2,2,3", "--audio-tokens", "5", "--text-tokens", "7", "--video-channels", "16",
         "--audio-channels", "8", "--text-channels", "24"]


def config(tmp: Path, data: Path, name: str, training: str = "", lora: bool = False, manifest: str = "pairs.jsonl"):
    features = "features: {enable_lora: true, lora: {rank: 4, alpha: 8}}\n" if lora else ""
    return write_config(tmp / f"{name}.yaml", f"""
parallel: {{fsdp_plan: {{apply_modules: ["dit.block.layers.{{*}}"]}}}}
model: {{model_id: magihuman, config: {MODEL}}}
{features}data:
  dataset_param: {{dataset_type: magihuman_preference, data_root: {data}, pairs: {data / manifest}}}
  dataloader_param: {{collate_param: {{model_name: magihuman_preference}}, shuffle: true}}
training: {{train_iters: 2, micro_batch_size: 2, lr: 1.0e-3, lr_decay_style: constant, seed: 5, objective: dpo,
  dpo: {{beta: 500}}{training}}}
logging: {{output_dir: {tmp / name}}}
""")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    data = tmp_path_factory.mktemp("flow_preference") / "data"
    run_mmtrain(["fixture", "magihuman-pairs", "--out", str(data), "--pairs", "6", "--seed", "3", *SHAPE])
    return data


def test_a_lora_run_starts_at_the_reference_evaluates_and_resumes_bitwise(tmp_path, pairs):
    straight = config(tmp_path, pairs, "straight", f", save: {tmp_path / 'straight_ckpt'}, eval_interval: 1, "
                      "eval_at_start: true", lora=True)
    text = straight.read_text().replace("data:\n", f"data:\n  validation_split: 0.34\n")
    straight.write_text(text)
    proc = run_mmtrain(["train", str(straight)])
    assert "eval reward accuracy" in proc.stdout
    records = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("kind") != "eval"]
    evals = [r for r in records if r.get("kind") == "eval"]
    # lora_B = 0: the policy is the base, which is the reference (adapters off).
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-6) and steps[0]["rewards/margins"] == 0
    assert evals[0]["eval_loss"] == pytest.approx(math.log(2), abs=1e-6)
    for key in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "mse/chosen", "mse/rejected"):
        assert key in steps[1] and f"eval_{key}" in evals[-1], key
    assert steps[1]["rewards/margins"] != 0 and evals[-1]["eval_rewards/margins"] != 0
    assert evals[0]["eval_samples"] == 2  # of the 6 pairs, 2 held out

    split = write_config(tmp_path / "split.yaml", text.replace(str(tmp_path / "straight"), str(tmp_path / "split"))
                         .replace("train_iters: 2", "train_iters: 2, exit_interval: 1"))
    run_mmtrain(["train", str(split)])
    run_mmtrain(["train", str(split), "--set", "training.exit_interval=0", "--set", "training.load=auto"])
    resumed = [r for r in read_metrics(tmp_path / "split") if r.get("kind") != "eval"]
    assert resumed[-1]["iteration"] == 2
    for key in ("loss", "rewards/margins", "mse/chosen"):
        assert resumed[-1][key] == steps[1][key], key  # bitwise


def test_a_full_run_records_its_reference_and_refuses_another_on_resume(tmp_path, pairs):
    cfg = config(tmp_path, pairs, "full", f", save: {tmp_path / 'ckpt'}, save_interval: 1, exit_interval: 1")
    proc = run_mmtrain(["train", str(cfg)])
    assert "dpo reference: a frozen copy of the initial weights" in proc.stdout
    state = json.loads((tmp_path / "ckpt" / "iter_0000001" / "trainer_state.json").read_text())
    assert state["preference_reference"] == {"init_seed": 5}
    # The first step's policy is the reference itself.
    assert read_metrics(tmp_path / "full")[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    proc = run_mmtrain(["train", str(cfg), "--set", "training.seed=6", "--set", "training.load=auto", "--set",
                        "training.exit_interval=0"], check=False)
    assert proc.returncode != 0 and "its preference reference was a random init with seed 5" in proc.stderr, proc.stderr
    proc = run_mmtrain(["train", str(cfg), "--set", "training.dpo.reference_quant=nf4", "--set", "training.load=auto",
                        "--set", "training.exit_interval=0"], check=False)
    assert proc.returncode != 0 and 'its preference reference was stored as "none"' in proc.stderr, proc.stderr
    # An SFT checkpoint continued as DPO would take the initial weights as the reference: refused.
    sft_data = tmp_path / "sft_data"
    run_mmtrain(["fixture", "magihuman", "--out", str(sft_data), "--samples", "4", "--seed", "3", *SHAPE])
    sft = write_config(tmp_path / "sft.yaml", cfg.read_text().replace("dataset_type: magihuman_preference", "dataset_type: magihuman_precomputed")
                       .replace("model_name: magihuman_preference", "model_name: magihuman")
                       .replace(f", pairs: {pairs / 'pairs.jsonl'}", "").replace(str(pairs), str(sft_data))
                       .replace("objective: dpo", "objective: sft").replace(str(tmp_path / "ckpt"), str(tmp_path / "sft_ckpt"))
                       .replace(f"output_dir: {tmp_path / 'full'}", f"output_dir: {tmp_path / 'sft'}"))
    run_mmtrain(["train", str(sft)])
    proc = run_mmtrain(["train", str(cfg), "--set", f"training.load={tmp_path / 'sft_ckpt'}", "--set",
                        f"training.save={tmp_path / 'other'}", "--set", f"logging.output_dir={tmp_path / 'other'}"],
                       check=False)
    assert proc.returncode != 0 and "was not trained against a frozen reference" in proc.stderr, proc.stderr


def manifest_case(data: Path, tmp: Path, name: str, lines: list[str]) -> Path:
    (data / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines))
    return config(tmp, data, name, manifest=f"{name}.jsonl")


def test_bad_pairs_and_settings_are_refused_by_name(tmp_path, pairs):
    data = tmp_path / "data"
    shutil.copytree(pairs, data)
    other = tmp_path / "other_shape"
    run_mmtrain(["fixture", "magihuman", "--out", str(other), "--samples", "1", "--seed", "4",
                 "--video-grid", "1,2,3", *SHAPE[2:]])
    for sub in ("latents", "audio_latents", "conditions"):
        shutil.copy(other / sub / "sample_000000.pt", data / sub / "short_clip.pt")
    cases = {
        "missing": (['{"chosen": "sample_000000", "rejected": "sample_999999"}'], "the rejected stem 'sample_999999'"),
        "same": (['{"chosen": "sample_000000", "rejected": "sample_000000"}'], "are the same clip"),
        "empty": ([], "no pairs (an empty manifest)"),
        "unknown": (['{"chosen": "sample_000000", "rejected": "sample_000001", "score": 1}'], "unknown key 'score'"),
        "shapes": (['{"chosen": "sample_000000", "rejected": "short_clip"}'] * 2, "need one shape"),
    }
    for name, (lines, message) in cases.items():
        cfg = manifest_case(data, tmp_path, name, lines)
        proc = run_mmtrain(["train", str(cfg)], check=False)
        assert proc.returncode != 0 and message in proc.stderr, (name, proc.stderr[-1500:])
        # A clip's shape is known once it is read (a .pt file has no header to peek at): the shapes case
        # fails as its pair is loaded for the first step, which never completes.
        metrics = tmp_path / name / "metrics.jsonl"
        assert not metrics.exists() or not any("loss" in r for r in read_metrics(tmp_path / name)), name
    cfg = config(tmp_path, data, "settings")
    for override, message in [
        ("training.dpo.loss_type=[ipo]", "has no Flow-DPO form"),
        ("training.dpo.term_weights=[1.0, 1.0, 1.0]", "3 weights for the model's 2 loss terms"),
        ("training.objective=sft", "pairs train with training.objective dpo, not sft"),
    ]:
        proc = run_mmtrain(["train", str(cfg), "--set", override], check=False)
        assert proc.returncode != 0 and message in proc.stderr, (override, proc.stderr[-1500:])
    proc = run_mmtrain(["train", str(cfg), "--set", "features.enable_lora=true", "--set",
                        "training.dpo.reference_quant=nf4"], check=False)
    assert proc.returncode != 0 and "under LoRA the reference is the base" in proc.stderr, proc.stderr[-1500:]


def test_the_plan_counts_two_sequences_a_pair_and_the_reference_copy(tmp_path, pairs):
    cfg = config(tmp_path, pairs, "plan")

    def plan(*sets):
        args = ["plan", str(cfg), "--world-size", "2", "--seqlen", "100"]
        for item in sets:
            args += ["--set", item]
        return json.loads(run_mmtrain(args).stdout.strip().splitlines()[-1])

    dpo, sft, lora = plan(), plan("training.objective=sft"), plan("features.enable_lora=true")
    nf4 = plan("training.dpo.reference_quant=nf4")  # the Linears in 4-bit codes and their scales
    assert 0 < nf4["reference_copy_bytes"] < dpo["reference_copy_bytes"] / 4
    assert dpo["tokens"] == 2 * sft["tokens"] == 2 * 2 * 100  # micro-batches of 2 pairs
    assert dpo["reference_copy_bytes"] == dpo["total_params"] * 4 // 2  # fp32 param_dtype over 2 shards
    assert sft["reference_copy_bytes"] == 0 and lora["reference_copy_bytes"] == 0  # LoRA: adapters off
    assert dpo["total_bytes"] - sft["total_bytes"] >= dpo["reference_copy_bytes"]
