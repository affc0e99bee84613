"""mmtrain at W=2 and W=4 must train exactly like mmtrain at W=1 with the same global batch.

Contract (skips only when $MMTRAIN_BIN is unset or missing, see conftest.py):
  * every setting (recompute on/off, accumulation, prefetch depth 0/1/2) runs W=1 once (cached
    per module) and W=2, W=4 against it; GBS is fixed per setting: W ranks each run
    TOTAL_MICRO * a / W micro-batches of MICRO_BATCH samples, so W=1 runs a*W_MAX micro steps;
  * 20 steps; per-step loss and grad_norm within 1e-5 relative, lr equal, and every final
    parameter (from the W ranks' checkpoint) within 1e-5 relative (||a-b||_2 / ||b||_2);
  * vocab 130 splits unevenly over 4 ranks (33, 33, 33, 31 rows), 48 samples make the data
    order wrap around, 3 layers make prefetch depth 2 meaningful.
Runtime: 15 tiny runs, every rank with OMP_NUM_THREADS=1 (4 ranks oversubscribe 2 cores).
"""
import pytest

import config_io
import mmtrain_util as mu
import reference_transformer as rt

STEPS = 20
MICRO_BATCH = 2
W_MAX = 4
WORLDS = (2, 4)
TOL = 1e-5
MODEL = dict(vocab_size=130, hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
             ffn_hidden_size=96, rope_theta=10000.0, rms_norm_eps=1e-6)

# name -> (recompute, accumulation steps at W=4, prefetch depth)
SETTINGS = {
    "default": (False, 1, 1),
    "recompute": (True, 1, 1),
    "accum2": (False, 2, 1),
    "prefetch0": (False, 1, 0),
    "prefetch2": (False, 1, 2),
}


@pytest.fixture(scope="module")
def fixture_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("equivalence_fixture")
    return rt.make_fixture(str(d), MODEL, num_samples=48, seq_len=33, seed=99)


@pytest.fixture(scope="module")
def run_cache(mmtrain_bin, fixture_files, tmp_path_factory):
    """(setting, W) -> (metrics, final params); the W=1 baseline of a setting runs once."""
    cache = {}
    root = tmp_path_factory.mktemp("equivalence_runs")

    def run(setting: str, world: int):
        key = (setting, world)
        if key not in cache:
            recompute, accum_at_wmax, prefetch = SETTINGS[setting]
            d = root / f"{setting}_w{world}"
            d.mkdir()
            cfg = mu.mmtrain_config(*fixture_files, MODEL, str(d / "run"), save=str(d / "ckpt"),
                                    micro_batch_size=MICRO_BATCH,
                                    gradient_accumulation_steps=accum_at_wmax * W_MAX // world,
                                    train_iters=STEPS, lr=2e-3, clip_grad=0.5, recompute=recompute,
                                    prefetch=prefetch)
            cfg_path = config_io.write_yaml(cfg, str(d / "config.yaml"))
            mu.run_mmtrain(mmtrain_bin, cfg_path, world, str(d / "mmtrain.log"))
            metrics = mu.read_metrics(str(d / "run" / "metrics.jsonl"))
            iter_dir = mu.latest_iter_dir(str(d / "ckpt"))
            assert iter_dir.endswith(mu.iter_dir_name(STEPS)), f"final checkpoint should be iteration {STEPS}"
            cache[key] = (metrics, mu.load_mmtrain_params(iter_dir))
        return cache[key]

    return run


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sharded_matches_single_rank(run_cache, setting, world, parity_report):
    base_metrics, base_params = run_cache(setting, 1)
    metrics, params = run_cache(setting, world)

    assert [m["iteration"] for m in metrics] == list(range(1, STEPS + 1))
    assert [m["iteration"] for m in base_metrics] == list(range(1, STEPS + 1))
    loss_rel = mu.step_rel_diffs(mu.column(metrics, "loss"), mu.column(base_metrics, "loss"))
    norm_rel = mu.step_rel_diffs(mu.column(metrics, "grad_norm"), mu.column(base_metrics, "grad_norm"))
    lr_rel = mu.step_rel_diffs(mu.column(metrics, "lr"), mu.column(base_metrics, "lr"))
    param_rel = mu.param_rel_diffs(params, base_params)
    worst = max(param_rel, key=param_rel.get)
    parity_report(f"[mmtrain {setting}: W={world} vs W=1] max loss rel {max(loss_rel):.3e}, max grad_norm rel "
          f"{max(norm_rel):.3e}, max param rel {param_rel[worst]:.3e} ({worst})")

    assert max(loss_rel) <= TOL, f"loss rel per step: {loss_rel}"
    assert max(norm_rel) <= TOL, f"grad_norm rel per step: {norm_rel}"
    assert max(lr_rel) <= 1e-12, "lr must not depend on W"
    assert param_rel[worst] <= TOL, f"final params differ: {sorted(param_rel.items(), key=lambda kv: -kv[1])[:5]}"
    # A moving model: the check would be vacuous if nothing trained.
    assert metrics[-1]["loss"] < metrics[0]["loss"]
