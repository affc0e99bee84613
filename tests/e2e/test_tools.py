"""The analysis commands through the binary: `flops magihuman` reproduces the seed's figures (from
the full config, and from an HF directory's headers), `flops mistral3` the spec's (magistral.md
§9), `plan` agrees with what the trainer
allocates, `logs compare` compares two real runs (and a run's console with its metrics.jsonl)."""
import json
import re

import pytest

import torch
from safetensors.torch import save_file

from conftest import REPO, read_metrics, run_mmtrain, tiny_config, write_config

FULL = REPO / "examples" / "magihuman" / "magihuman_config_t2av.yaml"
SEED_ARGS = ["--seqlens", "4606", "--gbs", "8", "--device_num", "8", "--step_time", "4.6348",
             "--hardware_flops", "2.8e14"]


def last_json(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_flops_full_config_reproduces_the_seed():
    proc = run_mmtrain(["flops", "magihuman", "--config", str(FULL), *SEED_ARGS])
    got = last_json(proc)
    assert got["active_linear_params"] == 10_933_616_640
    assert got["flops_per_sample"] == 332_575_591_792_640
    assert round(got["tflops_per_device"], 2) == 71.76   # seed: "71.8 TFLOP/s"
    assert round(100 * got["mfu"], 2) == 25.63
    assert "10,933,616,640 (10.934B" in proc.stdout
    assert "25.63 %" in proc.stdout
    # The coefficient only scales the attention term.
    doubled = last_json(run_mmtrain(["flops", "magihuman", "--config", str(FULL), *SEED_ARGS,
                                     "--attention-coefficient", "14"]))
    assert doubled["attention_flops_per_sample"] == 2 * got["attention_flops_per_sample"]


TINY = {"num_layers": 4, "hidden_size": 64, "head_dim": 16, "num_query_groups": 2,
        "video_in_channels": 16, "audio_in_channels": 8, "text_in_channels": 24,
        "mm_layers": [0, 3], "gelu7_layers": [0]}


def tiny_hf_tensors():
    """The HF base layout (magihuman.md §4) for TINY, zeros."""
    d, hd, hq, hkv = 64, 16, 4, 2
    qkv = (hq + 2 * hkv) * hd + hq
    t = {"adapter.video_embedder.weight": [d, 16], "adapter.video_embedder.bias": [d],
         "adapter.text_embedder.weight": [d, 24], "adapter.text_embedder.bias": [d],
         "adapter.audio_embedder.weight": [d, 8], "adapter.audio_embedder.bias": [d],
         "adapter.rope.bands": [hd // 8]}
    for i in range(4):
        e = 3 if i in (0, 3) else 1
        inter = 4 * d if i == 0 else int(d * 4 * 2 / 3) // 4 * 4
        up = inter if i == 0 else 2 * inter
        p = f"block.layers.{i}."
        t.update({p + "attention.pre_norm.weight": [d * e], p + "attention.linear_qkv.weight": [qkv * e, d],
                  p + "attention.linear_proj.weight": [d * e, d], p + "attention.q_norm.weight": [hd * e],
                  p + "attention.k_norm.weight": [hd * e], p + "mlp.pre_norm.weight": [d * e],
                  p + "mlp.up_gate_proj.weight": [up * e, d], p + "mlp.down_proj.weight": [d * e, inter]})
    t.update({"final_norm_video.weight": [d], "final_norm_audio.weight": [d],
              "final_linear_video.weight": [16, d], "final_linear_audio.weight": [8, d]})
    return {name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in t.items()}


def test_flops_from_checkpoint_headers_equals_config(tmp_path):
    tensors = tiny_hf_tensors()
    names = list(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:20], "model-00002-of-00002.safetensors": names[20:]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / file))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}))
    args = ["--seqlens", "50", "70", "--gbs", "4", "--device_num", "2", "--step_time", "0.5"]
    from_ckpt = last_json(run_mmtrain(["flops", "magihuman", "--ckpt", str(tmp_path), *args]))
    sets = []
    for key, value in TINY.items():
        sets += ["--set", f"model.config.{key}={json.dumps(value)}"]
    from_config = last_json(run_mmtrain(["flops", "magihuman", "--config", str(FULL), *sets, *args]))
    assert from_ckpt == from_config
    # The rule by hand: 2-D tensors, layers 0 and 3 divided by 3.
    expected = sum(v.numel() / (3 if re.search(r"layers\.(0|3)\.", k) else 1)
                   for k, v in tensors.items() if v.dim() == 2)
    assert from_ckpt["active_linear_params"] == expected


