"""Held-out validation while training (issue 48): data.validation / validation_split,
training.eval_interval / eval_iters / eval_at_start / eval_batch_size / eval_timesteps.

  * exactness: the validation loss on 1, 2 and 4 ranks (ring 2, ring 2 x Ulysses 2,
    HSDP 2 x 2 with the moments on disk), with and without a token budget for training, is the same number within 1e-6 (fp32), both models; the loss is
    normalized over the whole evaluation, not averaged over micro-batches (ragged MagiHuman
    samples make the two differ: checked against the records' own sums);
  * stability: at fixed weights (lr 0) every evaluation gives bitwise the same value;
  * untouched training: a run with evaluation every 2 steps trains bitwise like one without;
    a run stopped and resumed with load: auto evaluates at the same steps with the same values;
  * validation_split: the held-out samples are written down, the same on 1 and 2 ranks;
  * keep_best keeps the checkpoints of the lowest eval_loss through keep_latest_k and a resume;
    `mmtrain eval` of a checkpoint, an HF directory and a DCP equals the run's own evaluation;
  * bad input is refused by name.
"""
import json
import math
from pathlib import Path

import pytest

from conftest import read_metrics, run_mmtrain, write_config
from test_token_budget import magihuman_config, magihuman_data, mistral3_config, mistral3_data  # noqa: F401

EVAL = ", eval_interval: 2, eval_at_start: true"


def run(tmp: Path, make_config, data: Path, world=1, loader="", training="", parallel="", check=True,
        validation=", validation_split: 0.25", iters=4, lr=None):
    tmp.mkdir(parents=True, exist_ok=True)
    text = make_config(tmp, data, loader, training, **({"parallel": parallel} if parallel else {}))
    text = text.replace("train_iters: 3", f"train_iters: {iters}")
    if lr is not None:
        text = text.replace("lr: 2.0e-3", f"lr: {lr}")
    # The held-out set: the validation keys go in the data section.
    text = text.replace("\n  dataloader_param:", "\n  " + validation.lstrip(", ") + "\n  dataloader_param:", 1) \
        if validation else text
    cfg = write_config(tmp / "c.yaml", text)
    proc = run_mmtrain(["train", str(cfg)], world=world, timeout=600, check=check)
    return proc


def records(tmp: Path):
    lines = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in lines if r.get("kind") != "eval"]
    evals = [r for r in lines if r.get("kind") == "eval"]
    return steps, evals


def test_magihuman_validation_loss_is_the_same_on_any_world(tmp_path, magihuman_data):
    one = tmp_path / "one"
    # Two samples per micro-batch here, one on the other worlds: a mean of micro-batch means would differ.
    run(one, magihuman_config, magihuman_data, 1, training=EVAL + ", global_batch_size: 8, eval_batch_size: 2")
    _, evals_one = records(one)
    assert [e["iteration"] for e in evals_one] == [0, 2, 4]
    quantiles = ["t0.1", "t0.3", "t0.5", "t0.7", "t0.9"]
    for e in evals_one:
        assert all(f"eval_loss_{q}" in e for q in quantiles), e
        assert len(e["eval_sigmas"]) == 5 and e["eval_sigmas"] == sorted(e["eval_sigmas"]), e
        mean = sum(e[f"eval_loss_{q}"] for q in quantiles) / 5
        assert math.isclose(e["eval_loss"], mean, rel_tol=1e-12), e
        assert math.isclose(e["eval_loss"], e["eval_loss_video"] + e["eval_loss_audio"], rel_tol=1e-9), e
        assert e["eval_samples"] == 10 and e["eval_time_ms"] > 0, e  # 25 % of 40 held out
    swap = f", optimizer: adamw_swap, offload_dir: {tmp_path / 'moments'}"  # HSDP, the moments on disk
    (tmp_path / "moments").mkdir()
    for name, world, parallel, loader, extra in (
            ("two", 2, "", "", ""),  # Ulysses: in hybrid (and Magistral's test alone)
            ("ring", 2, "\n  ring_attention_size: 2", "", ""),
            ("hybrid", 4, "\n  ring_attention_size: 2\n  ulysses_parallel_size: 2", "", ""),
            ("hsdp_swap", 4, "\n  fully_shard_parallel_size: 2", "", swap),
            ("budget", 2, "", ", micro_batch_tokens: 1024", ", micro_batch_size: 1")):
        other = tmp_path / name
        run(other, magihuman_config, magihuman_data, world, loader=loader, parallel=parallel,
            training=EVAL + ", global_batch_size: 8" + extra)
        _, evals = records(other)
        assert [e["iteration"] for e in evals] == [0, 2, 4]
        # Iteration 0 is the same weights on every world: the same loss within fp32 reductions.
        worst = abs(evals[0]["eval_loss"] - evals_one[0]["eval_loss"]) / evals_one[0]["eval_loss"]
        print(f"[{name}] eval_loss at iteration 0: relative difference to one rank {worst:.2e}")
        assert worst <= 1e-6, (name, evals[0], evals_one[0])
        assert json.loads((other / "run" / "validation_indices.json").read_text()) == \
            json.loads((one / "run" / "validation_indices.json").read_text())


