"""The quantized frozen-base formats against their references (docs/qlora.md), on a tiny HF Magistral
saved by transformers (fp32, GQA, Pixtral; the vision tower's 32-wide Linears are not multiples of a
block) and its bf16 copy:

  1. `convert mistral3 quantize-base --dtype nf4` writes, for every Linear weight transformers'
     bitsandbytes integration quantizes, exactly bitsandbytes.functional.quantize_4bit's packed codes,
     absmax codes, nested absmax, quant maps and quant_state (byte for byte); int8 exactly
     int8_vectorwise_quant of the fp16 weight (codes and SCB); fp8_e4m3 exactly torch's cast at the
     documented row scale; `dequantize-base` gives bitsandbytes' dequantization (its flat-block
     reference; its AVX-512 CPU kernel agrees wherever a row is whole blocks, and indexes absmax per
     row where it is not: see docs/qlora.md), int8_vectorwise_dequant, and fp32(q) * scale;
  2. transformers + bitsandbytes save the same model quantized byte for byte as mmtrain writes it,
     and load mmtrain's directory as Linear4bit modules;
  3. training reads a quantized base as the dequantized one: a LoRA run over the nf4 directory has
     bitwise the losses of one over its dequantize-base copy;
  4. a hostile quantized checkpoint is refused by name.
"""
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

bnb = pytest.importorskip("bitsandbytes")
import bitsandbytes.functional as F  # noqa: E402
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute  # noqa: E402

from test_lora_peft import hf_model, run_mmtrain, write_config, yaml  # noqa: E402

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # bitsandbytes' reference would compile for every shape