def test_flops_needs_exactly_one_source():
    proc = run_mmtrain(["flops", "magihuman", "--seqlens", "10"], check=False)
    assert proc.returncode == 1 and "exactly one of --config CFG or --ckpt DIR" in proc.stderr


MAGISTRAL = REPO / "examples" / "magistral" / "magistral_small_2509.yaml"
MAGISTRAL_TEXT_MATMUL = 22_900_899_840  # spec §9: 40 layers x 555,745,280 + lm_head 671,088,640
MAGISTRAL_VISION_MATMUL = 403_255_296  # 24 x 16,777,216 + patch_conv 602,112


def test_flops_mistral3_reproduces_the_spec():
    """magistral.md §9, causal attention: S = 2048 unpacked is 139.4 GFLOP per token; one 504x644
    image is 1656 patches, ~1.61 TFLOP vision forward + ~29.5 GFLOP projector, x1 while frozen."""
    text = last_json(run_mmtrain(["flops", "mistral3", "--config", str(MAGISTRAL), "--seqlens", "2048"]))
    assert text["text_matmul_params"] == MAGISTRAL_TEXT_MATMUL
    assert text["text_flops_per_token"] == 6 * MAGISTRAL_TEXT_MATMUL + 3 * 4 * 40 * 4096 * 2049 / 2
    assert round(text["text_flops_per_token"] / 1e9, 1) == 139.4
    assert text["vision_flops"] == 0 and text["flops_per_sample"] == 2048 * text["text_flops_per_token"]

    args = ["flops", "mistral3", "--config", str(MAGISTRAL), "--seqlens", "2048", "--images", "504x644",
            "--gbs", "8", "--device_num", "8", "--step_time", "2.5", "--hardware_flops", "989e12"]
    proc = run_mmtrain(args)
    got = last_json(proc)
    assert (got["patches"], got["merged_tokens"]) == (1656, 414)
    vision = 1656 * (2 * MAGISTRAL_VISION_MATMUL + 4 * 24 * 1024 * 1656)
    projector = 414 * 2 * (4_194_304 + 5_242_880 + 26_214_400)
    assert got["vision_forward_flops"] == vision and round(vision / 1e12, 2) == 1.61
    assert got["projector_forward_flops"] == projector and round(projector / 1e9, 1) == 29.5
    assert got["vision_multiplier"] == 1 and got["vision_flops"] == vision + projector
    assert got["flops_per_sample"] == text["flops_per_sample"] + vision + projector
    assert got["tflops_per_device"] == got["flops_per_sample"] * 8 / 2.5 / 8 / 1e12
    assert got["mfu"] == got["tflops_per_device"] * 1e12 / 989e12
    assert "139.42 GFLOP per token" in proc.stdout and "504x644 (1656 patches -> 414 [IMG])" in proc.stdout

    # A trained tower and projector run forward and backward: x3.
    trained = last_json(run_mmtrain([*args, "--set", "model.config.freeze_vision=false"]))
    assert trained["vision_multiplier"] == 3 and trained["vision_flops"] == 3 * (vision + projector)


def test_flops_mistral3_rejects_a_malformed_image_size():
    proc = run_mmtrain(["flops", "mistral3", "--config", str(MAGISTRAL), "--seqlens", "2048", "--images", "504*644"],
                       check=False)
    assert proc.returncode == 1 and "--images expects HxW in pixels (e.g. 504x644), found '504*644'" in proc.stderr


MIB = 1048576.0


