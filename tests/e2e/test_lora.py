"""LoRA fine-tuning (features.enable_lora, features.lora), end to end under torchrun:

  * FSDP, context parallelism and the rest: a LoRA run on 2 ranks (FSDP), Ulysses 2, ring 2,
    recompute, HSDP with the moments on disk, cpu_offload with the disk tier and token-budget
    micro-batches equals one rank per step (loss within 1e-6, grad norm within 2e-6, fp32), both
    models, with evaluation (the held-out loss of the adapted model) on the way;
  * checkpoints hold the adapters, their moments and the base's identity, not the base; a run
    stopped and resumed with load: auto (and an async save) continues bitwise, on 2 ranks or
    shrunk to 1; the whole-model conversions refuse them;
  * a LoRA checkpoint is refused by a run without LoRA, a full checkpoint by a LoRA run, another
    base by name; bad features.lora settings are refused by name.
"""
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from conftest import read_metrics, run_mmtrain, write_config
from test_token_budget import magihuman_config, magihuman_data, mistral3_config, mistral3_data  # noqa: F401

LORA_MAP = "rank: 4, alpha: 8"


def config(tmp: Path, make_config, data: Path, training="", parallel="", lora=LORA_MAP, features="", iters=3, seed=5,
           validation=False, loader="") -> Path:
    """make_config's text with a global batch of 4 and, unless lora is None, features.lora (with
    validation: a quarter of the samples held out, evaluated before step 1 and after step 2)."""
    tmp.mkdir(parents=True, exist_ok=True)
    if validation:
        training += ", eval_interval: 2, eval_at_start: true"
    text = make_config(tmp, data, loader, ", global_batch_size: 4" + training, **({"parallel": parallel} if parallel else {}))
    text = text.replace("train_iters: 3", f"train_iters: {iters}").replace("seed: 5", f"seed: {seed}")
    if validation:
        text = text.replace("\n  dataloader_param:", "\n  validation_split: 0.25\n  dataloader_param:", 1)
    if lora is not None:
        text = text.replace("\ndata:", f"\nfeatures: {{enable_lora: true, lora: {{{lora}}}{features}}}\ndata:", 1)
    return write_config(tmp / "c.yaml", text)


def train(tmp: Path, make_config, data: Path, world=1, check=True, sets=(), **kw):
    args = ["train", str(config(tmp, make_config, data, **kw))] + [a for s in sets for a in ("--set", s)]
    proc = run_mmtrain(args, world=world, timeout=600, check=check)
    steps = [r for r in read_metrics(tmp / "run") if r.get("kind") != "eval"] if check else None
    return steps, proc


def evals(tmp: Path):
    return [r for r in read_metrics(tmp / "run") if r.get("kind") == "eval"]


def worst(a, b, key):
    return max(abs(x[key] - y[key]) / abs(y[key]) for x, y in zip(a, b))


