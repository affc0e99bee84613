"""Validates the Python oracle itself; needs no mmtrain binary, so it never skips.

Contract:
  * the model equals an independent fp64 loop implementation of the contract's math;
  * fixture layout, LR schedule and data order are what the contract says;
  * plain single-process training == PyTorch FSDP2 on gloo ranks (fp32: 1e-5 relative on
    every step's loss and grad_norm and on final params; bf16 params: looser, see TOLERANCES);
  * load_mmtrain_params reads the sharded layout with and without index.json, with ranks that
    hold 0 rows or lack a tensor, and rejects an index that does not match the files;
  * config_io parses the mmtrain YAML example and round-trips what it writes.
"""
import json
import math
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import config_io
import mmtrain_util as mu
import reference_transformer as rt

TINY = dict(vocab_size=37, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
            ffn_hidden_size=48, rope_theta=500.0, rms_norm_eps=1e-5)
# Vocab 130 does not split evenly over 4 ranks (33, 33, 33, 31 rows): exercises FSDP2 padding.
ORACLE_MODEL = dict(vocab_size=130, hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
                    ffn_hidden_size=96, rope_theta=10000.0, rms_norm_eps=1e-6)


# ----------------------------------------------------------------------------- model math

def naive_logits(params: dict, cfg: rt.ModelConfig, inputs: torch.Tensor) -> torch.Tensor:
    """fp64, explicit loops; RoPE written as rotations of (i, i + hd/2) pairs."""
    P = {k: v.double() for k, v in params.items()}
    B, S = inputs.shape
    nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    group = nh // nkv

    def norm(x, w):
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.rms_norm_eps)

    def rope(t):
        out = t.clone()
        for pos in range(S):
            for i in range(hd // 2):
                angle = pos * cfg.rope_theta ** (-2.0 * i / hd)
                c, s = math.cos(angle), math.sin(angle)
                x1, x2 = t[:, pos, :, i], t[:, pos, :, i + hd // 2]
                out[:, pos, :, i] = x1 * c - x2 * s
                out[:, pos, :, i + hd // 2] = x2 * c + x1 * s
        return out

    x = P["embed.weight"][inputs]
    for layer in range(cfg.num_layers):
        p = f"layers.{layer}."
        a = norm(x, P[p + "attn_norm.weight"])
        q = rope((a @ P[p + "attn.wq.weight"].T).view(B, S, nh, hd))
        k = rope((a @ P[p + "attn.wk.weight"].T).view(B, S, nkv, hd))
        v = (a @ P[p + "attn.wv.weight"].T).view(B, S, nkv, hd)
        o = torch.zeros(B, S, nh, hd, dtype=torch.float64)
        for b in range(B):
            for h in range(nh):
                kv = h // group
                scores = q[b, :, h] @ k[b, :, kv].T / math.sqrt(hd)
                scores = scores.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool), 1), -math.inf)
                o[b, :, h] = torch.softmax(scores, -1) @ v[b, :, kv]
        x = x + o.reshape(B, S, nh * hd) @ P[p + "attn.wo.weight"].T
        m = norm(x, P[p + "mlp_norm.weight"])
        gate = m @ P[p + "mlp.w1.weight"].T
        x = x + ((gate * torch.sigmoid(gate)) * (m @ P[p + "mlp.w3.weight"].T)) @ P[p + "mlp.w2.weight"].T
    return norm(x, P["norm.weight"]) @ P["lm_head.weight"].T


