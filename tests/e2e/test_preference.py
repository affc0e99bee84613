"""Preference data and the dpo objective's edges (docs/preference.md): the preference set's drops by
reason, the collator's rows (chosen then rejected, only the answers supervised, each row's images),
a short DPO run's TRL metrics, and every setting the objective does not support refused by name
before anything is built. (The numbers against TRL: tests/parity/test_dpo_trl.py.)"""
import json
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import read_metrics, run_mmtrain, write_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "magistral" / "magistral_dpo_tiny.yaml"


@pytest.fixture(scope="module")
def dpo_setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("preference")
    config = EXAMPLE.read_text().replace("runs/magistral_dpo_tiny", str(tmp)).replace("train_iters: 40", "train_iters: 2")
    cfg = write_config(tmp / "dpo.yaml", config)
    run_mmtrain(["fixture", "mistral3-weights", "--config", str(cfg), "--out", str(tmp / "base")])
    run_mmtrain(["fixture", "mistral3-preferences", "--out", str(tmp / "data"), "--pairs", "6", "--bad-records"])
    return tmp, cfg


def test_the_collator_puts_chosen_rows_then_rejected_with_only_the_answers_supervised(dpo_setup):
    tmp, cfg = dpo_setup
    out = tmp / "batch.safetensors"
    run_mmtrain(["debug", "collate", str(cfg), "--out", str(out)])
    batch = load_file(str(out))
    with safe_open(str(out), "pt") as f:
        indices = [int(i) for i in f.metadata()["sample_indices"].split(",")]
    pairs = int(batch["preference_pairs"])
    assert pairs == 4 and batch["input_ids"].shape[0] == 2 * pairs and len(indices) == pairs
    records = json.loads((tmp / "data" / "preferences.json").read_text())  # the good pairs come first
    for i, record in enumerate(records[k] for k in indices):
        chosen, rejected = batch["labels"][i], batch["labels"][pairs + i]
        for row, side in ((chosen, "chosen"), (rejected, "rejected")):
            # The fixture's tokenizer: 20 control tokens, then one token per byte.
            supervised = bytes(int(t) - 20 for t in row[row != -100][:-1]).decode()  # the answer, then </s>
            assert supervised == record[side][-1]["content"], (i, side)
            assert int(row[row != -100][-1]) == 2  # </s>
        first_answer = int((chosen != -100).nonzero()[0])
        assert first_answer == int((rejected != -100).nonzero()[0])  # one prompt
        assert batch["input_ids"][i][:first_answer].tolist() == batch["input_ids"][pairs + i][:first_answer].tolist()
    assert batch["pixel_values"].shape[0] == 2 * pairs  # one image a record, in each of its two rows


def test_a_dpo_run_records_trls_metrics_and_the_set_says_what_it_dropped(dpo_setup):
    tmp, cfg = dpo_setup
    proc = run_mmtrain(["train", str(cfg)])
    for reason in ("identical answers", "empty answer", "answer is not one assistant message", "malformed record",
                   "a sequence of the pair dropped", "image file missing", "longer than cutoff_len"):
        assert reason in proc.stdout, reason
    assert "reward accuracy" in proc.stdout
    records = read_metrics(tmp)
    assert len(records) == 2
    for r in records:
        for key in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
                    "logps/rejected"):
            assert key in r, key
        # LoRA starts at the base (lora_B = 0): the first step's policy is the reference.
    assert records[0]["rewards/chosen"] == 0 and records[0]["loss"] == pytest.approx(0.6931472, abs=1e-6)
    assert records[1]["rewards/margins"] != 0
    # `logs plot` draws the reward panels: the figure spec the plotter gets carries their series.
    spy = tmp / "spy" / "mmtrain_py" / "plots"
    spy.mkdir(parents=True)
    for package in (spy.parent, spy):
        (package / "__init__.py").write_text("")
    (spy / "figures.py").write_text(f"import sys\nopen({str(tmp / 'spec.json')!r}, 'w').write(sys.stdin.read())\n")
    run_mmtrain(["logs", "plot", str(tmp), "--out", str(tmp / "spied.png")],
                env_extra={"MMTRAIN_PYTHON_PACKAGE": str(tmp / "spy")})
    series = json.loads((tmp / "spec.json").read_text())["runs"][0]["series"]
    assert all(k in series for k in ("rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected"))


