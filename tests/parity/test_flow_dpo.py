"""Flow-DPO for MagiHuman (training.objective dpo over clip pairs; docs/preference.md) against the
formula written out through the independent reference DiT (reference_magihuman.py):

  e(x) = Σ_k w_k · mean over term k's supervised elements of (v - v_θ(x_t))²     k: video, audio
  loss = mean over pairs of -log σ(-β/2 · [(e_θ(w) - e_ref(w)) - (e_θ(l) - e_ref(l))])

each clip run through the reference on its own (attention never crosses packed samples), the
policy from a checkpoint two steps into full fine-tuning, the reference the initial weights (the
frozen copy full fine-tuning keeps). Checked: the collated pairs share timestep and noise; loss,
the TRL-named metrics and every gradient of `debug step` (fp32, 1e-5 relative L2); and a 3-step run
on 2 ranks equals the 1-rank run (per-step loss and metrics, the final checkpoint's weights and
moments) under FSDP, Ulysses 2, ring 2, HSDP (2 replicas) and recompute with the shards in host
memory (the reference copy's too), and all three offload features at once; and token-budget micro-batches (one pair each on 1 rank, two on 2
ranks) equal micro-batches of 2 pairs.
"""
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import reference_magihuman as R  # noqa: E402
import mmtrain_util as mu  # noqa: E402

_e2e = mu.e2e_helpers()
run_mmtrain, write_config, mmtrain_bin, read_metrics = _e2e.run_mmtrain, _e2e.write_config, _e2e.mmtrain_bin, _e2e.read_metrics

TINY = R.make_config(num_layers=4, hidden_size=64, head_dim=16, num_query_groups=2, video_in_channels=16,
                     audio_in_channels=8, text_in_channels=24, mm_layers=[0, 3], gelu7_layers=[0])
BETA = 400.0
PAIRS = 4          # in the data set: a step of 2 micro-batches of 2 pairs, an epoch a step
ITERS = 3
FP32_RTOL = 1e-5   # both sides fp32 CPU code; only the summation order differs
RANKS_RTOL = 1e-5  # 2 ranks / Ulysses 2 against 1 rank: reduction order only


def rel_l2(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


class Setup:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.weights, self.data = tmp / "weights", tmp / "data"
        training = {"micro_batch_size": 2, "global_batch_size": 4, "seed": 7, "lr": 2.0e-3,
                    "lr_decay_style": "constant", "weight_decay": 0.0, "clip_grad": 1.0e9, "train_iters": ITERS,
                    "objective": "dpo", "dpo": {"beta": BETA}}
        self.cfg = write_config(tmp / "flow_dpo.yaml", mu.magihuman_yaml(
            "Flow-DPO parity: the tiny MagiHuman over clip pairs", TINY, self.weights, self.data, training,
            tmp / "run", pairs=self.data / "pairs.jsonl"))
        run_mmtrain(["fixture", "magihuman-weights", "--config", str(self.cfg), "--out", str(self.weights),
                     "--seed", "11"])
        run_mmtrain(["fixture", "magihuman-pairs", "--out", str(self.data), "--pairs", str(PAIRS), "--seed", "12",
                     "--video-grid", "2,2,3", "--audio-tokens", "5", "--text-tokens", "7", "--video-channels", "16",
                     "--audio-channels", "8", "--text-channels", "24"])
        self.runs = {}

    def train(self, name, world=1, sets=()):
        """A 3-step run saving every step: (its metrics records, its save root)."""
        if name not in self.runs:
            out, save = self.tmp / name, self.tmp / name / "ckpt"
            args = ["train", str(self.cfg), "--set", f"logging.output_dir={out}", "--set", f"training.save={save}",
                    "--set", "training.save_interval=1"]
            for item in sets:
                args += ["--set", item]
            run_mmtrain(args, world=world, timeout=600)
            self.runs[name] = (read_metrics(out), save)
        return self.runs[name]

    def policy(self):
        """A policy two steps into training, as (HF directory, model-only checkpoint of it): the HF
        layout stores linears in bf16, so both sides compute with exactly these rounded weights."""
        hf, ckpt = self.tmp / "policy_hf", self.tmp / "policy_ckpt"
        if not hf.exists():
            _, save = self.train("one_rank")
            run_mmtrain(["convert", "magihuman", "ckpt-to-hf", "--load_dir", str(save / "iter_0000002"),
                         "--save_dir", str(hf), "--model_assets_dir", str(self.weights)])
            run_mmtrain(["convert", "magihuman", "hf-to-ckpt", "--hf_dir", str(hf), "--save_dir", str(ckpt)])
        return hf, ckpt


    def reference_weights(self, quant: str) -> Path:
        """The base as the reference copy computes with it: stored as `quant`, gathered in fp32."""
        if quant == "none":
            return self.weights
        stored, back = self.tmp / f"base_{quant}", self.tmp / f"base_{quant}_fp32"
        if not back.exists():
            run_mmtrain(["convert", "magihuman", "quantize-base", "--load_dir", str(self.weights), "--save_dir",
                         str(stored), "--dtype", quant])
            run_mmtrain(["convert", "magihuman", "dequantize-base", "--load_dir", str(stored), "--save_dir", str(back),
                         "--dtype", "fp32"])
        return back


@pytest.fixture(scope="module")
def fd(tmp_path_factory):
    mmtrain_bin()
    return Setup(tmp_path_factory.mktemp("flow_dpo"))


def clips(batch):
    """Each packed clip of a collated batch as a batch of its own (the reference's input)."""
    cu = batch["cu_seqlens"].long().tolist()
    out = []
    for begin, end in zip(cu[:-1], cu[1:]):
        one = {k: batch[k][begin:end] for k in ("x", "coords_mapping", "modality_mapping", "target_velocity",
                                                "loss_mask")}
        one["cu_seqlens"] = torch.tensor([0, end - begin], dtype=torch.int32)
        out.append(one)
    return out


def clip_errors(params, batch, weights):
    """e per clip [2P]: Σ_k w_k · mean of (pred - target)² over its supervised term-k elements."""
    errors = []
    for clip in clips(batch):
        pred = R.forward(params, clip, "fp32", TINY)
        diff = (pred - clip["target_velocity"]) ** 2
        modality, mask = clip["modality_mapping"].long(), clip["loss_mask"].bool()
        e = pred.new_zeros(())
        for w, m, width in zip(weights, (R.VIDEO, R.AUDIO), (TINY["video_in_channels"], TINY["audio_in_channels"])):
            rows = (modality == m) & mask
            if rows.any():
                e = e + w * diff[rows][:, :width].mean()
        errors.append(e)
    return torch.stack(errors)


def test_the_two_clips_of_a_pair_share_timestep_and_noise(fd):
    out = fd.tmp / "batch.safetensors"
    run_mmtrain(["debug", "collate", str(fd.cfg), "--out", str(out)])
    batch = load_file(str(out))
    pairs = int(batch["preference_pairs"])
    parts = clips(batch)
    assert pairs == 2 and len(parts) == 2 * pairs
    sigmas = []
    for b in range(pairs):
        w, l = parts[b], parts[pairs + b]
        audio = w["modality_mapping"] == R.AUDIO
        assert torch.equal(audio, l["modality_mapping"] == R.AUDIO)
        ca = TINY["audio_in_channels"]
        # x_t = (1 - σ) x0 + σ ε and v = ε - x0: with one σ and one ε, x_w - x_l = -(1 - σ)(v_w - v_l).
        dx = w["x"][audio, :ca] - l["x"][audio, :ca]
        dv = w["target_velocity"][audio, :ca] - l["target_velocity"][audio, :ca]
        keep = -(dx * dv).sum() / (dv * dv).sum()
        assert rel_l2(dx, -keep * dv) < 1e-5, f"pair {b}: the clips were noised differently"
        sigmas.append(1 - keep.item())
        assert 0 < sigmas[-1] < 1
    assert abs(sigmas[0] - sigmas[1]) > 1e-6, "two pairs drew one timestep: the draw is not per pair"


@pytest.mark.parametrize("term_weights,reference_quant", [(None, "none"), ((1.0, 0.25), "none"), (None, "int8"),
                                                          (None, "nf4")])
def test_loss_metrics_and_gradients_equal_the_formula(fd, term_weights, reference_quant):
    """reference_quant: the reference copy's Linears stored quantized; the formula's reference is then
    the base through `convert quantize-base` and back (`dequantize-base`, fp32)."""
    policy_hf, policy_ckpt = fd.policy()
    batch_path = fd.tmp / "batch.safetensors"
    if not batch_path.exists():
        run_mmtrain(["debug", "collate", str(fd.cfg), "--out", str(batch_path)])
    out = fd.tmp / f"step_{term_weights}_{reference_quant}.safetensors"
    sets = ["--set", f"training.load={policy_ckpt}", "--set", f"training.dpo.reference_quant={reference_quant}"]
    if term_weights:
        sets += ["--set", f"training.dpo.term_weights=[{term_weights[0]}, {term_weights[1]}]"]
    run_mmtrain(["debug", "step", str(fd.cfg), "--batch", str(batch_path), "--out", str(out), *sets])
    got = load_file(str(out))

    torch.set_num_threads(1)
    batch = load_file(str(batch_path))
    weights = term_weights or (1.0, 1.0)
    pairs = int(batch["preference_pairs"])
    leaves = R.trainable_leaves(R.load_hf(policy_hf))
    with torch.no_grad():
        e_ref = clip_errors(R.load_hf(fd.reference_weights(reference_quant)), batch, weights)
    e = clip_errors(leaves, batch, weights)
    chosen, rejected = e[:pairs], e[pairs:]
    inside = -BETA / 2 * ((chosen - e_ref[:pairs]) - (rejected - e_ref[pairs:]))
    loss = -torch.nn.functional.logsigmoid(inside).mean()
    loss.backward()

    assert rel_l2(got["loss"].reshape(1), loss.detach().reshape(1)) < FP32_RTOL, (got["loss"], loss)
    assert abs(loss.item() - math.log(2)) > 1e-3, "the policy equals the reference: the check would be vacuous"
    reward_w = BETA / 2 * (e_ref[:pairs] - chosen.detach())
    reward_l = BETA / 2 * (e_ref[pairs:] - rejected.detach())
    want = {"rewards/chosen": reward_w.mean(), "rewards/rejected": reward_l.mean(),
            "rewards/accuracies": (reward_w > reward_l).float().mean(), "rewards/margins": (reward_w - reward_l).mean(),
            "mse/chosen": chosen.detach().mean(), "mse/rejected": rejected.detach().mean()}
    for name, value in want.items():
        assert abs(got[f"metric.{name}"].item() - value.item()) <= FP32_RTOL * max(1.0, abs(value.item())), name
    bad = []
    for name, leaf in leaves.items():
        if leaf.requires_grad:
            if rel_l2(got[f"grad.{name}"], leaf.grad) >= FP32_RTOL:
                bad.append((name, rel_l2(got[f"grad.{name}"], leaf.grad)))
    assert not bad, bad
    assert sum(1 for leaf in leaves.values() if leaf.requires_grad) == sum(1 for k in got if k.startswith("grad."))


@pytest.mark.parametrize("name,world,sets", [
    ("fsdp2", 2, ()),
    ("ulysses2", 2, ("parallel.ulysses_parallel_size=2",)),
    ("ring2", 2, ("parallel.ring_attention_size=2",)),
    ("hsdp_replicas", 2, ("parallel.fully_shard_parallel_size=1",)),
    ("recompute_cpu_offload", 2, ("features.recompute=true",
                                  'features.recompute_plan.apply_modules=["dit.block.layers.{*}"]',
                                  "parallel.fsdp_plan.cpu_offload=true")),
    # The offload trio together: activations to host, the shards in host memory, the moments on disk.
    ("offload_trio", 2, ("features.enable_activation_offload=true",
                         'features.activation_offload_plan.apply_modules=["dit.block.layers.{*}"]',
                         "parallel.fsdp_plan.cpu_offload=true", "training.optimizer=adamw_swap",
                         "training.offload_dir={tmp}/offload")),
    # Token budgets: a pair is 48 tokens, so 60 holds one pair a micro-batch and 100 two; the loss is
    # normalized over the step's pairs, so any grouping trains as micro-batches of 2 pairs do.
    ("budget_one_pair", 1, ("data.dataloader_param.micro_batch_tokens=60", "training.micro_batch_size=1")),
    ("budget_2ranks", 2, ("data.dataloader_param.micro_batch_tokens=100", "training.micro_batch_size=1")),
])
def test_every_layout_equals_one_rank_of_fixed_micro_batches(fd, name, world, sets):
    one, one_save = fd.train("one_rank")
    (fd.tmp / "offload").mkdir(exist_ok=True)
    many, many_save = fd.train(name, world=world, sets=[item.replace("{tmp}", str(fd.tmp)) for item in sets])
    assert len(one) == len(many) == ITERS
    for a, b in zip(one, many):
        for key in ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "mse/chosen", "mse/rejected"):
            assert abs(a[key] - b[key]) <= RANKS_RTOL * max(1.0, abs(a[key])), (name, a["iteration"], key, a[key], b[key])
        assert a["rewards/accuracies"] == b["rewards/accuracies"]
    first, final = mu.checkpoint_tensors(one_save / "iter_0000001"), f"iter_{ITERS:07d}"
    want, got = mu.checkpoint_tensors(one_save / final), mu.checkpoint_tensors(many_save / final)
    assert sorted(want) == sorted(got)
    floats = [k for k in want if want[k].is_floating_point() and want[k].numel() > 0]
    moved = max(rel_l2(want[k], first[k]) for k in floats)
    assert moved > 1e-4, "training did not move the state: the comparison would be vacuous"
    worst = max((rel_l2(got[k], want[k]), k) for k in floats)
    assert worst[0] < RANKS_RTOL, worst