def test_plan_matches_what_the_trainer_allocates(tmp_path, token_file):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=1))
    plan = last_json(run_mmtrain(["plan", str(cfg), "--world-size", "2", "--seqlen", "16"]))
    train = run_mmtrain(["train", str(cfg)], world=2)
    m = re.search(r"rank 0 holds params ([\d.]+) MiB, grads ([\d.]+) MiB, optimizer state ([\d.]+) MiB "
                  r"\(full model in param_dtype: ([\d.]+) MiB, (\d+) FSDP units\)", train.stdout)
    assert m, train.stdout
    assert float(m.group(1)) == round(plan["param_bytes"] / MIB, 2)
    assert float(m.group(2)) == round(plan["grad_bytes"] / MIB, 2)
    assert float(m.group(3)) == round(plan["optimizer_bytes"] / MIB, 2)
    assert float(m.group(4)) == round(plan["unsharded_param_bytes"] / MIB, 2)
    assert int(m.group(5)) == plan["units"]
    assert plan["tokens"] == 2 * 16 and plan["recompute"] is True
    assert plan["total_bytes"] == plan["total_bytes_recompute"] > 0

    # The moments on disk: the trainer's optimizer state is the plan's windows, the disk its moments.
    (tmp_path / "offload").mkdir()
    disk = ["--set", "training.optimizer=adamw_swap", "--set", f"training.offload_dir={tmp_path / 'offload'}",
            "--set", f"logging.output_dir={tmp_path / 'run_disk'}", "--set", f"training.save={tmp_path / 'ckpt_disk'}"]
    disk_plan = last_json(run_mmtrain(["plan", str(cfg), "--world-size", "2", "--seqlen", "16", *disk]))
    tiers, windows = disk_plan["offload"], disk_plan["offload_window_bytes"]
    assert "(this config)" in next(line for line in run_mmtrain(["plan", str(cfg), "--world-size", "2", *disk])
                                   .stdout.splitlines() if line.strip().startswith("adamw_swap(disk) "))
    moments = tiers["adamw_swap(disk)"]
    assert moments["disk_bytes"] == plan["optimizer_bytes"]
    assert moments["device_bytes"] + moments["host_bytes"] == plan["total_bytes"] - plan["optimizer_bytes"] + windows
    assert tiers["none"] == {"device_bytes": plan["total_bytes"], "host_bytes": 0, "disk_bytes": 0}
    # Around the step (docs/offload.md): a save reads a tensor's moment back (at most U) and copies
    # each tensor off a GPU (at most U); an async save stages every weight and moment; start-up
    # builds the largest parameter whole.
    unit, phases = 4 * disk_plan["largest_shard_numel"], disk_plan["phases"]
    assert phases["save"] == {"device_bytes": 0, "host_bytes": 2 * unit, "disk_bytes": 0}
    assert phases["async_save"]["host_bytes"] == plan["param_bytes"] + plan["optimizer_bytes"]
    assert phases["resume"] == {"device_bytes": 2 * unit, "host_bytes": 2 * unit, "disk_bytes": 0}
    assert phases["startup"]["host_bytes"] == 4 * disk_plan["largest_param_numel"] > 0
    # An evaluation's forwards keep one layer at a time: beyond the step only for a larger micro-batch.
    assert phases["evaluation"] == {"device_bytes": 0, "host_bytes": 0, "disk_bytes": 0}
    big = last_json(run_mmtrain(["plan", str(cfg), "--world-size", "2", "--seqlen", "16",
                                 "--set", "training.eval_batch_size=64"]))
    forward = (big["activation_max_layer_bytes"] + big["activation_outside_bytes"]) * 64 / big["micro_batch_size"]
    assert big["phases"]["evaluation"]["device_bytes"] == int(forward) - big["activation_bytes_recompute"] > 0
    # cpu_offload: the sharded state leaves the device for the host, byte for byte; two fp32
    # reduce buffers of the largest shard hold grads on their way there.
    cpu = tiers["cpu_offload"]
    assert cpu["host_bytes"] == plan["sharded_state_bytes"]
    assert cpu["device_bytes"] == plan["total_bytes"] - plan["sharded_state_bytes"] + \
        2 * 4 * disk_plan["largest_shard_numel"]
    train = run_mmtrain(["train", str(cfg), *disk], world=2)
    m = re.search(r"optimizer state ([\d.]+) MiB", train.stdout)
    assert float(m.group(1)) == round(windows / MIB, 2), train.stdout
    m = re.search(r"mmtrain_rank_00000\.\d+\.offload \((?:direct|buffered) I/O; [^)]*\) \(([\d.]+) MiB per rank",
                  train.stdout)
    assert float(m.group(1)) == round(moments["disk_bytes"] / MIB, 1), train.stdout
    # What cpu_offload's run holds in the host tier is the plan's host bytes (each tensor of the
    # pool rounded up to whole pages: shards, grads and two moments per unit).
    run_mmtrain(["train", str(cfg), "--set", "parallel.fsdp_plan.cpu_offload=true",
                 "--set", f"logging.output_dir={tmp_path / 'run_cpu_offload'}",
                 "--set", f"training.save={tmp_path / 'ckpt_cpu_offload'}"], world=2)
    held = read_metrics(tmp_path / "run_cpu_offload")[-1]["offload"]["host"]["held_mib"] * MIB
    assert cpu["host_bytes"] <= held < cpu["host_bytes"] + 4 * plan["units"] * 4096