@pytest.mark.parametrize("model", ["magihuman", "mistral3"])
def test_lora_composes_with_fsdp_cp_recompute_offload_and_evaluation(tmp_path, model, magihuman_data, mistral3_data):
    """Every arm equals one rank: FSDP, Ulysses, ring, recompute, HSDP with the moments on disk,
    and the shards in host RAM with the disk tier (which holds only what trains); each evaluates
    the adapted model on the way, to the same held-out loss. Token-budget micro-batches on 2 ranks
    equal them on one."""
    make, data, blocks = {
        "magihuman": (magihuman_config, magihuman_data, '["dit.block.layers.{*}"]'),
        "mistral3": (mistral3_config, mistral3_data, '["model.language_model.layers.{*}"]'),
    }[model]
    one, proc = train(tmp_path / "one", make, data, validation=True)
    assert re.search(r"features.lora: rank 4, scale 2; trains \d+ of \d+ parameters", proc.stdout), proc.stdout
    assert 0 < one[0]["trainable_params"] < one[0]["total_params"] / 5, one[0]
    evals_one = evals(tmp_path / "one")
    assert [e["iteration"] for e in evals_one] == [0, 2]
    (tmp_path / "disk").mkdir()
    swap = f", optimizer: adamw_swap, offload_dir: {tmp_path / 'disk'}"
    arms = [("fsdp", 2, "", "", "", ()),
            ("ulysses", 2, "\n  ulysses_parallel_size: 2", "", "", ()),
            ("ring", 2, "\n  ring_attention_size: 2", "", "", ()),
            ("recompute", 2, "", ", recompute: true, recompute_plan: {apply_modules: " + blocks + "}", "", ()),
            ("hsdp_swap", 4, "\n  fully_shard_parallel_size: 2", "", swap, ()),
            ("cpu_offload_disk", 2, "", "", swap, ("parallel.fsdp_plan.cpu_offload=true",))]
    for name, world, parallel, features, training, sets in arms:
        other, _ = train(tmp_path / name, make, data, world=world, parallel=parallel, features=features,
                         training=training, sets=sets, validation=True)
        for key, tolerance in (("loss", 1e-6), ("grad_norm", 2e-6)):
            w = worst(other, one, key)
            print(f"[{model} {name}] worst {key} relative difference to one rank {w:.2e}")
            assert w <= tolerance, (name, key, w)
        w = worst(evals(tmp_path / name), evals_one, "eval_loss")
        print(f"[{model} {name}] worst eval_loss relative difference to one rank {w:.2e}")
        assert w <= 1e-6, (name, w)

    budget = ", micro_batch_tokens: 1024"
    one_budget, _ = train(tmp_path / "budget_one", make, data, loader=budget)
    two_budget, proc = train(tmp_path / "budget_two", make, data, world=2, loader=budget)
    assert "micro-batches of at most 1024 tokens balanced" in proc.stdout
    for key, tolerance in (("loss", 1e-6), ("grad_norm", 2e-6)):
        w = worst(two_budget, one_budget, key)
        print(f"[{model} token budget] worst {key} relative difference to one rank {w:.2e}")
        assert w <= tolerance, ("token budget", key, w)