def test_magistral_validation_loss_and_perplexity(tmp_path, mistral3_data):
    one, two = tmp_path / "one", tmp_path / "two"
    run(one, mistral3_config, mistral3_data, 1, training=EVAL + ", global_batch_size: 4, eval_batch_size: 2")
    run(two, mistral3_config, mistral3_data, 2, training=EVAL + ", global_batch_size: 4, eval_batch_size: 1")
    cp = tmp_path / "ulysses"  # one micro-batch split over 2 context-parallel ranks
    run(cp, mistral3_config, mistral3_data, 2, training=EVAL + ", global_batch_size: 4, eval_batch_size: 1",
        parallel="\n  ulysses_parallel_size: 2")
    ring = tmp_path / "ring"  # zigzag halves of a causal sample, K/V around the ring
    run(ring, mistral3_config, mistral3_data, 2, training=EVAL + ", global_batch_size: 4, eval_batch_size: 1",
        parallel="\n  ring_attention_size: 2")
    (_, a), (_, b), (_, c), (_, d) = records(one), records(two), records(cp), records(ring)
    assert [e["iteration"] for e in a] == [0, 2, 4]
    for e in a:
        assert math.isclose(e["eval_ppl"], math.exp(min(20.0, e["eval_loss"])), rel_tol=1e-12), e
        assert e["eval_tokens"] > 0 and "eval_loss_t0.1" not in e, e
    for other in (b, c, d):
        assert abs(a[0]["eval_loss"] - other[0]["eval_loss"]) / a[0]["eval_loss"] <= 1e-6, (a[0], other[0])
        assert a[0]["eval_tokens"] == other[0]["eval_tokens"]


def test_evaluation_is_stable_and_leaves_training_untouched(tmp_path, magihuman_data):
    frozen = tmp_path / "frozen"
    run(frozen, magihuman_config, magihuman_data, 2, training=EVAL, lr="0.0")
    _, evals = records(frozen)
    assert len({e["eval_loss"] for e in evals}) == 1, evals  # bitwise: same weights, same noise, same batches
    with_eval, without = tmp_path / "with", tmp_path / "without"
    run(with_eval, magihuman_config, magihuman_data, 2, training=EVAL)
    run(without, magihuman_config, magihuman_data, 2)
    steps_with, evals_with = records(with_eval)
    steps_without, evals_without = records(without)
    assert evals_with and not evals_without
    for key in ("loss", "grad_norm"):
        assert [s[key] for s in steps_with] == [s[key] for s in steps_without], key
    # Training loss against the stable validation loss: the spread over the same steps.
    print(f"training loss {[round(s['loss'], 5) for s in steps_with]}, "
          f"validation loss {[round(e['eval_loss'], 5) for e in evals_with]}")
    # Stopped at iteration 2 and resumed with load: auto: the same evaluations, bitwise.
    resumed = tmp_path / "resumed"
    ckpt = f", save: {resumed / 'ckpt'}, load: auto"
    proc = run(resumed, magihuman_config, magihuman_data, 2, training=EVAL + ckpt + ", exit_interval: 2")
    assert "exit_interval 2 reached at iteration 2" in proc.stdout
    run(resumed, magihuman_config, magihuman_data, 2, training=EVAL + ckpt)
    _, evals_resumed = records(resumed)
    assert [(e["iteration"], e["eval_loss"]) for e in evals_resumed] == \
        [(e["iteration"], e["eval_loss"]) for e in evals_with]
    summary = run_mmtrain(["logs", "summary", str(with_eval / "run" / "metrics.jsonl")]).stdout
    assert "validation (3 evaluations): last eval_loss" in summary and "; best " in summary, summary