def test_model_matches_naive_loop():
    cfg = rt.ModelConfig.from_dict(TINY)
    params = rt.init_params(cfg, seed=7)
    # Non-trivial norm weights so a swapped or ignored norm weight shows, and 5x the init scale
    # so attention is far from uniform and position (RoPE) errors show in the logits.
    gen = torch.Generator().manual_seed(3)
    for name in params:
        if params[name].dim() == 1:
            params[name] = 1.0 + 0.1 * torch.randn(params[name].shape, generator=gen)
        else:
            params[name] = params[name] * 5.0
    model = rt.ReferenceTransformer(cfg)
    model.load_state_dict(params)
    tokens = torch.randint(0, cfg.vocab_size, (2, 9), generator=gen)

    expect_logits = naive_logits(params, cfg, tokens[:, :-1])
    expect_loss = torch.nn.functional.cross_entropy(expect_logits.reshape(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1))
    with torch.no_grad():
        logits = model.logits(tokens[:, :-1])
        loss = model(tokens)
    scale = expect_logits.abs().max().item()
    assert (logits.double() - expect_logits).abs().max().item() <= 1e-5 * scale
    assert abs(loss.item() - expect_loss.item()) <= 1e-6 * expect_loss.item()


def test_parameter_names_and_order_match_contract():
    cfg = rt.ModelConfig.from_dict(ORACLE_MODEL)
    model = rt.ReferenceTransformer(cfg)
    names = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert names == list(rt.param_shapes(cfg).items())


def test_fixture_layout(tmp_path):
    cfg = rt.ModelConfig.from_dict(TINY)
    model_path, tokens_path = rt.make_fixture(str(tmp_path / "a"), cfg, num_samples=10, seq_len=7, seed=5)
    params = load_file(model_path)
    assert set(params) == set(rt.param_shapes(cfg))
    for name, shape in rt.param_shapes(cfg).items():
        t = params[name]
        assert t.dtype == torch.float32 and tuple(t.shape) == shape, name
        if len(shape) == 1:
            assert torch.equal(t, torch.ones(shape)), name
        else:
            assert abs(t.std().item() - 0.02) < 0.004 and abs(t.mean().item()) < 0.004, name
    tokens = load_file(tokens_path)["tokens"]
    assert tokens.dtype == torch.int64 and tuple(tokens.shape) == (10, 7)
    assert 0 <= tokens.min().item() and tokens.max().item() < cfg.vocab_size
    # Deterministic in the seed.
    rt.make_fixture(str(tmp_path / "b"), cfg, num_samples=10, seq_len=7, seed=5)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert (tmp_path / "a" / "tokens.safetensors").read_bytes() == (tmp_path / "b" / "tokens.safetensors").read_bytes()


# ----------------------------------------------------------------------------- schedule and data

def test_lr_schedule_values():
    lr, lo = 1e-3, 1e-4
    cos = lambda t: rt.lr_at(t, lr, lo, 20, 0.1, "cosine")  # noqa: E731  warmup = 2
    assert cos(0) == 0.0 and cos(1) == pytest.approx(5e-4) and cos(2) == pytest.approx(1e-3)
    assert cos(3) == pytest.approx(lo + (lr - lo) * 0.5 * (math.cos(math.pi / 18) + 1))
    assert cos(19) == pytest.approx(lo + (lr - lo) * 0.5 * (math.cos(math.pi * 17 / 18) + 1))
    assert rt.lr_at(19, lr, lo, 20, 0.1, "linear") == pytest.approx(lo + (lr - lo) / 18)
    assert rt.lr_at(7, lr, lo, 20, 0.1, "constant") == lr
    assert rt.lr_at(0, lr, lo, 20, 0.0, "cosine") == lr  # no warmup: step 0 is at lr_max
    assert rt.lr_at(1, lr, lo, 20, 0.0, "linear") == pytest.approx(lo + (lr - lo) * (1 - 1 / 20))
    assert int(0.29 * 100) == 28  # the warmup length truncates the double product, like C++


def test_micro_batch_indices():
    # W=2, mbs=2, accum=2 -> GBS 8; step 1, micro 1, rank 0: 8 + (1*2 + 0)*2 = 12.
    assert rt.micro_batch_indices(1, 1, 0, 2, 2, 2, 100).tolist() == [12, 13]
    assert rt.micro_batch_indices(1, 1, 1, 2, 2, 2, 100).tolist() == [14, 15]
    assert rt.micro_batch_indices(0, 0, 1, 2, 2, 2, 100).tolist() == [2, 3]
    assert rt.micro_batch_indices(1, 1, 1, 2, 2, 2, 15).tolist() == [14, 0]  # wraps modulo N
    # The W-rank split covers each step's GBS samples exactly once, in the same order as W=1.
    per_rank = [rt.micro_batch_indices(3, m, r, 4, 2, 3, 1000).tolist() for m in range(3) for r in range(4)]
    single = [rt.micro_batch_indices(3, m, 0, 1, 2, 12, 1000).tolist() for m in range(12)]
    assert per_rank == single