@pytest.mark.parametrize("override,message", [
    ("training.dpo.term_weights=[1.0]", "term_weights weighs a flow-matching model"),
    ("features.lora.modules_to_save=[model.multi_modal_projector]", "with features.lora.modules_to_save"),
    ("training.dpo.loss_type=[kto]", "training.dpo.loss_type"),
    ("training.dpo.label_smoothing=0.5", "training.dpo.label_smoothing"),
    ("training.objective=ppo", "training.objective"),
])
def test_what_the_objective_does_not_support_is_refused_by_name(dpo_setup, override, message):
    tmp, cfg = dpo_setup
    proc = run_mmtrain(["train", str(cfg), "--set", override, "--set", f"logging.output_dir={tmp / 'refused'}"],
                       check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]
    assert not (tmp / "refused" / "metrics.jsonl").exists()


def test_pairs_under_sft_are_refused_at_the_first_micro_batch(dpo_setup):
    """Whether a data set yields pairs is known once it is collated: the first step stops, by name."""
    tmp, cfg = dpo_setup
    proc = run_mmtrain(["train", str(cfg), "--set", "training.objective=sft", "--set",
                        f"logging.output_dir={tmp / 'sft_pairs'}", "--set", "training.save="], check=False)
    assert proc.returncode != 0 and "pairs train with training.objective dpo, not sft" in proc.stderr, proc.stderr[-2000:]
    metrics = tmp / "sft_pairs" / "metrics.jsonl"
    assert not metrics.exists() or not any("loss" in r for r in read_metrics(tmp / "sft_pairs"))


def test_sft_data_under_dpo_is_refused(dpo_setup):
    tmp, cfg = dpo_setup
    run_mmtrain(["fixture", "mistral3", "--out", str(tmp / "sft"), "--samples", "4"])
    sft = ["--set", "data.dataset_param.dataset_type=huggingface", "--set",
           f"data.dataset_param.basic_parameters.dataset={tmp / 'sft' / 'conversations.json'}",
           "--set", "data.dataloader_param.collator_id=pixtral", "--set", f"logging.output_dir={tmp / 'sft_run'}",
           "--set", "training.save="]
    proc = run_mmtrain(["train", str(cfg), *sft], check=False)
    assert proc.returncode != 0 and "holds no preference pairs" in proc.stderr, proc.stderr[-2000:]


