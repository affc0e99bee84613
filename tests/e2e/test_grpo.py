"""GRPO end to end (docs/grpo.md) on examples/magistral/magistral_grpo_tiny.yaml: the mean reward of
the example's task rises (a flipped advantage sign leaves it at its start: measured in docs/grpo.md),
the rollouts are `mmtrain sample mistral3`'s completions for the same seeds and 2 ranks' equal 1's,
a resume continues bitwise, user rewards (a Python function and a command) score what they are
given, and every bad reward, prompt or setting stops the run by name, never hanging a rank. (The
loss against TRL: tests/parity/test_grpo_trl.py.)"""
import json
import time
from pathlib import Path

import pytest

from conftest import run_mmtrain, write_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "magistral" / "magistral_grpo_tiny.yaml"

USER_REWARDS = '''
import os, time

def length(completions, **kwargs):
    return [float(len(c)) for c in completions]

def colour_named(completions, colour, **kwargs):
    return [1.0 if c2 in c else 0.0 for c, c2 in zip(completions, colour)]

def raises_on_rank_1(completions, **kwargs):
    if os.environ.get("RANK") == "1":
        raise ValueError("this reward refuses rank 1")
    return [0.0] * len(completions)

def hangs(completions, **kwargs):
    time.sleep(600)

def too_few(completions, **kwargs):
    return [0.0]

def not_finite(completions, **kwargs):
    return [float("nan")] * len(completions)
'''

COMMAND = '''
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(json.dumps({"reward": float(len(r["completion_ids"])) + (0.5 if r["fields"]["answer"] else 0.0)}))
'''


@pytest.fixture(scope="module")
def grpo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grpo")
    config = EXAMPLE.read_text().replace("runs/magistral_grpo_tiny", str(tmp))
    cfg = write_config(tmp / "grpo.yaml", config)
    run_mmtrain(["fixture", "mistral3-weights", "--config", str(cfg), "--out", str(tmp / "base")])
    run_mmtrain(["fixture", "mistral3-prompts", "--out", str(tmp / "data"), "--prompts", "16"])
    (tmp / "rewards").mkdir()
    (tmp / "rewards" / "user_rewards.py").write_text(USER_REWARDS)
    (tmp / "rewards" / "command_reward.py").write_text(COMMAND)
    return tmp, config


def run_config(tmp: Path, config: str, name: str) -> Path:
    """A copy of the example writing its output and checkpoints to tmp/name."""
    text = config.replace(f"output_dir: {tmp}", f"output_dir: {tmp / name}")
    text = text.replace(f"save: {tmp}/checkpoints", f"save: {tmp / name}/checkpoints")
    return write_config(tmp / f"{name}.yaml", text)


def metrics(run_dir: Path) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip() and '"kind"' not in line]


def rollout(run_dir: Path, iteration: int) -> list:
    return [json.loads(line) for line in (run_dir / "rollouts" / f"iter_{iteration}.jsonl").read_text().splitlines()]


def test_the_mean_reward_rises_and_the_plot_shows_it(grpo):
    tmp, config = grpo
    cfg = run_config(tmp, config, "learn")
    run_mmtrain(["train", str(cfg)], timeout=600)
    rewards = [m["reward"] for m in metrics(tmp / "learn")]
    assert len(rewards) == 30
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    # From about 0.03 (a random model's completions that begin with a digit) to about 1.
    assert first < 0.2 and last - first >= 0.5, rewards
    m = metrics(tmp / "learn")[-1]
    for key in ["rewards/answer_match/mean", "rewards/regex_match/mean", "reward_std", "frac_reward_zero_std",
                "entropy", "clip_ratio/region_mean", "completions/mean_length", "completions/clipped_ratio",
                "rollout_tokens_per_s", "time/rollout_ms", "time/rewards_ms", "time/reference_ms"]:
        assert key in m, key
    rows = rollout(tmp / "learn", 30)
    assert len(rows) == 4 * 8 and all(set(r["rewards"]) == {"answer_match", "regex_match"} for r in rows)
    run_mmtrain(["logs", "plot", str(tmp / "learn")])
    assert any(p.suffix == ".png" and p.stat().st_size > 0 for p in (tmp / "learn").rglob("*.png"))


def test_rollouts_are_sample_mistral3s_and_two_ranks_equal_one(grpo):
    tmp, config = grpo
    # 16 new tokens: 15 batched decoder calls of a prompt's 8 completions (rl/rollout's generate_group).
    longer = ["--set", "training.train_iters=1", "--set", "training.save=", "--set", "training.grpo.max_completion_length=16"]
    one = run_config(tmp, config, "one_rank")
    run_mmtrain(["train", str(one), *longer])
    two = run_config(tmp, config, "two_ranks")
    run_mmtrain(["train", str(two), *longer, "--set", "training.micro_batch_size=2", "--set", "training.global_batch_size=4"],
                world=2)
    key = lambda r: (r["sample_index"], r["generation"])  # noqa: E731
    mine, theirs = sorted(rollout(tmp / "one_rank", 1), key=key), sorted(rollout(tmp / "two_ranks", 1), key=key)
    assert [(key(r), r["completion_ids"], r["reward"]) for r in mine] == \
           [(key(r), r["completion_ids"], r["reward"]) for r in theirs]
    assert {r["rank"] for r in theirs} == {0, 1}
    # Prompt 0's G completions: `sample mistral3` of the prompt G times from its seed (prompt i
    # samples with seed + i, completion g with the prompt's seed + g).
    group = [r for r in mine if r["sample_index"] == 0]
    record = json.loads((tmp / "data" / "prompts.jsonl").read_text().splitlines()[0])
    (tmp / "one_prompt.jsonl").write_text((json.dumps(record) + "\n") * len(group))
    run_mmtrain(["sample", "mistral3", str(one), "--load", str(tmp / "base"), "--prompts", str(tmp / "one_prompt.jsonl"),
                 "--image-dir", str(tmp / "data"), "--out", str(tmp / "sampled"), "--seed", str(group[0]["seed"]),
                 "--temperature", "1.0", "--max-new-tokens", "16", "--no-image-tokens"])
    sampled = [json.loads(line) for line in (tmp / "sampled" / "completions.jsonl").read_text().splitlines()]
    assert [s["token_ids"] for s in sampled] == [r["completion_ids"] for r in group]
    assert sum(len(r["completion_ids"]) for r in group) > 8 * 8  # most ran long: the batched calls were compared


def test_a_resume_continues_bitwise(grpo):
    tmp, config = grpo
    sets = ["--set", "training.train_iters=4", "--set", "training.grpo.num_iterations=2", "--set",
            "training.grpo.beta=0.05", "--set", "training.save_interval=2"]
    straight = run_config(tmp, config, "straight")
    run_mmtrain(["train", str(straight), *sets])
    resumed = run_config(tmp, config, "resumed")
    run_mmtrain(["train", str(resumed), *sets, "--set", "training.exit_interval=2"])
    run_mmtrain(["train", str(resumed), *sets, "--set", "training.load=auto"])
    a, b = metrics(tmp / "straight"), metrics(tmp / "resumed")
    assert [m["iteration"] for m in b] == [1, 2, 3, 4]
    for key in ["loss", "grad_norm", "reward", "kl", "entropy"]:
        assert [m[key] for m in a] == [m[key] for m in b], key
    assert rollout(tmp / "straight", 3) == rollout(tmp / "resumed", 3)


def test_user_rewards_see_the_completions_and_the_prompt_fields(grpo):
    tmp, config = grpo
    cfg = run_config(tmp, config, "user")
    run_mmtrain(["train", str(cfg), "--set", "training.train_iters=1", "--set", "training.save=",
                 "--set", 'training.grpo.reward_funcs=["user_rewards:length","user_rewards:colour_named","command"]',
                 "--set", 'training.grpo.reward_regex=', "--set", f'training.grpo.reward_python_path=["{tmp / "rewards"}"]',
                 "--set", f'training.grpo.reward_command=["python3","{tmp / "rewards" / "command_reward.py"}"]'])
    rows = rollout(tmp / "user", 1)
    for r in rows:
        assert r["rewards"]["user_rewards:length"] == len(r["completion"])
        assert r["rewards"]["command"] == len(r["completion_ids"]) + 0.5
    m = metrics(tmp / "user")[0]
    assert m["rewards/user_rewards:length/mean"] == pytest.approx(sum(len(r["completion"]) for r in rows) / len(rows))


@pytest.mark.parametrize("name,world,sets,says", [
    ("raises", 2, ['training.grpo.reward_funcs=["user_rewards:raises_on_rank_1"]', "training.micro_batch_size=2",
                   "training.global_batch_size=4"], ["user_rewards:raises_on_rank_1", "this reward refuses rank 1",
                                                      "iteration 1", "rank 1"]),
    ("hangs", 1, ['training.grpo.reward_funcs=["user_rewards:hangs"]', "training.grpo.reward_timeout_s=2"],
     ["user_rewards:hangs", "did not finish within training.grpo.reward_timeout_s = 2"]),
    ("too_few", 1, ['training.grpo.reward_funcs=["user_rewards:too_few"]'], ["returned 1 rewards for 32 completions"]),
    ("not_finite", 1, ['training.grpo.reward_funcs=["user_rewards:not_finite"]'], ["non-finite rewards"]),
    ("bad_command", 1, ['training.grpo.reward_funcs=["command"]', 'training.grpo.reward_command=["sh","-c","echo 1"]'],
     ["reward command", "wrote 1 rewards for 32 completions"]),
    ("one_generation", 1, ["training.grpo.num_generations=1"], ["num_generations", "group of one"]),
    ("unknown_reward", 1, ['training.grpo.reward_funcs=["exact-match"]'], ["reward_funcs", "exact-match"]),
    ("wrong_data", 1, ["data.dataset_param.dataset_type=huggingface"], ["dataset_type must be prompts"]),
])
def test_bad_rewards_and_settings_stop_every_rank_by_name(grpo, name, world, sets, says):
    tmp, config = grpo
    cfg = run_config(tmp, config, f"bad_{name}")
    args = ["train", str(cfg), "--set", "training.train_iters=1", "--set", "training.save=",
            "--set", f'training.grpo.reward_python_path=["{tmp / "rewards"}"]']
    if any("reward_funcs" in s for s in sets):  # the example's regex_match goes
        args += ["--set", "training.grpo.reward_regex="]
    for s in sets:
        args += ["--set", s]
    began = time.monotonic()
    proc = run_mmtrain(args, world=world, check=False, timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - began < 60  # stopped, never waiting out a hung rank
    for text in says:
        assert text in proc.stderr + proc.stdout, (text, proc.stderr[-2000:])


def test_prompts_without_answers_or_over_the_cutoff_are_named(grpo, tmp_path):
    tmp, config = grpo
    run_mmtrain(["fixture", "mistral3-prompts", "--out", str(tmp_path / "data"), "--prompts", "4", "--bad-records"])
    cfg = run_config(tmp, config.replace(str(tmp / "data"), str(tmp_path / "data")), "bad_prompts")
    proc = run_mmtrain(["train", str(cfg), "--set", "training.train_iters=1", "--set", "training.save="], check=False)
    assert proc.returncode != 0
    assert "1 of 5 prompts have no field 'answer'" in proc.stderr, proc.stderr[-2000:]
    assert "no user message" in proc.stdout  # the dropped record, counted by reason
    proc = run_mmtrain(["train", str(cfg), "--set", "training.train_iters=1", "--set", "training.save=",
                        "--set", "data.dataset_param.basic_parameters.cutoff_len=20"], check=False)
    assert "prompt longer than cutoff_len" in proc.stdout + proc.stderr


def test_the_plan_prices_every_completion_and_the_extra_forwards():
    """`mmtrain plan` prices a grpo step as its prompts' G completions, prompt + completion tokens
    each (the same step time as sft on G times the samples of that length), and the old-policy and
    reference forwards once per rollout: (passes + forwards / num_iterations) / passes more."""
    def step_time(*sets, seqlen):
        args = ["plan", str(EXAMPLE), "--world-size", "1", "--seqlen", str(seqlen), "--device", "h200"]
        for item in sets:
            args += ["--set", item]
        return json.loads(run_mmtrain(args).stdout.strip().splitlines()[-1])["step_time"]

    generations, completion = 8, 3  # the example's num_generations and max_completion_length
    sft = step_time("training.objective=sft", seqlen=64 + completion)
    grpo = step_time(seqlen=64)  # beta 0, num_iterations 1: no extra forward
    for key in ("gemm_ms", "attention_ms"):
        assert grpo[key] == pytest.approx(generations * sft[key], rel=1e-9), key
    both = step_time("training.grpo.beta=0.04", "training.grpo.num_iterations=2", "training.train_iters=30", seqlen=64)
    # One forward more a step (2 a rollout over 2 steps): (passes + 1) / passes, where a training
    # pass is 3 forwards' GEMMs, or between 2 and 3 under LoRA (the frozen base's weight grads skipped).
    passes = 1.0 / (both["gemm_ms"] / grpo["gemm_ms"] - 1.0)
    assert 2.0 <= passes <= 3.0, passes
    assert both["attention_ms"] / grpo["attention_ms"] == pytest.approx(4.5 / 3.5, rel=1e-9)