# ----------------------------------------------------------------------------- plain == FSDP2

@pytest.fixture(scope="module")
def oracle_fixture(tmp_path_factory):
    d = tmp_path_factory.mktemp("oracle_fixture")
    return rt.make_fixture(str(d), ORACLE_MODEL, num_samples=40, seq_len=33, seed=1234)


def _oracle_cfg(fixture, out_dir, **kw):
    model_path, tokens_path = fixture
    return mu.mmtrain_config(model_path, tokens_path, ORACLE_MODEL, str(out_dir / "run"),
                             save=str(out_dir / "ckpt"), micro_batch_size=2, gradient_accumulation_steps=2,
                             train_iters=20, lr=2e-3, clip_grad=0.5, **kw)


# (loss, grad_norm, params) relative bounds. fp32: reduction order only, measured ~2e-7.
# bf16: once the fp32-rounding difference of a clip coefficient flips one bf16 rounding, the runs
# drift apart like any two bf16 runs (measured W=4: loss 3e-5, grad_norm 2e-3, params 1.3e-3).
TOLERANCES = {"fp32": (1e-5, 1e-5, 1e-5), "bf16": (3e-4, 2e-2, 2e-2)}


@pytest.mark.parametrize("param_dtype,world", [("fp32", 2), ("bf16", 4)])
def test_plain_matches_fsdp2(oracle_fixture, tmp_path, param_dtype, world, parity_report):
    plain_cfg = _oracle_cfg(oracle_fixture, tmp_path / "plain", param_dtype=param_dtype)
    # The FSDP2 side also turns on recompute and deeper prefetch: neither may change numbers.
    fsdp_cfg = _oracle_cfg(oracle_fixture, tmp_path / "fsdp", param_dtype=param_dtype, recompute=True, prefetch=2)
    plain = rt.train(plain_cfg, world, fsdp=False, threads=1)
    fsdp = rt.train(fsdp_cfg, world, fsdp=True, threads=1)

    assert [m["iteration"] for m in fsdp.metrics] == list(range(1, 21))
    loss_rel = mu.step_rel_diffs(mu.column(fsdp.metrics, "loss"), mu.column(plain.metrics, "loss"))
    norm_rel = mu.step_rel_diffs(mu.column(fsdp.metrics, "grad_norm"), mu.column(plain.metrics, "grad_norm"))
    param_rel = mu.param_rel_diffs(fsdp.params, plain.params)
    parity_report(f"[oracle: plain vs torch FSDP2, {param_dtype} W={world}] max loss rel {max(loss_rel):.3g}, max grad_norm rel {max(norm_rel):.3g}, "
          f"max param rel {max(param_rel.values()):.3g}, curve sum|a-b|/sum|b| "
          f"{mu.curve_rel_diff(mu.column(fsdp.metrics, 'loss'), mu.column(plain.metrics, 'loss')):.3g}")
    loss_tol, norm_tol, param_tol = TOLERANCES[param_dtype]
    assert max(loss_rel) <= loss_tol
    assert max(norm_rel) <= norm_tol
    assert max(param_rel.values()) <= param_tol
    assert mu.column(fsdp.metrics, "lr") == mu.column(plain.metrics, "lr")
    # Clipping must have been active for this check to cover it.
    assert max(mu.column(plain.metrics, "grad_norm")) > 0.5
    # Training moved the parameters and the loss.
    assert plain.metrics[-1]["loss"] < plain.metrics[0]["loss"]

    # The sharded checkpoint reads back to exactly the gathered params, with and without index.json.
    iter_dir = mu.latest_iter_dir(str(tmp_path / "fsdp" / "ckpt"))
    assert os.path.basename(iter_dir) == "iter_0000020"
    assert sorted(os.listdir(iter_dir)) == ["index.json"] + [mu.rank_file_name(r) for r in range(world)]
    for name, t in mu.load_mmtrain_params(iter_dir).items():
        assert torch.equal(t, fsdp.params[name]), name
    os.remove(os.path.join(iter_dir, "index.json"))
    for name, t in mu.load_mmtrain_params(iter_dir).items():
        assert torch.equal(t, fsdp.params[name]), name