def test_keep_best_survives_a_resume_and_mmtrain_eval_equals_the_run(tmp_path, magihuman_data):
    d = tmp_path / "best"
    ckpt = d / "ckpt"
    keep = f", eval_interval: 1, save: {ckpt}, load: auto, keep_best: 3, keep_latest_k: 1"
    run(d, magihuman_config, magihuman_data, 2, training=keep + ", exit_interval: 2", iters=4)
    run(d, magihuman_config, magihuman_data, 2, training=keep + ", async_save: true", iters=4)  # and in the background
    _, evals = records(d)
    assert [e["iteration"] for e in evals] == [1, 2, 3, 4]
    ranked = sorted(evals, key=lambda e: (e["eval_loss"], e["iteration"]))[:3]
    listed = json.loads((ckpt / "best.json").read_text())["checkpoints"]
    assert [(c["iteration"], c["eval_loss"]) for c in listed] == [(e["iteration"], e["eval_loss"]) for e in ranked]
    # The best three and `latest`; keep_latest_k 1 pruned the rest. The list crossed the resume at 2.
    kept = sorted(p.name for p in ckpt.glob("iter_*"))
    assert kept == sorted({f"iter_{e['iteration']:07d}" for e in ranked} | {"iter_0000004"}), kept
    state = json.loads((ckpt / "iter_0000004" / "trainer_state.json").read_text())
    assert [b["iteration"] for b in state["best_checkpoints"]] == [e["iteration"] for e in ranked]

    # The curves: logs plot (validation markers, the per-timestep panel) and logs compare.
    run_mmtrain(["logs", "plot", str(d / "run"), "--out", str(d / "curves.png")])
    assert (d / "curves.png").stat().st_size > 10000
    compared = run_mmtrain(["logs", "compare", str(d / "run"), str(d / "run")]).stdout
    assert "eval_loss over 4 common evaluations: relative difference 0.000e+00" in compared, compared

    # mmtrain eval of the last checkpoint, on one rank and two, equals the run's own evaluation after step 4.
    cfg = d / "c.yaml"
    in_run = evals[-1]["eval_loss"]
    for world, out in ((2, d / "eval_ckpt.json"), (1, None)):
        args = ["eval", str(cfg), "--load", str(ckpt / "iter_0000004")] + (["--out", str(out)] if out else [])
        proc = run_mmtrain(args, world=world)
        assert "eval_loss" in proc.stdout and "iteration 4" in proc.stdout, proc.stdout
    assert json.loads((d / "eval_ckpt.json").read_text())["eval_loss"] == in_run  # same world: bitwise
    default_out = d / "run" / "eval_iter_0000004.json"
    assert abs(json.loads(default_out.read_text())["eval_loss"] - in_run) <= 1e-6 * in_run
    proc = run_mmtrain(["eval", str(cfg), "--load", str(ckpt / "iter_0000004")], check=False)  # never overwritten
    assert proc.returncode != 0 and "is never overwritten" in proc.stderr, proc.stderr

    # The same weights as a DCP (fp32: bit for bit) and in the upstream HF layout.
    dcp = d / "dcp"
    run_mmtrain(["convert", "magihuman", "ckpt-to-dcp", "--load_dir", str(ckpt / "iter_0000004"), "--save_dir", str(dcp)])
    proc = run_mmtrain(["eval", str(cfg), "--load", str(dcp), "--out", str(d / "eval_dcp.json")], world=2)
    assert json.loads((d / "eval_dcp.json").read_text())["eval_loss"] == in_run
    assert not list((d / "run").glob(".eval_from_dcp_*")), "the DCP's staging directory is removed"
    reference, hf = d / "reference", d / "hf"
    run_mmtrain(["fixture", "magihuman-weights", "--config", str(cfg), "--out", str(reference)])
    run_mmtrain(["convert", "magihuman", "ckpt-to-hf", "--load_dir", str(ckpt / "iter_0000004"), "--save_dir", str(hf),
                 "--model_assets_dir", str(reference)])
    run_mmtrain(["eval", str(cfg), "--load", str(hf), "--out", str(d / "eval_hf.json")])
    from_hf = json.loads((d / "eval_hf.json").read_text())
    print(f"eval_loss in the run {in_run}, of the HF export {from_hf['eval_loss']}")
    assert from_hf["iteration"] == 0 and abs(from_hf["eval_loss"] - in_run) <= 1e-3 * in_run  # the export is bf16

    # A directory of none of the three kinds.
    proc = run_mmtrain(["eval", str(cfg), "--load", str(d / "run")], check=False)
    assert proc.returncode != 0 and "not a model's weights" in proc.stderr, proc.stderr


@pytest.mark.parametrize("setting,message", [
    ("training: eval_interval 2 without a set", "needs a validation set: set data.validation"),
    ("validation_split: 1.0", "data.validation_split"),
    ("validation_split: 0.0", "needs a validation set"),
    ("eval_iters: 0", "training.eval_iters"),
    ("eval_iters: 11", "evaluation never wraps around: use -1 for one full pass"),
    ("eval_timesteps: [0.5, 0.3]", "increasing quantiles without duplicates"),
    ("eval_timesteps: [0.0, 0.5]", "quantiles in (0, 1)"),
    ("missing validation set", "data.validation"),
    ("validation_split: 0.9", "fewer than one global batch"),
    ("keep_best: 2", "training.keep_best"),
    ("eval_iters: 4611686018427387904, eval_batch_size: 2", "training.eval_iters x samples per global batch"),
    ("loader: micro_batch_tokens: 100", "over data.dataloader_param.micro_batch_tokens 100 (over_budget_samples: skip"),
])
def test_bad_validation_settings_are_named(tmp_path, magihuman_data, setting, message):
    training, validation, loader = EVAL, ", validation_split: 0.25", ""
    if setting.startswith("loader:"):
        loader = ", " + setting.removeprefix("loader: ")
    elif setting.startswith("training:"):
        validation = ""
    elif setting.startswith("validation_split"):
        validation = ", " + setting
    elif setting == "missing validation set":
        validation = f", validation: {{data_root: {tmp_path / 'nowhere'}}}"
    else:
        training += ", " + setting
    proc = run(tmp_path, magihuman_config, magihuman_data, 1, training=training + ", global_batch_size: 8",
               validation=validation, loader=loader, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr
