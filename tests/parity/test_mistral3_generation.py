"""`mmtrain sample mistral3` against HF transformers' generate() on the same tiny weights and prompts,
images included: greedy tokens equal, every step's logits within 1e-5 (fp32); the key/value cache
path equal to recomputing the whole prefix; sampling reproducible from its seed; 1 rank equal to
2 ranks; the refused prompt files."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
import mmtrain_util as mu  # noqa: E402
_e2e = mu.e2e_helpers()
run_mmtrain = _e2e.run_mmtrain

NEW_TOKENS = 6
LOGITS_TOLERANCE = 1e-5


def tiny_config(data: Path, run: Path, micro=1):
    text = (REPO / "examples" / "magistral" / "magistral_tiny.yaml").read_text()
    text = text.replace("runs/magistral_tiny/data", str(data)).replace("runs/magistral_tiny", str(run))
    return text.replace("micro_batch_size: 4", f"micro_batch_size: {micro}")


ATTENTION_SCALES = {"q_proj": 20.0, "k_proj": 20.0, "v_proj": 25.0, "o_proj": 25.0, "lm_head": 10.0}


def sharpen_attention(weights: Path):
    """The fixture's N(0, 0.02) weights give near-uniform attention whose output is lost in the
    residual stream: positions and the cache would not show in the logits (a decode at the wrong
    position moved them by 6e-8). Larger attention projections (and logits) make them count."""
    for shard in weights.glob("*.safetensors"):
        tensors = load_file(str(shard))
        for name in tensors:
            for projection, scale in ATTENTION_SCALES.items():
                if ("language_model" in name or name.startswith("lm_head")) and name.endswith(f"{projection}.weight"):
                    tensors[name] = (tensors[name].float() * scale).to(tensors[name].dtype)
        save_file(tensors, str(shard), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("generation")
    run_mmtrain(["fixture", "mistral3", "--out", str(tmp / "data"), "--samples", "16", "--seed", "4"])
    config = tmp / "tiny.yaml"
    config.write_text(tiny_config(tmp / "data", tmp / "run"))
    run_mmtrain(["fixture", "mistral3-weights", "--config", str(config), "--out", str(tmp / "weights"), "--seed", "2"])
    sharpen_attention(tmp / "weights")
    records = json.loads((tmp / "data" / "conversations.json").read_text())
    two = next(r for r in records if r["conversations"][0]["value"].count("<image>") == 2)
    one = next(r for r in records if r["conversations"][0]["value"].count("<image>") == 1)
    prompts = [two, one, one]  # the answer is dropped; the third repeats the second (3 prompts on 2 ranks)
    (tmp / "data" / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prompts))
    # The prompts' pixels, through the training pipeline itself (`debug collate` of the same records).
    (tmp / "data" / "as_training.json").write_text(json.dumps(prompts))
    collate_config = tmp / "collate.yaml"
    collate_config.write_text(tiny_config(tmp / "data", tmp / "run", micro=len(prompts)).replace(
        f"{tmp / 'data'}/conversations.json", f"{tmp / 'data'}/as_training.json"))
    run_mmtrain(["debug", "collate", str(collate_config), "--out", str(tmp / "batch.safetensors")])
    return tmp, config, prompts, load_file(str(tmp / "batch.safetensors"))


def sample(gen, out, *extra, world=1, check=True):
    tmp, config = gen[0], gen[1]
    return run_mmtrain(["sample", "mistral3", str(config), "--load", str(tmp / "weights"), "--prompts",
                        str(tmp / "data" / "prompts.jsonl"), "--out", str(out), "--max-new-tokens", str(NEW_TOKENS),
                        *extra], world=world, check=check)


def completions(out):
    return [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]


def pixels_of(batch, prompts, index):
    counts = [r["conversations"][0]["value"].count("<image>") for r in prompts]
    begin = sum(counts[:index])
    return batch["pixel_values"][begin:begin + counts[index]], batch["image_sizes"][begin:begin + counts[index]]


def test_greedy_tokens_and_logits_equal_hf_generate(gen, tmp_path):
    from transformers import Mistral3ForConditionalGeneration

    tmp, _, prompts, batch = gen
    sample(gen, tmp_path / "out", "--save-logits")
    model = Mistral3ForConditionalGeneration.from_pretrained(tmp / "weights", dtype=torch.float32).eval()
    for c in completions(tmp_path / "out"):
        i = c["index"]
        pixel_values, image_sizes = pixels_of(batch, prompts, i)
        input_ids = torch.tensor([c["prompt_ids"]])
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, pixel_values=pixel_values, image_sizes=image_sizes,
                                 max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
        hf_tokens = out.sequences[0, input_ids.shape[1]:].tolist()
        assert c["token_ids"] == hf_tokens, (i, c["token_ids"], hf_tokens)
        ours = load_file(str(tmp_path / "out" / f"logits_{i:04d}.safetensors"))["logits"]
        theirs = torch.stack([step[0] for step in out.logits])
        assert ours.shape == theirs.shape
        assert (ours - theirs).abs().max() <= LOGITS_TOLERANCE * max(1.0, theirs.abs().max().item())
        assert c["prompt"] == prompts[i]["conversations"][0]["value"]
        assert isinstance(c["completion"], str)


def test_the_cache_equals_recomputing_the_prefix(gen, tmp_path):
    sample(gen, tmp_path / "cache", "--save-logits")
    sample(gen, tmp_path / "whole", "--save-logits", "--no-kv-cache")
    for a, b in zip(completions(tmp_path / "cache"), completions(tmp_path / "whole")):
        assert a["token_ids"] == b["token_ids"]
        name = f"logits_{a['index']:04d}.safetensors"
        la, lb = (load_file(str(tmp_path / d / name))["logits"] for d in ("cache", "whole"))
        assert (la - lb).abs().max() <= LOGITS_TOLERANCE


def test_sampling_follows_its_seed_and_ranks_do_not_change_it(gen, tmp_path):
    flags = ["--temperature", "1.0", "--top-p", "0.9", "--seed", "7"]
    sample(gen, tmp_path / "a", *flags)
    sample(gen, tmp_path / "b", *flags, world=2)
    sample(gen, tmp_path / "c", "--temperature", "1.0", "--top-p", "0.9", "--seed", "8")
    a, b, c = (completions(tmp_path / d) for d in "abc")
    assert [x["token_ids"] for x in a] == [x["token_ids"] for x in b]
    assert [x["token_ids"] for x in a] != [x["token_ids"] for x in c]
    # prompts 1 and 2 are the same record with seeds 8 and 9: sampled, they differ
    assert a[1]["prompt_ids"] == a[2]["prompt_ids"] and a[1]["token_ids"] != a[2]["token_ids"]


def test_bad_prompt_files_are_refused_by_name(gen, tmp_path):
    tmp = gen[0]
    bad = tmp / "data" / "bad.jsonl"
    cases = [
        ("", "empty file"),
        ('{"conversations": [{"from": "gpt", "value": "only an answer"}]}\n', "no user message"),
        ('{"conversations": [{"from": "human", "value": "<image> what?"}], "image": "missing.png"}\n', "missing"),
        ('{"conversations": [{"from": "human", "value": "<image> what?"}]}\n', "<image> count"),
        ("not json\n", "line 1: not valid JSON"),
    ]
    # A PNG whose header reads but whose pixels do not: the prompt fails by name, never swapped for the next.
    png = sorted((tmp / "data" / "images").glob("*.png"))[0]
    (tmp / "data" / "images" / "truncated.png").write_bytes(png.read_bytes()[:60])
    cases.append(('{"conversations": [{"from": "human", "value": "<image> what?"}], "image": "images/truncated.png"}\n'
                  '{"conversations": [{"from": "human", "value": "and this?"}]}\n', "prompt 0: "))
    for text, message in cases:
        bad.write_text(text)
        out = tmp_path / "out"
        proc = run_mmtrain(["sample", "mistral3", str(gen[1]), "--load", str(tmp / "weights"), "--prompts", str(bad),
                            "--out", str(out)], check=False)
        assert proc.returncode != 0 and message in proc.stderr, (text, proc.stderr[-1500:])
        assert not out.exists()
    proc = sample(gen, tmp_path / "t", "--temperature", "-1", check=False)
    assert proc.returncode != 0 and "--temperature must be >= 0" in proc.stderr
    proc = sample(gen, tmp_path / "cp", "--set", "parallel.ulysses_parallel_size=2", world=2, check=False)
    assert proc.returncode != 0 and "runs without context parallelism" in proc.stderr, proc.stderr[-1500:]
    assert not (tmp_path / "cp").exists()