# ----------------------------------------------------------------------------- checkpoint reader

def _write_synthetic(iter_dir, with_index):
    full = {"a": torch.arange(30.0).view(10, 3), "b": torch.arange(3.0), "c": torch.arange(8.0).view(2, 4)}
    world = 4
    os.makedirs(iter_dir)
    for r in range(world):
        local = {}
        for name, t in full.items():
            start, rows = mu.shard_rows(t.shape[0], r, world)
            if name == "c" and rows == 0:
                continue  # a rank may lack the tensor altogether ...
            local[name] = t[start:start + rows]  # ... or hold 0 rows (b on rank 3)
        local_keys = {"model." + k: v.contiguous() for k, v in local.items()}
        local_keys["optim.step"] = torch.tensor([1.0])  # non-model keys are ignored
        save_file(local_keys, os.path.join(iter_dir, mu.rank_file_name(r)))
    if with_index:
        # Reuse the writer for the index only (rank 0), then restore rank 0's file.
        saved = open(os.path.join(iter_dir, mu.rank_file_name(0)), "rb").read()
        mu.write_sharded_params(iter_dir, 0, world, {k: v[:1] for k, v in full.items()},
                                {k: v.shape for k, v in full.items()}, iteration=1)
        open(os.path.join(iter_dir, mu.rank_file_name(0)), "wb").write(saved)
    return full


@pytest.mark.parametrize("with_index", [False, True])
def test_load_mmtrain_params_layout(tmp_path, with_index):
    iter_dir = str(tmp_path / "iter_0000001")
    full = _write_synthetic(iter_dir, with_index)
    assert mu.shard_rows(3, 3, 4) == (3, 0) and mu.shard_rows(2, 1, 4) == (1, 1) and mu.shard_rows(2, 2, 4) == (2, 0)
    loaded = mu.load_mmtrain_params(iter_dir)
    assert set(loaded) == set(full)
    for name in full:
        assert torch.equal(loaded[name], full[name]), name
    assert mu.latest_iter_dir(str(tmp_path)) == iter_dir


def test_load_mmtrain_params_index_checks(tmp_path):
    iter_dir = str(tmp_path / "iter_0000001")
    _write_synthetic(iter_dir, with_index=True)
    index_path = os.path.join(iter_dir, "index.json")
    index = json.load(open(index_path))
    index["tensors"]["model.a"]["shape"] = [11, 3]
    json.dump(index, open(index_path, "w"))
    with pytest.raises(ValueError):
        mu.load_mmtrain_params(iter_dir)
    # An index in some other format is ignored (with a warning), not trusted.
    json.dump({"weight_map": {}}, open(index_path, "w"))
    with pytest.warns(UserWarning):
        loaded = mu.load_mmtrain_params(iter_dir)
    assert loaded["a"].shape == (10, 3)


def test_metrics_reader_and_curve_metric(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iteration": 2, "loss": 2.0}\n\n{"iteration": 1, "loss": 4.0}\n')
    metrics = mu.read_metrics(str(path))
    assert [m["iteration"] for m in metrics] == [1, 2]
    assert mu.curve_rel_diff([4.0, 1.0], [4.0, 2.0]) == pytest.approx(1 / 6)


# ----------------------------------------------------------------------------- YAML

EXAMPLE_YAML = """\
model:
  model_id: test_transformer
  model_name_or_path: /abs/dir/model.safetensors
  config: {vocab_size: 128, hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, ffn_hidden_size: 128, rope_theta: 10000.0, rms_norm_eps: 1.0e-6}
data:
  dataset_param: {dataset_type: token_file, path: /abs/dir/tokens.safetensors}
  dataloader_param: {collate_param: {model_name: causal_lm}}
parallel:
  fsdp_plan: {apply_modules: ["layers.{*}"], param_dtype: fp32, reduce_dtype: fp32, num_to_forward_prefetch: 1, num_to_backward_prefetch: 1}
features: {recompute: false, recompute_plan: {apply_modules: ["layers.{*}"]}}
training: {micro_batch_size: 2, gradient_accumulation_steps: 1, train_iters: 20, lr: 1.0e-3, lr_min: 1e-4, lr_warmup_ratio: 0.1, lr_decay_style: cosine, weight_decay: 0.01, clip_grad: 1.0, seed: 42, save: /abs/dir/ckpt}
logging:   # block style works too
  output_dir: '/abs/dir/run'
  tags:
  - a
  - {k: "v # not a comment"}
  - name: x
    value: 2
"""


def test_yaml_subset_parser(tmp_path):
    cfg = config_io.parse_yaml(EXAMPLE_YAML)
    assert cfg["model"]["config"] == dict(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4,
                                          num_kv_heads=2, ffn_hidden_size=128, rope_theta=10000.0, rms_norm_eps=1e-6)
    assert cfg["parallel"]["fsdp_plan"]["apply_modules"] == ["layers.{*}"]
    assert cfg["features"]["recompute"] is False
    assert cfg["training"]["lr_min"] == 1e-4 and cfg["training"]["lr_decay_style"] == "cosine"
    assert cfg["logging"] == {"output_dir": "/abs/dir/run",
                              "tags": ["a", {"k": "v # not a comment"}, {"name": "x", "value": 2}]}
    path = config_io.write_yaml(cfg, str(tmp_path / "c.yaml"))
    assert config_io.load_yaml(path) == cfg
    over = config_io.apply_overrides(cfg, ["training.lr=3e-4", "features.recompute=true", "new.key=[1, 'x']"])
    assert over["training"]["lr"] == 3e-4 and over["features"]["recompute"] is True and over["new"]["key"] == [1, "x"]
    assert cfg["training"]["lr"] == 1e-3  # overrides copy
    rc = rt.RunConfig.from_yaml_dict(cfg)
    assert rc.train_iters == 20 and rc.adam_beta2 == 0.999 and rc.param_dtype == torch.float32
    for bad in ["a: &x 1\n", "a: |\n  text\n", "a: 1\na: 2\n"]:
        with pytest.raises(config_io.ConfigSyntaxError):
            config_io.parse_yaml(bad)


def test_cli_fixture_and_train(tmp_path):
    """The CLI path: fixture subcommand, YAML file, --set overrides, --plain."""
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(rt.__file__), "reference_transformer.py")
    env = mu.child_env(1)
    subprocess.run([sys.executable, script, "fixture", "--out", str(tmp_path), "--vocab", "50", "--hidden", "32",
                    "--layers", "1", "--heads", "2", "--kv-heads", "1", "--ffn", "40", "--samples", "8",
                    "--seq", "9", "--seed", "3"], check=True, env=env, capture_output=True)
    cfg = mu.mmtrain_config(str(tmp_path / "model.safetensors"), str(tmp_path / "tokens.safetensors"),
                            dict(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                 ffn_hidden_size=40), str(tmp_path / "wrong"), train_iters=3)
    cfg_path = config_io.write_yaml(cfg, str(tmp_path / "cfg.yaml"))
    out = subprocess.run([sys.executable, script, "train", "--config", cfg_path, "--world", "2", "--plain",
                          "--set", f"logging.output_dir={tmp_path / 'run'}"], check=True, env=env,
                         capture_output=True, text=True)
    assert json.loads(out.stdout.strip().splitlines()[-1])["iterations"] == 3
    assert len(mu.read_metrics(str(tmp_path / "run" / "metrics.jsonl"))) == 3
    assert not (tmp_path / "wrong").exists()
    shutil.rmtree(tmp_path / "run")