def test_plan_full_magihuman_on_eight_ranks():
    proc = run_mmtrain(["plan", str(FULL), "--world-size", "8"])
    plan = last_json(proc)
    assert plan["total_params"] == 15_299_419_136   # 331 tensors less the rope bands buffer
    assert plan["param_bytes"] == 15_299_419_136 // 2  # fp32 / 8 ranks, no padding
    assert plan["units"] == 41 and plan["units_in_flight"] == 3 and plan["seqlen"] == 4606
    assert 40 < plan["total_bytes"] / 2**30 < 60, plan


def test_plan_predicts_the_step_time_on_a_device_profile(tmp_path):
    # docs/step_time.md's case by hand: MagiHuman 15B on 8 x H200, 4606 tokens, recompute on.
    t = last_json(run_mmtrain(["plan", str(FULL), "--world-size", "8", "--device", "h200"]))["step_time"]
    assert round(t["gemm_ms"]) == 509 and round(t["attention_ms"]) == 77 and round(t["recompute_ms"]) == 192
    assert round(t["fsdp_ms"]) == 340 and t["fsdp_exposed_ms"] < 1 and round(t["optimizer_ms"], 1) == 11.2
    # The same FSDP group over 4 nodes of 2 crosses the 50 GB/s NICs and is no longer hidden.
    across = last_json(run_mmtrain(["plan", str(FULL), "--nodes", "4", "--devices-per-node", "2",
                                    "--device", "h200"]))["step_time"]
    assert across["fsdp_ms"] > 5 * t["fsdp_ms"] and across["total_ms"] > t["total_ms"]
    # A profile file of one's own; bad ones are named.
    mine = json.loads((REPO / "profiles" / "h200.json").read_text())
    mine["peak_bf16_tflops"] *= 2
    (tmp_path / "mine.json").write_text(json.dumps(mine))
    faster = last_json(run_mmtrain(["plan", str(FULL), "--world-size", "8", "--device", str(tmp_path / "mine.json")]))
    assert faster["step_time"]["gemm_ms"] == pytest.approx(t["gemm_ms"] / 2)
    del mine["host_link_gb_per_s"]
    (tmp_path / "bad.json").write_text(json.dumps(mine))
    for device, message in ((str(tmp_path / "bad.json"), "'host_link_gb_per_s' is missing"),
                            ("b200", "device profile 'b200': not a built-in profile (h200, h100, a100, 910b3)")):
        proc = run_mmtrain(["plan", str(FULL), "--world-size", "8", "--device", device], check=False)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    proc = run_mmtrain(["plan", str(FULL), "--world-size", "4", "--nodes", "4", "--devices-per-node", "2"], check=False)
    assert proc.returncode != 0 and "--world-size 4 is not --nodes x --devices-per-node = 8" in proc.stderr


def test_measure_profile_writes_a_profile_the_plan_reads(tmp_path, token_file):
    out = tmp_path / "local.json"
    small = ["--gemm-size", "256", "--copy-mb", "16", "--allreduce-mb", "4", "--disk-mb", "8",
             "--disk-dir", str(tmp_path)]
    profile = last_json(run_mmtrain(["measure", "profile", "--out", str(out), *small]))
    assert json.loads(out.read_text())["peak_bf16_tflops"] == profile["peak_bf16_tflops"] > 0
    for key in ("peak_fp32_tflops", "memory_gb_per_s", "intra_node_gb_per_s", "disk_read_gb_per_s",
                "disk_write_gb_per_s"):
        assert profile[key] > 0 and "measured by `mmtrain measure profile`" in profile["sources"][key], key
    assert 0 < profile["efficiency"]["attention"] <= 1
    assert list(tmp_path.glob("*.offload")) == []  # the disk tier's scratch file is gone
    proc = run_mmtrain(["measure", "profile", "--out", str(out), *small], check=False)
    assert proc.returncode != 0 and "exists (pass --overwrite to replace it)" in proc.stderr
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, iters=1))
    plan = last_json(run_mmtrain(["plan", str(cfg), "--world-size", "2", "--seqlen", "16", "--device", str(out)]))
    assert plan["step_time"]["device"] == "local" and plan["step_time"]["total_ms"] > 0


def test_plan_auto_takes_the_sequence_lengths_from_the_data_set(tmp_path, token_file):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, mbs=2, iters=1))
    base = ["plan", str(cfg), "--auto", "--device", "h200", "--nodes", "1", "--devices-per-node", "2"]
    proc = run_mmtrain(base)
    read = last_json(proc)
    assert read["seqlen"] == 16 and read["seqlens_read"] == 64  # the token file's 64 rows of 17: 16 predicted
    assert "sequence lengths from the data set: 64 of its 64 samples read, median 16, longest 16 tokens" in proc.stdout
    given = last_json(run_mmtrain([*base, "--seqlen", "16"]))
    assert given["seqlen"] == 16 and given["seqlens_read"] == 0
    # No data set to read: the model's default, and why.
    bad = write_config(tmp_path / "bad.yaml", (tmp_path / "c.yaml").read_text().replace(str(token_file), str(tmp_path / "gone.safetensors")))
    proc = run_mmtrain(["plan", str(bad), "--auto", "--device", "h200", "--nodes", "1", "--devices-per-node", "2", "--seqlen", "8"])
    assert last_json(proc)["seqlen"] == 8
    proc = run_mmtrain(["plan", str(bad), "--auto", "--device", "h200", "--nodes", "1", "--devices-per-node", "2"], check=False)
    assert "the data set does not load" in proc.stdout + proc.stderr


def test_plan_auto_chooses_under_a_budget_and_its_choice_trains(tmp_path, token_file):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, token_file, mbs=2, iters=1))
    base = ["plan", str(cfg), "--auto", "--device", "h200", "--nodes", "1", "--devices-per-node", "2", "--seqlen", "16"]
    free = last_json(run_mmtrain(base))
    best = free["best"][0]
    assert free["fitting"] == free["tried"] - free["refused"] > 10
    # Recompute only adds a forward and the offload features only add traffic: unconstrained, the
    # winner has neither (ties go to the simpler setting).
    assert "recompute off" in best["summary"] and "offload none" in best["summary"], best["summary"]
    assert [c["step_time"]["total_ms"] for c in free["best"]] == sorted(c["step_time"]["total_ms"] for c in free["best"])
    # A device budget just below the winner's need rules it out: the choice fits the budget.
    budget_gb = best["device_bytes"] * 0.999 / 1e9
    tight = last_json(run_mmtrain([*base, "--device-memory-gb", str(budget_gb)]))
    assert tight["over_device"] > free["over_device"]
    assert tight["best"][0]["device_bytes"] <= budget_gb * 1e9 and tight["best"][0]["summary"] != best["summary"]
    assert tight["best"][0]["step_time"]["total_ms"] >= best["step_time"]["total_ms"]
    proc = run_mmtrain([*base, "--device-memory-gb", "0.000001"], check=False)
    assert proc.returncode != 0 and "plan --auto: nothing fits: the smallest candidate needs" in proc.stderr
    assert "GB of device memory per rank (budget 0.0)" in proc.stderr
    # The winner's settings, written for train --set-file, train.
    choice = tmp_path / "choice.txt"
    run_mmtrain([*base, "--device-memory-gb", str(budget_gb), "--out", str(choice)])
    assert tight["best"][0]["sets"] == [line for line in choice.read_text().splitlines() if not line.startswith("#")]
    run_mmtrain(["train", str(cfg), "--set-file", str(choice)], world=2)
    assert len(read_metrics(tmp_path / "run")) == 1
    # adamw8bit's update runs on the host: on a device only the cpu_offload settings are candidates.
    eight_bit = last_json(run_mmtrain([*base, "--set", "training.optimizer=adamw8bit"]))
    assert eight_bit["best"] and all("cpu_offload" in c["summary"] for c in eight_bit["best"]), eight_bit["best"]
    assert all("training.optimizer=adamw8bit" in c["sets"] for c in eight_bit["best"])