def tensors(directory):
    out = {}
    for f in sorted(Path(directory).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def quantize_base(src, out, dtype):
    run_mmtrain(["convert", "mistral3", "quantize-base", "--dtype", dtype, "--load_dir", str(src), "--save_dir", str(out)])


def dequantize_base(src, out, *extra, check=True):
    return run_mmtrain(["convert", "mistral3", "dequantize-base", "--load_dir", str(src), "--save_dir", str(out), *extra],
                       check=check)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quantize_base")
    model = hf_model()
    model.save_pretrained(tmp / "fp32", safe_serialization=True)
    model.to(torch.bfloat16).save_pretrained(tmp / "bf16", safe_serialization=True)
    for base in ("fp32", "bf16"):
        for dtype in ("nf4", "int8", "fp8_e4m3"):
            quantize_base(tmp / base, tmp / f"{base}_{dtype}", dtype)
            dequantize_base(tmp / f"{base}_{dtype}", tmp / f"{base}_{dtype}_back", "--dtype", "fp32")
    return tmp


@pytest.mark.parametrize("base", ["fp32", "bf16"])
def test_nf4_is_bitsandbytes_bitwise(bases, base):
    src, q, back = tensors(bases / base), tensors(bases / f"{base}_nf4"), tensors(bases / f"{base}_nf4_back")
    quantized = [k for k in src if k + ".quant_state.bitsandbytes__nf4" in q]
    assert len(quantized) == 24  # every Linear but lm_head: 2 text layers, the vision layer, the projector
    whole_blocks = 0
    for key in quantized:
        w = src[key]
        packed, state = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
        assert torch.equal(q[key], packed), key
        assert torch.equal(q[key + ".absmax"], state.absmax), key
        assert torch.equal(q[key + ".nested_absmax"], state.state2.absmax), key
        assert torch.equal(q[key + ".quant_map"], state.code) and torch.equal(q[key + ".nested_quant_map"], state.state2.code)
        ours = q[key + ".quant_state.bitsandbytes__nf4"]
        theirs = state.as_dict(packed=True)["quant_state.bitsandbytes__nf4"]
        assert bytes(ours.tolist()) == bytes(theirs.tolist()), key
        absmax = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
        reference = _dequantize_4bit_compute(packed.view(-1), absmax, state.code, 64, list(w.shape), w.dtype)
        assert torch.equal(back[key].to(w.dtype), reference), key
        if w.shape[-1] % 64 == 0:  # bitsandbytes' own CPU kernel indexes absmax per row: right for whole-block rows
            whole_blocks += 1
            assert torch.equal(back[key].to(w.dtype), F.dequantize_4bit(packed, state)), key
    assert whole_blocks == 17


@pytest.mark.parametrize("base", ["fp32", "bf16"])
def test_int8_and_fp8_are_their_references_bitwise(bases, base):
    src = tensors(bases / base)
    int8, int8_back = tensors(bases / f"{base}_int8"), tensors(bases / f"{base}_int8_back")
    fp8, fp8_back = tensors(bases / f"{base}_fp8_e4m3"), tensors(bases / f"{base}_fp8_e4m3_back")
    checked = 0
    for key, w in src.items():
        module = key[: -len("weight")]
        if module + "SCB" not in int8:
            continue
        checked += 1
        codes, scb, _ = F.int8_vectorwise_quant(w.to(torch.float16))
        assert torch.equal(int8[key], codes) and torch.equal(int8[module + "SCB"], scb), key
        assert int8[module + "weight_format"].item() == 0
        assert torch.equal(int8_back[key], F.int8_vectorwise_dequant(codes, scb)), key
        scale = w.float().abs().amax(1) / 448.0
        q = (w.float() / scale[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
        assert torch.equal(fp8[key].view(torch.uint8), q.view(torch.uint8)), key
        assert torch.equal(fp8[module + "scale_weight"], scale), key
        assert torch.equal(fp8_back[key], q.float() * scale[:, None]), key
    assert checked == 24


def test_transformers_and_bitsandbytes_write_the_same_directory(bases):
    from transformers import AutoModelForImageTextToText, BitsAndBytesConfig
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=torch.bfloat16)
    theirs = AutoModelForImageTextToText.from_pretrained(bases / "bf16", device_map="cpu", quantization_config=config)
    theirs.save_pretrained(bases / "hf_bnb")
    ours, saved = tensors(bases / "bf16_nf4"), tensors(bases / "hf_bnb")
    assert set(ours) == set(saved)
    for key in ours:
        assert ours[key].dtype == saved[key].dtype and torch.equal(ours[key].view(-1).view(torch.uint8),
                                                                   saved[key].view(-1).view(torch.uint8)), key
    # mmtrain reads transformers' directory, and transformers loads mmtrain's as Linear4bit.
    dequantize_base(bases / "hf_bnb", bases / "hf_bnb_back")
    back, mine = tensors(bases / "hf_bnb_back"), tensors(bases / "bf16_nf4_back")
    assert all(torch.equal(back[k], mine[k].to(back[k].dtype)) for k in back)
    loaded = AutoModelForImageTextToText.from_pretrained(bases / "bf16_nf4", device_map="cpu")
    assert sum(isinstance(m, bnb.nn.Linear4bit) for m in loaded.modules()) == 24


def magistral_run(run, base, data, base_quant="none", world=1, sets=()):
    """Two LoRA steps over `base`; the records and the saved adapters."""
    run.mkdir()
    text = yaml(run, base, data, f", save: {run / 'ckpt'}").replace(
        "modules_to_save: [model.multi_modal_projector]}",
        f"modules_to_save: [model.multi_modal_projector], base_quant: {base_quant}}}")
    config = write_config(run / "train.yaml", text)
    proc = run_mmtrain(["train", str(config), *[arg for s in sets for arg in ("--set", s)]], world=world)
    (run / "stdout.txt").write_text(proc.stdout)
    records = [json.loads(line) for line in (run / "run" / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    saved = {f.name: f.read_bytes() for f in sorted((run / "ckpt" / "iter_0000002").glob("*.safetensors"))}
    return [(r["loss"], r["grad_norm"]) for r in records], saved


@pytest.fixture(scope="module")
def data(bases):
    run_mmtrain(["fixture", "mistral3", "--out", str(bases / "data"), "--samples", "8", "--seed", "3", "--mix"])
    return bases / "data"


def test_training_reads_the_quantized_base_as_its_dequantization(bases, data, tmp_path):
    quantized = magistral_run(tmp_path / "nf4", bases / "fp32_nf4", data)
    dequantized = magistral_run(tmp_path / "dequantized", bases / "fp32_nf4_back", data)
    assert len(quantized[0]) == 2 and quantized == dequantized
    # modules_to_save trains the projector, which the nf4 directory holds only as codes: the log says so.
    note = "stores 3 trained weights quantized ('model.multi_modal_projector.patch_merger.merging_layer.weight', ...)"
    assert note in (tmp_path / "nf4" / "stdout.txt").read_text()
    assert "trained weights quantized" not in (tmp_path / "dequantized" / "stdout.txt").read_text()


@pytest.mark.parametrize("world,sets", [(1, ()), (2, ()), (2, ("parallel.ulysses_parallel_size=2",))],
                         ids=["1rank", "2ranks", "ulysses2"])
def test_a_qlora_step_is_the_lora_step_on_the_dequantized_base(bases, data, tmp_path, world, sets):
    """FSDP holds the nf4 base as rows of codes and block scales, gathers the bytes and dequantizes each
    unit: losses, grad norms and the saved adapters are bitwise those of LoRA over the dequantized base."""
    qlora = magistral_run(tmp_path / "qlora", bases / "fp32_nf4", data, "nf4", world, sets)
    lora = magistral_run(tmp_path / "lora", bases / "fp32_nf4_back", data, "none", world, sets)
    assert len(qlora[0]) == 2 and qlora == lora


def test_a_qlora_step_over_a_bf16_base_is_the_lora_step_on_its_dequantization(bases, data, tmp_path):
    """The nf4 weights round to bf16 (their public dtype) before the fp32 compute, as the dequantized base."""
    qlora = magistral_run(tmp_path / "qlora", bases / "bf16_nf4", data, "nf4")
    lora = magistral_run(tmp_path / "lora", bases / "bf16_nf4_back", data)
    assert len(qlora[0]) == 2 and qlora == lora


@pytest.mark.parametrize("dtype", ["int8", "fp8_e4m3"])
def test_the_8bit_bases_train_as_their_dequantization(bases, data, tmp_path, dtype):
    qlora = magistral_run(tmp_path / "qlora", bases / f"fp32_{dtype}", data, dtype)
    lora = magistral_run(tmp_path / "lora", bases / f"fp32_{dtype}_back", data)
    assert len(qlora[0]) == 2 and qlora == lora


def test_hostile_quantized_checkpoints_are_refused_by_name(bases, tmp_path):
    good = tensors(bases / "bf16_nf4")
    key = next(k for k in good if k.endswith("q_proj.weight") and "language_model" in k)
    config = (bases / "bf16_nf4" / "config.json").read_text()

    def refused(name, edit, message):
        broken = dict(good)
        edit(broken)
        directory = tmp_path / name
        directory.mkdir()
        save_file(broken, str(directory / "model.safetensors"))
        (directory / "config.json").write_text(config)
        proc = dequantize_base(directory, tmp_path / f"{name}_out", check=False)
        assert proc.returncode != 0 and message in proc.stderr, (name, proc.stderr[-1500:])
        assert not (tmp_path / f"{name}_out" / "model.safetensors").exists()

    def state(broken, **changes):
        text = json.loads(bytes(good[key + ".quant_state.bitsandbytes__nf4"].tolist()))
        text.update(changes)
        broken[key + ".quant_state.bitsandbytes__nf4"] = torch.tensor(list(json.dumps(text).encode()), dtype=torch.uint8)

    refused("blocks", lambda b: b.update({key + ".absmax": good[key + ".absmax"][:-1].clone()}), "'absmax' must be")
    refused("shape", lambda b: state(b, shape=[64, 128]), "'weight' must be")
    refused("nan", lambda b: b.update({key + ".nested_absmax": torch.full_like(good[key + ".nested_absmax"], float("nan"))}),
            "hold NaN or Inf")
    refused("fp4", lambda b: state(b, quant_type="fp4"), "quant_type \"fp4\" is not supported")
    refused("blocksize", lambda b: state(b, blocksize=128), "mmtrain reads blocks of 64")
    refused("map", lambda b: b.update({key + ".quant_map": good[key + ".quant_map"].flip(0).contiguous()}),
            "not the 16 NF4 levels")
    # bitsandbytes' tiled int8 layouts (weight_format 1: col32) would be read as rows in silence.
    int8 = tensors(bases / "bf16_int8")
    module = key[: -len("weight")]
    tiled = tmp_path / "tiled"
    tiled.mkdir()
    save_file({**int8, module + "weight_format": torch.tensor(1, dtype=torch.uint8)}, str(tiled / "model.safetensors"))
    (tiled / "config.json").write_text((bases / "bf16_int8" / "config.json").read_text())
    proc = dequantize_base(tiled, tmp_path / "tiled_out", check=False)
    assert proc.returncode != 0 and "int8 weight_format 1 is not 0" in proc.stderr, proc.stderr[-1500:]


def test_peft_on_the_bitsandbytes_model_equals_mmtrain_qlora(tmp_path, parity_report):
    """mmtrain trains QLoRA (nf4) for two steps over a base it quantized, exports the adapters with
    lora-to-peft; transformers loads the same directory as a bitsandbytes 4-bit model (Linear4bit,
    fp32 compute), peft puts the export on it, and one more step's loss, logits and every adapter
    grad agree with `mmtrain debug step` on the checkpoint within 1e-5. Every Linear's rows are whole
    64-blocks here (the vision tower at width 64): bitsandbytes' CPU kernel is only right there."""
    from test_lora_peft import TEXT, VISION, forward
    from test_mistral3_parity import make_batch, rel_l2
    from transformers import AutoModelForImageTextToText
    peft = pytest.importorskip("peft")
    vision = dict(VISION, hidden_size=64, intermediate_size=128)
    hf_model(TEXT, vision).save_pretrained(tmp_path / "fp32", safe_serialization=True)
    quantize_base(tmp_path / "fp32", tmp_path / "nf4", "nf4")
    data = tmp_path / "data"
    run_mmtrain(["fixture", "mistral3", "--out", str(data), "--samples", "16", "--seed", "3", "--mix"])
    text = yaml(tmp_path, tmp_path / "nf4", data, f", save: {tmp_path / 'ckpt'}").replace(
        "modules_to_save: [model.multi_modal_projector]}", "base_quant: nf4}")
    cfg = write_config(tmp_path / "train.yaml", text)
    run_mmtrain(["train", str(cfg)])
    run_mmtrain(["convert", "mistral3", "lora-to-peft", "--load_dir", str(tmp_path / "ckpt"), "--save_dir", str(tmp_path / "peft")])
    batch = make_batch()
    save_file({k: v.contiguous() for k, v in batch.items()}, str(tmp_path / "batch.safetensors"))
    step_cfg = write_config(tmp_path / "step.yaml", cfg.read_text().replace(f"save: {tmp_path / 'ckpt'}",
                                                                            f"load: {tmp_path / 'ckpt'}"))
    run_mmtrain(["debug", "step", str(step_cfg), "--batch", str(tmp_path / "batch.safetensors"), "--out",
                 str(tmp_path / "step.safetensors")])
    got = load_file(str(tmp_path / "step.safetensors"))

    base = AutoModelForImageTextToText.from_pretrained(tmp_path / "nf4", device_map="cpu")
    assert sum(isinstance(m, bnb.nn.Linear4bit) for m in base.modules()) == 24
    for sub in base.modules():
        if hasattr(sub, "config") and hasattr(sub.config, "_attn_implementation"):
            sub.config._attn_implementation = "eager"
    # Training mode: in eval mode bitsandbytes' CPU Linear4bit repacks the weight for a bf16 AVX-512 kernel
    # at the first call without grad (the vision tower's), which is not the fp32 dequantize-then-matmul.
    base.train()
    model = peft.PeftModel.from_pretrained(base, str(tmp_path / "peft"), is_trainable=True)
    adapters = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert len(adapters) == 2 * 7 * TEXT["num_hidden_layers"]
    out = forward(model, batch)
    out.loss.backward()
    worst = {"loss": rel_l2(got["loss"], out.loss.detach()), "logits": rel_l2(got["logits"], out.logits.detach())}
    for name, p in adapters.items():
        worst[name] = rel_l2(got["grad." + name.removeprefix("base_model.model.").replace(".default.", ".")], p.grad)
    top = max(worst.items(), key=lambda kv: kv[1])
    parity_report(f"mistral3 QLoRA nf4 vs bitsandbytes + peft: loss {worst['loss']:.2e}, logits {worst['logits']:.2e}, "
                  f"worst adapter grad {top[0]} {top[1]:.2e}")
    assert all(v <= 1e-5 for v in worst.values()), {k: v for k, v in worst.items() if v > 1e-5}


def test_merge_lora_and_eval_take_a_qlora_run(bases, data, tmp_path):
    """merge-lora of a QLoRA run merges into the dequantized base: its weights are those of the same LoRA
    run over the dequantized base, bitwise; `mmtrain eval` of the QLoRA checkpoint gives that run's loss."""
    merged, losses = {}, {}
    for name, base, quant in (("qlora", "fp32_nf4", "nf4"), ("lora", "fp32_nf4_back", "none")):
        magistral_run(tmp_path / name, bases / base, data, quant)
        run_mmtrain(["convert", "mistral3", "merge-lora", "--load_dir", str(tmp_path / name / "ckpt"), "--save_dir",
                     str(tmp_path / f"{name}_merged"), "--dtype", "fp32"])
        merged[name] = tensors(tmp_path / f"{name}_merged")
        text = (tmp_path / name / "train.yaml").read_text().replace("seed: 5", "seed: 5, eval_iters: 1")
        cfg = write_config(tmp_path / f"{name}_eval.yaml", text.replace("\n  dataloader_param:",
                                                                        f"\n  validation: {{dataset_type: huggingface, "
                                                                        f"preprocess_parameters: {{model_name_or_path: {data / 'tekken.json'}}}, "
                                                                        f"basic_parameters: {{template: mistral, dataset: {data / 'conversations.json'}, "
                                                                        f"cutoff_len: 512}}}}\n  dataloader_param:", 1))
        out = tmp_path / f"{name}_eval.json"
        run_mmtrain(["eval", str(cfg), "--load", str(tmp_path / name / "ckpt"), "--out", str(out)])
        losses[name] = json.loads(out.read_text())["eval_loss"]
    assert merged["qlora"].keys() == merged["lora"].keys()
    assert all(torch.equal(merged["qlora"][k], merged["lora"][k]) for k in merged["lora"])
    assert losses["qlora"] == losses["lora"]


def test_merge_lora_of_qlora_over_an_unquantized_base_merges_into_its_dequantization(bases, data, tmp_path):
    """QLoRA over the fp32 base with base_quant nf4 trains over deq(Q(W)); merge-lora writes that, as peft's
    merge onto bitsandbytes' dequantized weights: W' = deq(Q(W)) + alpha / r * B A for an adapted Linear
    (B, A from the run's lora-to-peft export), deq(Q(W)) for every other quantized weight (dequantize-base,
    bitwise bitsandbytes' dequantization in test 1). Over the nf4 directory the merge's config.json keeps no
    quantization_config, and transformers loads it as a plain model that runs."""
    from transformers import AutoModelForImageTextToText
    magistral_run(tmp_path / "run", bases / "fp32", data, "nf4")
    run_mmtrain(["convert", "mistral3", "merge-lora", "--load_dir", str(tmp_path / "run" / "ckpt"), "--save_dir",
                 str(tmp_path / "merged"), "--dtype", "fp32"])
    run_mmtrain(["convert", "mistral3", "lora-to-peft", "--load_dir", str(tmp_path / "run" / "ckpt"), "--save_dir",
                 str(tmp_path / "peft")])
    merged, dequantized, original = tensors(tmp_path / "merged"), tensors(bases / "fp32_nf4_back"), tensors(bases / "fp32")
    adapters = load_file(str(tmp_path / "peft" / "adapter_model.safetensors"))
    quantized = {k for k in tensors(bases / "fp32_nf4") if k.endswith(".absmax")}
    adapted = frozen = 0
    for key in merged:
        # The base keeps transformers' legacy names (language_model.model.X); peft names the module model.language_model.X.
        module = key.removesuffix(".weight").replace("language_model.model.", "model.language_model.", 1)
        a = adapters.get(f"base_model.model.{module}.lora_A.weight")
        if a is not None:
            b = adapters[f"base_model.model.{module}.lora_B.weight"]
            expected = dequantized[key] + (b @ a) * (8 / 4)
            assert torch.allclose(merged[key], expected, rtol=0, atol=1e-6), key
            assert not torch.allclose(merged[key], original[key] + (b @ a) * (8 / 4), rtol=0, atol=1e-6), key
            adapted += 1
        elif key + ".absmax" in quantized and "multi_modal_projector" not in key:  # frozen, quantized, not adapted
            assert torch.equal(merged[key], dequantized[key]), key
            assert not torch.equal(merged[key], original[key]), key
            frozen += 1
    assert adapted >= 7 and frozen >= 4  # the language model's adapted Linears; the vision tower's frozen ones

    magistral_run(tmp_path / "over_nf4", bases / "fp32_nf4", data, "nf4")
    run_mmtrain(["convert", "mistral3", "merge-lora", "--load_dir", str(tmp_path / "over_nf4" / "ckpt"), "--save_dir",
                 str(tmp_path / "merged_nf4"), "--dtype", "fp32"])
    assert "quantization_config" not in json.loads((tmp_path / "merged_nf4" / "config.json").read_text())
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "merged_nf4", device_map="cpu")
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    logits = model(input_ids=torch.tensor([[1, 5, 9, 13]])).logits
    assert torch.isfinite(logits).all()


def test_hostile_8bit_codes_are_refused_by_name(bases, tmp_path):
    """The codes, not only the scales: fp8 NaN codes and an int8 row whose scale dequantizes beyond fp16
    are refused where the base is read (dequantize-base here; training reads the same way)."""
    for dtype, name, edit, message in (
            ("fp8_e4m3", "nan_code", lambda t, k: t[k].view(torch.uint8).view(-1).__setitem__(3, 0x7F),
             "codes hold NaN (0x7F / 0xFF), the first at element 3"),
            ("int8", "overflow", lambda t, k: t[k.removesuffix("weight") + "SCB"].__setitem__(0, 3.0e38),
             "row 0 dequantizes to")):
        good = tensors(bases / f"bf16_{dtype}")
        key = next(k for k in good if k.endswith("q_proj.weight") and "language_model" in k)
        broken = {k: v.clone() for k, v in good.items()}
        edit(broken, key)
        directory = tmp_path / name
        directory.mkdir()
        save_file(broken, str(directory / "model.safetensors"))
        (directory / "config.json").write_text((bases / f"bf16_{dtype}" / "config.json").read_text())
        proc = dequantize_base(directory, tmp_path / f"{name}_out", "--dtype", "fp16", check=False)
        assert proc.returncode != 0 and message in proc.stderr, (name, proc.stderr[-1500:])
        assert not (tmp_path / f"{name}_out").exists()


def test_the_base_files_follow_one_rule(bases, tmp_path):
    """quantize-base and dequantize-base copy a base's other files as merge-lora does: no link out of the
    base's tree (a README.md -> ../secret is named and skipped), no weight file in another format, and
    the formats' quantization_config (int8: bitsandbytes' load_in_8bit, so transformers never reads codes
    as weights)."""
    base = tmp_path / "base"
    base.mkdir()
    for f in (bases / "fp32").iterdir():
        (base / f.name).write_bytes(f.read_bytes())
    (tmp_path / "secret").write_text("password")
    os.symlink(tmp_path / "secret", base / "README.md")
    torch.save({"x": torch.zeros(1)}, base / "pytorch_model.bin")
    proc = run_mmtrain(["convert", "mistral3", "quantize-base", "--dtype", "int8", "--load_dir", str(base), "--save_dir",
                        str(tmp_path / "int8")])
    assert "README.md links outside the base's tree" in proc.stdout
    names = sorted(p.name for p in (tmp_path / "int8").iterdir())
    assert "README.md" not in names and "pytorch_model.bin" not in names and "config.json" in names
    config = json.loads((tmp_path / "int8" / "config.json").read_text())["quantization_config"]
    assert config["load_in_8bit"] is True and config["quant_method"] == "bitsandbytes"
    dequantize_base(tmp_path / "int8", tmp_path / "back")
    assert "quantization_config" not in json.loads((tmp_path / "back" / "config.json").read_text())
    assert "README.md" not in [p.name for p in (tmp_path / "back").iterdir()]