def test_lora_checkpoint_holds_the_adapters_and_resumes_bitwise(tmp_path, magihuman_data):
    straight, _ = train(tmp_path / "straight", magihuman_config, magihuman_data, world=2,
                        training=f", save: {tmp_path / 'straight' / 'ckpt'}, save_interval: 2")
    ckpt = tmp_path / "straight" / "ckpt" / "iter_0000002"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["lora_base"]["init_seed"] == 5 and state["lora_base"]["adapters"]["rank"] == 4, state
    names = set()
    for shard in ckpt.glob("rank_*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            names |= set(f.keys())
    assert any("lora_A" in n for n in names) and any(n.startswith("optim.exp_avg.") and "lora_B" in n for n in names)
    base = sorted(n for n in names if "lora_" not in n)
    assert not [n for n in base if n.endswith(".weight")], base[:5]  # buffers only: no frozen weight is saved

    save = f", save: {tmp_path / 'resumed' / 'ckpt'}, save_interval: 2, load: auto"
    first, _ = train(tmp_path / "resumed", magihuman_config, magihuman_data, world=2, training=save + ", exit_interval: 2")
    assert [m["iteration"] for m in first] == [1, 2]
    resumed, proc = train(tmp_path / "resumed", magihuman_config, magihuman_data, world=2,
                          training=save + ", async_save: true")  # and saved in the background
    assert "resumed from" in proc.stdout
    assert [m["loss"] for m in resumed] == [m["loss"] for m in straight], (resumed, straight)

    # Elastic: the 2-rank checkpoint continues on one rank, the same batches within fp32 reductions.
    shrunk, proc = train(tmp_path / "shrunk", magihuman_config, magihuman_data, world=1, training=f", load: {ckpt}")
    assert "saved on 2 ranks, now 1" in proc.stdout, proc.stdout[-1500:]
    assert abs(shrunk[-1]["loss"] - straight[-1]["loss"]) <= 1e-5 * abs(straight[-1]["loss"]), (shrunk, straight)
    # The checkpoint is an ordinary one to the tools that read any: verified; the whole-model
    # conversions refuse it by name.
    run_mmtrain(["ckpt", "verify", str(ckpt)])
    proc = run_mmtrain(["convert", "magihuman", "ckpt-to-dcp", "--load_dir", str(ckpt), "--save_dir",
                        str(tmp_path / "dcp")], check=False)
    assert proc.returncode != 0 and "is a LoRA checkpoint (adapters without their base)" in proc.stderr, proc.stderr


def test_lora_refuses_mismatched_checkpoints_and_bad_settings(tmp_path, magihuman_data):
    lora_ckpt, full_ckpt = tmp_path / "lora" / "ckpt", tmp_path / "full" / "ckpt"
    train(tmp_path / "lora", magihuman_config, magihuman_data, training=f", save: {lora_ckpt}")
    train(tmp_path / "full", magihuman_config, magihuman_data, training=f", save: {full_ckpt}", lora=None)
    resumes = [
        ("no_lora", dict(training=f", load: {lora_ckpt}", iters=5, lora=None),
         "it is a LoRA checkpoint (adapters over a random init with seed 5), and this config has "
         "features.enable_lora off"),
        ("onto_full", dict(training=f", load: {full_ckpt}", iters=5),
         "it is a full fine-tuning checkpoint and this config trains LoRA adapters"),
        ("other_base", dict(training=f", load: {lora_ckpt}", iters=5, seed=6),
         "its adapters were trained over a random init with seed 5, and this run's base is a random init with seed 6"),
        ("other_quant", dict(training=f", load: {lora_ckpt}", iters=5, lora=LORA_MAP + ", base_quant: int8"),
         'features.lora.base_quant is "int8" in this config, and the checkpoint\'s adapters were trained with "none"'),
    ]
    settings = [
        ("rank: 0, alpha: 8", "features.lora.rank"),
        ("rank: 4, alpha: 0", "features.lora.alpha: expected a positive number"),
        ("rank: 4, dropout: 1.0", "features.lora.dropout"),
        ("rank: 4, dropout: 0.1", "LoRA dropout is not implemented yet"),
        ("rank: 65", "is above min(in, out)"),
        ("target_modules: ['dit.block.layers.{*}.attention.q_norm']", "is not a Linear layer"),
        ("target_modules: ['dit.block.layers.{*}.attention.linear_q']", "matches no module"),
        ("target_modules: ['dit.adapter.video_embedder']", "computed from its raw weight"),
        ("modules_to_save: ['dit.block.layers.0.attention.linear_qkv']", "is both a target"),
        ("rank: 4, base_quant: nf5", "features.lora.base_quant"),
    ]
    cases = resumes + [(f"bad{i}", dict(lora=lora), needle) for i, (lora, needle) in enumerate(settings)]
    for name, kw, needle in cases:
        _, proc = train(tmp_path / name, magihuman_config, magihuman_data, check=False, **kw)
        assert proc.returncode != 0 and needle in proc.stderr, (name, proc.stderr[-1500:])
    proc = run_mmtrain(["convert", "magihuman", "lora-to-peft", "--load_dir", str(full_ckpt), "--save_dir",
                        str(tmp_path / "peft")], check=False)
    assert proc.returncode != 0 and "holds no LoRA adapters" in proc.stderr, proc.stderr
    # A quantized base without LoRA: nothing would keep it frozen.
    cfg = config(tmp_path / "no_lora_quant", magihuman_config, magihuman_data, lora="rank: 4, base_quant: nf4")
    write_config(cfg, cfg.read_text().replace("enable_lora: true", "enable_lora: false"))
    proc = run_mmtrain(["train", str(cfg)], check=False)
    assert proc.returncode != 0 and "features.lora.base_quant: expected none unless features.enable_lora" in proc.stderr, \
        proc.stderr[-1500:]


def test_magihuman_merge_lora_equals_the_adapted_model_and_leaves_the_base(tmp_path, magihuman_data):
    """Adapters on every projection (the gated layers' up_gate_proj included: its HF rows are laid out
    otherwise) over HF-layout weights; merge-lora's weights load as a plain base whose step equals the
    adapted model's, the untargeted tensors are the base's bytes, and PEFT refuses the expert layers."""
    weights = tmp_path / "base"
    cfg = config(tmp_path / "weights", magihuman_config, magihuman_data, lora=None)
    run_mmtrain(["fixture", "magihuman-weights", "--config", str(cfg), "--out", str(weights), "--seed", "4"])
    every = ("target_modules: ['dit.block.layers.{*}.attention.linear_qkv', 'dit.block.layers.{*}.attention.linear_proj', "
             "'dit.block.layers.{*}.mlp.up_gate_proj', 'dit.block.layers.{*}.mlp.down_proj'], rank: 4, alpha: 8")
    trained = tmp_path / "trained"
    cfg = config(trained, magihuman_config, magihuman_data, lora=every,
                 training=f", save: {trained / 'ckpt'}, lr: 2.0e-2")
    text = cfg.read_text().replace("model: {model_id: magihuman,", f"model: {{model_id: magihuman, model_name_or_path: {weights},")
    write_config(cfg, text.replace("lr: 2.0e-3, ", ""))
    run_mmtrain(["train", str(cfg)], world=2, timeout=600)
    state = json.loads((trained / "ckpt" / "iter_0000003" / "trainer_state.json").read_text())
    assert state["lora_base"]["weights"] == str(weights) and len(state["lora_base"]["fingerprint"]) == 64, state

    for dtype in ("fp32", "public"):
        run_mmtrain(["convert", "magihuman", "merge-lora", "--load_dir", str(trained / "ckpt"),
                     "--save_dir", str(tmp_path / f"merged_{dtype}"), "--dtype", dtype])
    batch = tmp_path / "batch.safetensors"
    run_mmtrain(["debug", "collate", str(cfg), "--out", str(batch)])
    step_lora = write_config(tmp_path / "step_lora.yaml", cfg.read_text().replace(f"save: {trained / 'ckpt'}",
                                                                                   f"load: {trained / 'ckpt'}"))
    step_merged = write_config(tmp_path / "step_merged.yaml", cfg.read_text()
                               .replace(str(weights), str(tmp_path / "merged_fp32"))
                               .replace("enable_lora: true", "enable_lora: false")
                               .replace(f", save: {trained / 'ckpt'}", ""))
    outs = {}
    for name, step_cfg in (("lora", step_lora), ("merged", step_merged)):
        run_mmtrain(["debug", "step", str(step_cfg), "--batch", str(batch), "--out", str(tmp_path / f"{name}.safetensors")])
        with safe_open(str(tmp_path / f"{name}.safetensors"), "pt") as f:
            outs[name] = {k: f.get_tensor(k) for k in f.keys() if not k.startswith("grad.")}
    for key, want in outs["lora"].items():
        got = outs["merged"][key]
        rel = ((got.double() - want.double()).norm() / want.double().norm()).item()
        print(f"[magihuman merge-lora] {key} rel L2 {rel:.2e}")
        assert rel <= 1e-5, (key, rel)

    # The untargeted tensors of the public-dtype merge are the base's, byte for byte; the targets moved.
    base, merged = {}, {}
    for shard in weights.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            base.update({k: f.get_tensor(k) for k in f.keys()})
    with safe_open(str(tmp_path / "merged_public" / "model.safetensors"), "pt") as f:
        merged = {k: f.get_tensor(k) for k in f.keys()}
    assert set(base) == set(merged)
    targets = ("linear_qkv", "linear_proj", "up_gate_proj", "down_proj")
    same = [k for k in base if not any(t in k for t in targets)]
    assert same and all(torch.equal(base[k], merged[k]) for k in same)
    assert all(not torch.equal(base[k], merged[k]) for k in base if any(t in k for t in targets))

    proc = run_mmtrain(["convert", "magihuman", "lora-to-peft", "--load_dir", str(trained / "ckpt"),
                        "--save_dir", str(tmp_path / "peft")], check=False)
    assert proc.returncode != 0 and "modality experts, which a PEFT LoRA layer cannot express" in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def magihuman_bases(tmp_path_factory, magihuman_data):
    """HF-layout MagiHuman weights, quantize-base nf4 of them, and dequantize-base of that."""
    tmp = tmp_path_factory.mktemp("qlora")
    cfg = config(tmp / "weights", magihuman_config, magihuman_data, lora=None)
    run_mmtrain(["fixture", "magihuman-weights", "--config", str(cfg), "--out", str(tmp / "base"), "--seed", "4"])
    run_mmtrain(["convert", "magihuman", "quantize-base", "--dtype", "nf4", "--load_dir", str(tmp / "base"),
                 "--save_dir", str(tmp / "nf4")])
    run_mmtrain(["convert", "magihuman", "dequantize-base", "--load_dir", str(tmp / "nf4"), "--save_dir", str(tmp / "back")])
    return tmp


def qlora_and_lora(tmp_path, magihuman_data, magihuman_bases, world=1, sets=(), validation=False, **kw):
    """The same run twice: QLoRA (nf4) over the nf4 directory and LoRA over its dequantization; each one's
    (loss, grad norm) records, evaluations, saved adapters and output."""
    every = ("target_modules: ['dit.block.layers.{*}.attention.linear_qkv', 'dit.block.layers.{*}.attention.linear_proj', "
             "'dit.block.layers.{*}.mlp.up_gate_proj', 'dit.block.layers.{*}.mlp.down_proj'], rank: 4, alpha: 8")
    runs = {}
    for name, base, quant in (("qlora", "nf4", "nf4"), ("lora", "back", "none")):
        run = tmp_path / name
        training = kw.get("training", "")
        cfg = config(run, magihuman_config, magihuman_data, lora=every + f", base_quant: {quant}", validation=validation,
                     **{**kw, "training": training + f", save: {run / 'ckpt'}"})
        text = cfg.read_text().replace("model: {model_id: magihuman,",
                                       f"model: {{model_id: magihuman, model_name_or_path: {magihuman_bases / base},")
        write_config(cfg, text)
        proc = run_mmtrain(["train", str(cfg), *[a for s in sets for a in ("--set", s)]], world=world, timeout=600)
        steps = [(r["loss"], r["grad_norm"]) for r in read_metrics(run / "run") if "loss" in r]
        saved = {f.name: f.read_bytes() for f in sorted((run / "ckpt" / "iter_0000003").glob("*.safetensors"))}
        runs[name] = (steps, [e["eval_loss"] for e in evals(run)], saved, proc.stdout + proc.stderr)
    return runs


@pytest.mark.parametrize("world,parallel", [(1, ""), (2, "\n  ulysses_parallel_size: 2")], ids=["1rank", "ulysses2"])
def test_magihuman_qlora_is_lora_on_the_dequantized_base(tmp_path, magihuman_data, magihuman_bases, world, parallel):
    """The nf4 base held by FSDP as rows of codes and scales (the gated MLP's rows moved to the training
    layout with their scales, the down_proj's rows grouped into whole blocks) trains bitwise as LoRA over
    its dequantization: losses, grad norms and the saved adapters."""
    runs = qlora_and_lora(tmp_path, magihuman_data, magihuman_bases, world, parallel=parallel)
    assert len(runs["qlora"][0]) == 3 and runs["qlora"][:3] == runs["lora"][:3]
    # All 8 adapted projections: the gated layer's down_proj rows (MLP width 168) are not whole 64-blocks, so
    # its stored rows are 8 weight rows each, bitsandbytes' blocks running across them.
    assert re.search(r"base_quant nf4: 8 frozen weights as rows of codes and scales", runs["qlora"][3]), runs["qlora"][3][-2000:]


def test_qlora_composes_with_recompute_offload_hsdp_budgets_async_saves_and_evaluation(tmp_path, magihuman_data,
                                                                                      magihuman_bases):
    """On 2 ranks, each arm's QLoRA run is bitwise its LoRA run over the dequantized base: recompute with
    evaluation; the shards (the quantized rows included) in host RAM with the moments on disk; HSDP (two
    replicas) with token-budget micro-batches and an async save."""
    (tmp_path / "disk").mkdir()
    arms = [("recompute_eval", dict(features=", recompute: true, recompute_plan: {apply_modules: [\"dit.block.layers.{*}\"]}",
                                    validation=True), ()),
            ("cpu_offload_disk", dict(training=f", optimizer: adamw_swap, offload_dir: {tmp_path / 'disk'}"),
             ("parallel.fsdp_plan.cpu_offload=true",)),
            ("hsdp_budget_async", dict(parallel="\n  fully_shard_parallel_size: 1", loader=", micro_batch_tokens: 1024",
                                       training=", async_save: true"), ())]
    for name, kw, sets in arms:
        runs = qlora_and_lora(tmp_path / name, magihuman_data, magihuman_bases, 2, sets, **kw)
        assert len(runs["qlora"][0]) == 3 and runs["qlora"][:3] == runs["lora"][:3], name
        assert not kw.get("validation") or len(runs["qlora"][1]) == 2, name