def test_runs_check_their_plan_and_calibrate_the_profile(tmp_path, token_file):
    profile = tmp_path / "local.json"
    run_mmtrain(["measure", "profile", "--out", str(profile), "--gemm-size", "256", "--copy-mb", "16",
                 "--allreduce-mb", "4", "--disk-mb", "8", "--disk-dir", str(tmp_path)])
    runs = []
    for name, mbs in (("small", 1), ("large", 4)):
        d = tmp_path / name
        d.mkdir()
        cfg = write_config(d / "c.yaml", tiny_config(d, token_file, mbs=mbs, iters=6,
                                                     extra=f"  device_profile: {profile}\n"))
        run_mmtrain(["train", str(cfg)], world=2)
        runs.append(d / "run")
    records = read_metrics(runs[0])
    plan = json.loads((runs[0] / "plan.json").read_text())
    assert plan["seqlen"] == 16 and plan["device_profile"] == "local"
    assert plan["seqlen_source"] == "the longest of 64 samples of the data set"
    assert all(r["predicted_step_time_ms"] == plan["step_time"]["total_ms"] > 0 for r in records)
    # The run's own peak RSS against the plan's (runtime and data, then the plan's bytes).
    assert all(r["predicted_peak_rss_mb"] == plan["predicted_peak_rss_mb"] > plan["baseline_rss_mb"] > 0 for r in records)
    summary = last_json(run_mmtrain(["logs", "summary", str(runs[0] / "metrics.jsonl")]))
    assert summary["step_time_over_predicted"] > 0 and 0.5 < summary["peak_rss_over_predicted"] < 1.5
    # Calibration scales compute so that the runs' median error does not grow.
    out = tmp_path / "calibrated.json"
    fit = last_json(run_mmtrain(["plan", "--calibrate", *map(str, runs), "--device", str(profile), "--out", str(out),
                                 "--skip-first", "2"]))
    assert fit["runs"] == 2 and fit["compute_scale"] > 0
    assert fit["median_abs_error_after"] <= fit["median_abs_error_before"]
    assert "calibrated by `mmtrain plan --calibrate` on 2 run(s)" in json.loads(out.read_text())["sources"]["efficiency"]
    for args, message in ((["--device", "h200"], "it was predicted on profile 'local', not 'h200'"),
                          (["--device", str(profile), "--calibrate", str(tmp_path)], "no plan.json")):
        proc = run_mmtrain(["plan", "--calibrate", str(runs[0]), *args, "--out", str(tmp_path / "x.json")], check=False)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_logs_compare_two_runs(tmp_path, token_file):
    # Same global batch (4) two ways: 1 rank x micro 2 x accum 2, and 2 ranks x micro 2 x accum 1.
    runs = {}
    for name, world, accum in (("one", 1, 2), ("two", 2, 1)):
        d = tmp_path / name
        d.mkdir()
        cfg = write_config(d / "c.yaml", tiny_config(d, token_file, mbs=2, accum=accum, iters=12))
        proc = run_mmtrain(["train", str(cfg)], world=world)
        (d / "console.log").write_text(proc.stdout)
        runs[name] = d
    one, two = runs["one"] / "run" / "metrics.jsonl", runs["two"] / "run" / "metrics.jsonl"

    parsed = [json.loads(line) for line in run_mmtrain(["logs", "parse", str(one)]).stdout.splitlines()]
    assert [r["iteration"] for r in parsed] == list(range(1, 13))

    got = last_json(run_mmtrain(["logs", "compare", str(two), str(one), "--skip-first", "2", "--window", "5"]))
    assert got["common_iterations"] == 12
    assert got["loss_rel_diff"] < 1e-4, got          # FSDP on 2 ranks == 1 rank (fp32)
    assert got["a"]["step_time_ms"]["count"] == 10 and got["a"]["skipped_warmup"] == 2
    assert got["last_window"]["common_iterations"] == 5
    assert got["step_time_ratio"] > 0 and got["a"]["samples_per_s"] > 0

    # A run's console (Megatron-style lines) against its own metrics.jsonl: only print rounding.
    same = last_json(run_mmtrain(["logs", "compare", str(runs["one"] / "console.log"), str(one)]))
    assert same["common_iterations"] == 12 and same["loss_rel_diff"] < 1e-6