def test_held_out_pairs_are_evaluated_in_training_and_by_mmtrain_eval(dpo_setup):
    """A quarter of the pairs held out: the evaluation before the first step is the reference itself
    (eval_loss log 2, rewards 0); after each step it reports the objective's loss and TRL's metrics
    with TRL's eval_ prefix; `mmtrain eval` of the saved checkpoint gives the run's last evaluation."""
    tmp, cfg = dpo_setup
    held = ["--set", "data.validation_split=0.34", "--set", "training.eval_interval=1", "--set",
            "training.eval_at_start=true", "--set", "training.global_batch_size=2", "--set",
            "training.micro_batch_size=2", "--set", f"logging.output_dir={tmp / 'held'}", "--set",
            f"training.save={tmp / 'held_ckpt'}"]
    proc = run_mmtrain(["train", str(cfg), *held])
    assert "eval reward accuracy" in proc.stdout
    lines = [json.loads(line) for line in (tmp / "held" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in lines if r.get("kind") == "eval"]
    assert [r["iteration"] for r in evals] == [0, 1, 2]
    assert evals[0]["eval_loss"] == pytest.approx(0.6931472, abs=1e-6) and evals[0]["eval_rewards/chosen"] == 0
    assert evals[0]["eval_samples"] == 2  # pairs held out
    for key in ("eval_rewards/accuracies", "eval_rewards/margins", "eval_logps/chosen", "eval_logps/rejected"):
        assert key in evals[-1], key
    assert evals[-1]["eval_rewards/margins"] != 0
    proc = run_mmtrain(["eval", str(cfg), "--load", str(tmp / "held_ckpt"), *held[:10], "--set",
                        f"logging.output_dir={tmp / 'held'}", "--out", str(tmp / "held_eval.json")])
    again = json.loads((tmp / "held_eval.json").read_text())
    for key in ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins", "eval_logps/chosen"):
        assert again[key] == pytest.approx(evals[-1][key], rel=1e-6, abs=1e-9), key


def test_token_budget_micro_batches_of_pairs_train_as_fixed_ones(dpo_setup):
    """micro_batch_tokens groups whole pairs by their tokens; the loss is a mean over the step's pairs
    whatever the grouping: one budget-full micro-batch of 4 pairs trains as 2 micro-batches of 2."""
    tmp, cfg = dpo_setup
    common = ["--set", "training.global_batch_size=4", "--set", "training.save="]
    run_mmtrain(["train", str(cfg), *common, "--set", "training.micro_batch_size=2", "--set",
                 f"logging.output_dir={tmp / 'fixed'}"])
    proc = run_mmtrain(["train", str(cfg), *common, "--set", "training.micro_batch_size=1", "--set",
                        "data.dataloader_param.micro_batch_tokens=100000", "--set", f"logging.output_dir={tmp / 'budget'}"])
    assert "micro-batches of at most 100000 tokens" in proc.stdout
    fixed, budget = read_metrics(tmp / "fixed"), read_metrics(tmp / "budget")
    assert len(fixed) == len(budget) == 2
    for a, b in zip(fixed, budget):
        for key in ("loss", "rewards/margins", "logps/chosen"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    assert fixed[1]["loss"] != fixed[0]["loss"]


def test_a_dpo_run_resumes_bitwise_and_runs_over_a_quantized_base(dpo_setup):
    """Stopped after step 1 and resumed, a DPO run's step 2 is the straight run's, bit for bit; under
    QLoRA (nf4 base) the adapters-off reference is the quantized base, so step 1 is again the reference
    itself (rewards 0, loss log 2)."""
    tmp, cfg = dpo_setup
    straight = ["--set", f"logging.output_dir={tmp / 'straight'}", "--set", f"training.save={tmp / 'straight_ckpt'}"]
    run_mmtrain(["train", str(cfg), *straight])
    split = ["--set", f"logging.output_dir={tmp / 'split'}", "--set", f"training.save={tmp / 'split_ckpt'}",
             "--set", "training.save_interval=1"]
    run_mmtrain(["train", str(cfg), *split, "--set", "training.exit_interval=1"])
    run_mmtrain(["train", str(cfg), *split, "--set", "training.load=auto"])
    keys = ("loss", "grad_norm", "rewards/chosen", "rewards/margins", "logps/rejected")
    assert [[r[k] for k in keys] for r in read_metrics(tmp / "split")] == \
        [[r[k] for k in keys] for r in read_metrics(tmp / "straight")]
    run_mmtrain(["train", str(cfg), "--set", "features.lora.base_quant=nf4", "--set", f"logging.output_dir={tmp / 'nf4'}",
                 "--set", "training.save="])
    first, second = read_metrics(tmp / "nf4")
    assert first["rewards/chosen"] == 0 and first["loss"] == pytest.approx(0.6931472, abs=1e-6)
    assert second["rewards/margins"] != 0


def test_a_dpo_checkpoint_samples_and_exports_as_after_sft(dpo_setup):
    """`sample mistral3`, `lora-to-peft` and `merge-lora` take a DPO run's checkpoint and config as
    they take an SFT run's (the prompts are read with the preference set's template and images)."""
    tmp, cfg = dpo_setup
    run_mmtrain(["train", str(cfg), "--set", f"logging.output_dir={tmp / 'export'}", "--set",
                 f"training.save={tmp / 'export_ckpt'}"])
    prompts = tmp / "data" / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "<image>\nWhat colour is this picture?"}],
                                   "images": ["images/img_0.png"]}) + "\n")
    run_mmtrain(["sample", "mistral3", str(cfg), "--load", str(tmp / "export_ckpt"), "--prompts", str(prompts),
                 "--out", str(tmp / "answers"), "--max-new-tokens", "4"])
    assert len((tmp / "answers" / "completions.jsonl").read_text().splitlines()) == 1
    run_mmtrain(["convert", "mistral3", "lora-to-peft", "--load_dir", str(tmp / "export_ckpt"), "--save_dir",
                 str(tmp / "export_peft")])
    run_mmtrain(["convert", "mistral3", "merge-lora", "--load_dir", str(tmp / "export_ckpt"), "--save_dir",
                 str(tmp / "export_merged")])
    assert (tmp / "export_peft" / "adapter_model.safetensors").exists()
    assert (tmp / "export_merged" / "model.safetensors").exists()
