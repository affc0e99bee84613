"""The checks of scripts/gpu_check.sh, which builds mmtrain on a GPU machine and then runs this:

    python3 scripts/gpu_check.py --build BUILD_DIR --out OUT [--device cuda|cpu] [--width real|tiny]
                                 [--budget-s S] [--only NAME,...] [--real-layers L]

Each check writes OUT/<name>.json ({"check", "ok", "seconds", ...}); OUT/summary.json lists them
all, with the ones skipped (out of budget, or not asked for). In order of priority:

  comm            every Comm collective through a one-rank NCCL group under torchrun
                  (tests/device/device_comm_test.cpp)
  tiny_parity     two training steps of tiny MagiHuman and tiny Magistral on the device in fp32
                  against the same steps on the CPU (loss and grad norm within 1e-5 relative),
                  with each offload feature off and on
  attention       varlen attention on the device against the per-sample path, bf16, GQA, forward
                  and backward (tests/device/device_attention_test.cpp)
  magihuman_real  MagiHuman at its real layer shapes (hidden 5120, 40 / 8 heads, head dim 128, GELU7
                  and SwiGLU7 layers, modality experts), --real-layers layers, the seed's 4606-token
                  packed sample, bf16, recompute: step time, TFLOP/s and MFU (the seed's convention)
                  against the datasheet's dense bf16 peak and a measured bf16 GEMM; the same with
                  the MLP layout transform off (deinterleave_mlp: false)
  sampling        the same model sampling the seed's 5 s 256x480 clip (32 steps, guidance) during
                  training: the phase's time and allocated peak against the step's, and the plan's
                  predicted sampling time
  qlora           the same model with LoRA over the bf16 base and over an nf4 base
                  (features.lora.base_quant): step time, allocated peak, FSDP gather bytes, and the
                  plan's predicted peak, each arm
  offload         the same model at half the layers: each offload feature's allocated and reserved
                  peaks, step time and copy waits against none; at two layers, an async save
                  against a sync one

--device cpu runs every check on the CPU (the GPU's counterpart runs on the CPU too, so parity is
trivially exact): how this script is tested without a GPU (tests/e2e/test_gpu_check.py), with
--width tiny, which gives the last two checks the tiny model's widths.
"""
import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKS = ["comm", "tiny_parity", "attention", "magihuman_real", "sampling", "qlora", "offload"]
PARITY_BOUND = 1e-5
MAGIHUMAN_TINY = os.path.join(REPO, "examples", "magihuman", "magihuman_tiny.yaml")
MAGIHUMAN_REAL = os.path.join(REPO, "examples", "magihuman", "magihuman_config_t2av.yaml")
MAGISTRAL_TINY = os.path.join(REPO, "examples", "magistral", "magistral_tiny.yaml")
BLOCKS = {"magihuman": '["dit.block.layers.{*}"]', "mistral3": '["model.language_model.layers.{*}"]'}


class Context:
    def __init__(self, args):
        self.args = args
        self.bin = os.path.join(os.path.abspath(args.build), "bin", "mmtrain")
        self.tests = os.path.join(os.path.abspath(args.build), "bin", "mmtrain_tests")
        self.out = os.path.abspath(args.out)
        self.work = tempfile.mkdtemp(prefix="gpu_check-")
        self.deadline = time.time() + args.budget_s
        self.fixtures = {}

    def env(self, device):
        env = dict(os.environ, MMTRAIN_DEVICE=device)
        env.setdefault("OMP_NUM_THREADS", "1" if device == "cpu" and self.args.device == "cpu" else "4")
        return env

    def run(self, argv, device, timeout=None):
        """argv's result; raises with its output's tail when it fails."""
        limit = max(1, min(timeout or 1e9, self.deadline - time.time()))
        try:
            proc = subprocess.run(argv, env=self.env(device), capture_output=True, text=True, timeout=limit)
        except OSError as e:
            raise RuntimeError(f"cannot run {argv[0]}: {e}") from e
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise RuntimeError(f"{' '.join(argv[:3])} ... exited {proc.returncode}:\n{tail}")
        return proc

    def fixture(self, model):
        """The tiny data sets (and the real-width MagiHuman's), made once."""
        if model in self.fixtures:
            return self.fixtures[model]
        path = os.path.join(self.work, "data", model)
        if model == "magihuman_tiny":
            self.run([self.bin, "fixture", "magihuman", "--out", path, "--samples", "8", "--seed", "1",
                      "--video-grid", "2,4,6", "--audio-tokens", "13", "--text-tokens", "10", "--video-channels", "16",
                      "--audio-channels", "8", "--text-channels", "24"], "cpu")
        elif model == "magihuman_seed":  # the seed's 5 s 256p sample: 3840 + 126 + 640 = 4606 tokens
            self.run([self.bin, "fixture", "magihuman", "--out", path, "--samples", "4", "--seed", "1"], "cpu")
        elif model == "magistral_tiny":
            self.run([self.bin, "fixture", "mistral3", "--out", path, "--samples", "16", "--seed", "1"], "cpu")
        self.fixtures[model] = path
        return path

    def train(self, name, config, device, sets, timeout=None):
        """Trains CONFIG with `sets` on one process; returns its metrics records."""
        run_dir = os.path.join(self.work, "runs", name)
        shutil.rmtree(run_dir, ignore_errors=True)
        argv = [self.bin, "train", config, "--set", f"logging.output_dir={run_dir}", "--set", "training.save=",
                "--set", "logging.progress=false"]
        for s in sets:
            argv += ["--set", s]
        self.run(argv, device, timeout)
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]


def gtest_check(ctx, name, gtest_filter, torchrun):
    report = os.path.join(ctx.work, f"{name}_gtest.json")
    argv = [ctx.tests, f"--gtest_filter={gtest_filter}", f"--gtest_output=json:{report}"]
    if torchrun:  # a one-rank launch as every real run has: torchrun's environment, its store
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--no-python"] + argv
    error = None
    try:
        ctx.run(argv, ctx.args.device, timeout=300)
    except RuntimeError as e:
        error = str(e)
    tests = []
    if os.path.exists(report):
        for suite in json.load(open(report)).get("testsuites", []):
            for test in suite.get("testsuite", []):
                failures = [f.get("failure", "") for f in test.get("failures", [])]
                tests.append({"name": f"{suite['name']}.{test['name']}", "ok": not failures, "failures": failures})
    ok = error is None and bool(tests) and all(t["ok"] for t in tests)
    return {"ok": ok, "tests": tests, **({"error": error} if error else {})}


def check_comm(ctx):
    return gtest_check(ctx, "comm", "DeviceComm.*", torchrun=True)


def check_attention(ctx):
    return gtest_check(ctx, "attention", "*DeviceAttention.*", torchrun=False)


def offload_sets(feature, model, offload_dir):
    return {"none": [],
            "activation_offload": ["features.enable_activation_offload=true",
                                   f"features.activation_offload_plan.apply_modules={BLOCKS[model]}"],
            "adamw_swap": ["training.optimizer=adamw_swap"],
            "cpu_offload": ["parallel.fsdp_plan.cpu_offload=true"],
            "moments_on_disk": ["training.optimizer=adamw_swap", f"training.offload_dir={offload_dir}"]}[feature]


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def check_tiny_parity(ctx):
    models = {
        "magihuman": (MAGIHUMAN_TINY, lambda: [f"data.dataset_param.data_root={ctx.fixture('magihuman_tiny')}",
                                               "model.model_name_or_path="]),
        "mistral3": (MAGISTRAL_TINY, lambda: [
            f"data.dataset_param.preprocess_parameters.model_name_or_path={ctx.fixture('magistral_tiny')}/tekken.json",
            f"data.dataset_param.basic_parameters.dataset={ctx.fixture('magistral_tiny')}/conversations.json"]),
    }
    offload_dir = os.path.join(ctx.work, "offload")
    os.makedirs(offload_dir, exist_ok=True)
    runs, ok = [], True
    for model, (config, data_sets) in models.items():
        for feature in ctx.args.features.split(","):
            sets = data_sets() + ["training.train_iters=2", "training.seed=7"] + offload_sets(feature, model, offload_dir)
            entry = {"model": model, "feature": feature}
            try:
                device = ctx.train(f"{model}_{feature}_device", config, ctx.args.device, sets)
                cpu = ctx.train(f"{model}_{feature}_cpu", config, "cpu", sets)
                entry["iterations"] = [
                    {"iteration": d["iteration"], "loss": [d["loss"], c["loss"]], "grad_norm": [d["grad_norm"], c["grad_norm"]],
                     "loss_rel": relative(d["loss"], c["loss"]), "grad_norm_rel": relative(d["grad_norm"], c["grad_norm"])}
                    for d, c in zip(device, cpu)]
                entry["ok"] = len(device) == len(cpu) == 2 and all(
                    i["loss_rel"] <= PARITY_BOUND and i["grad_norm_rel"] <= PARITY_BOUND for i in entry["iterations"])
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                entry.update(ok=False, error=str(e))
            ok = ok and entry["ok"]
            runs.append(entry)
    return {"ok": ok, "bound": PARITY_BOUND, "runs": runs}


def measured_gemm_flops(ctx):
    proc = ctx.run([ctx.bin, "measure", "gemm", "--dtype", "bf16", "--device", ctx.args.device, "--threads",
                    ctx.env(ctx.args.device)["OMP_NUM_THREADS"], "--size", "8192" if ctx.args.device == "cuda" else "512",
                    "--repeats", "10"], ctx.args.device, timeout=120)
    return json.loads(proc.stdout.strip().splitlines()[-1])["gemm_flops"]


def datasheet_bf16_flops(ctx):
    profile = json.load(open(os.path.join(REPO, "profiles", f"{ctx.args.profile}.json")))
    return profile["peak_bf16_tflops"] * 1e12


def magihuman_shape_sets(ctx, layers):
    """The model at real (or, with --width tiny, tiny) widths with `layers` layers: one GELU7 layer
    and the modality experts in the first and last, as the 15B's first and last four."""
    if ctx.args.width == "tiny":
        return MAGIHUMAN_TINY, [f"data.dataset_param.data_root={ctx.fixture('magihuman_tiny')}", "model.model_name_or_path=",
                                "parallel.fsdp_plan.param_dtype=bf16", "training.micro_batch_size=1"]
    return MAGIHUMAN_REAL, [f"data.dataset_param.data_root={ctx.fixture('magihuman_seed')}", "model.model_name_or_path=",
                            "model.checkpoint_path=", f"model.config.num_layers={layers}",
                            f"model.config.mm_layers=[0, {layers - 1}]", "model.config.gelu7_layers=[0]"]


def steady(records, key):
    values = [r[key] for r in records[1:] if key in r] or [r[key] for r in records if key in r]
    return statistics.median(values) if values else None


def check_magihuman_real(ctx):
    gemm = measured_gemm_flops(ctx)
    peak = datasheet_bf16_flops(ctx)
    config, sets = magihuman_shape_sets(ctx, ctx.args.real_layers)
    arms = {"seed_config": [], "mlp_layout_transform_off": ["model.config.deinterleave_mlp=false"]}
    results, ok = {}, True
    for arm, extra in arms.items():
        try:
            records = ctx.train(f"real_{arm}", config, ctx.args.device,
                                sets + extra + ["training.train_iters=4", f"logging.hardware_flops={peak}"], timeout=400)
            tflops = steady(records, "tflops_per_device")
            results[arm] = {"step_time_ms": steady(records, "step_time_ms"), "tflops_per_device": tflops,
                            "mfu_datasheet": steady(records, "mfu"),
                            "mfu_measured_gemm": tflops * 1e12 / gemm if tflops else None,
                            "peak_device_allocated_mb": steady(records, "peak_device_allocated_mb"),
                            "peak_device_reserved_mb": steady(records, "peak_device_reserved_mb"),
                            "predicted_peak_device_mb": steady(records, "predicted_peak_device_mb"),
                            "loss": [r["loss"] for r in records]}
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            results[arm] = {"error": str(e)}
            ok = False
    return {"ok": ok, "layers": ctx.args.real_layers, "width": ctx.args.width, "measured_bf16_gemm_flops": gemm,
            "datasheet_bf16_flops": peak, "arms": results,
            "fused_ops": "no CUDA kernels for the fused ops: on a GPU both settings run the reference ops"}


def write_zero_embedding(path, rows, channels):
    """A safetensors file holding prompt_embeds [rows, channels] fp16 zeros (the values do not time)."""
    header = json.dumps({"prompt_embeds": {"dtype": "F16", "shape": [rows, channels],
                                           "data_offsets": [0, 2 * rows * channels]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + bytes(2 * rows * channels))


def check_sampling(ctx):
    config, sets = magihuman_shape_sets(ctx, ctx.args.real_layers)
    tiny = ctx.args.width == "tiny"
    channels, seconds, resolution, steps = (24, 0.48, "64x96", 4) if tiny else (3584, 5, "256x480", 32)
    prompts = os.path.join(ctx.work, "sample_prompts")
    os.makedirs(prompts, exist_ok=True)
    for name in ("prompt", "negative"):
        write_zero_embedding(os.path.join(prompts, f"{name}.safetensors"), 640, channels)
    with open(os.path.join(prompts, "prompts.jsonl"), "w") as f:
        f.write(json.dumps({"conditions": "prompt.safetensors", "negative_conditions": "negative.safetensors", "seed": 1,
                            "seconds": seconds, "resolution": resolution, "steps": steps}) + "\n")
    sampling = [f"training.sample_prompts={os.path.join(prompts, 'prompts.jsonl')}", "training.sample_interval=2"]
    records = ctx.train("sampling", config, ctx.args.device, sets + sampling + ["training.train_iters=3"], timeout=400)
    steps_records = [r for r in records if "loss" in r]
    samples = [r for r in records if r.get("kind") == "samples"]
    plan_argv = [ctx.bin, "plan", config, "--device", ctx.args.profile]
    for s in sets + sampling:
        plan_argv += ["--set", s]
    plan = json.loads(ctx.run(plan_argv, "cpu", timeout=60).stdout.strip().splitlines()[-1])
    step_peak = steady(steps_records, "peak_device_allocated_mb")
    sample_peak = samples[0].get("peak_device_allocated_mb") if samples else None
    return {"ok": len(samples) == 1 and (sample_peak is None or step_peak is None or sample_peak <= step_peak),
            "layers": ctx.args.real_layers, "width": ctx.args.width, "seconds": seconds, "resolution": resolution,
            "steps": steps, "samples_s": samples[0]["samples_s"] if samples else None,
            "sample_peak_device_allocated_mb": sample_peak, "step_peak_device_allocated_mb": step_peak,
            "step_time_ms": steady(steps_records, "step_time_ms"),
            "predicted_samples_s": plan["sampling"]["time_ms"] / 1e3 if "time_ms" in plan.get("sampling", {}) else None,
            "predicted_forwards": plan.get("sampling", {}).get("forwards"), "profile": ctx.args.profile}


def check_qlora(ctx):
    config, sets = magihuman_shape_sets(ctx, ctx.args.real_layers)
    results, ok = {}, True
    for arm in ("none", "nf4"):
        try:
            records = ctx.train(f"qlora_{arm}", config, ctx.args.device,
                                sets + ["features.enable_lora=true", f"features.lora.base_quant={arm}",
                                        "training.train_iters=3"], timeout=300)
            steps = [r for r in records if "loss" in r]
            results[arm] = {key: steady(steps, key) for key in
                            ["step_time_ms", "peak_device_allocated_mb", "predicted_peak_device_mb", "fsdp_gather_mib",
                             "peak_rss_mb"]}
            results[arm]["loss"] = [r["loss"] for r in steps]
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            results[arm] = {"error": str(e)}
            ok = False
    if ok and results["none"]["step_time_ms"]:
        results["nf4_over_bf16_step"] = results["nf4"]["step_time_ms"] / results["none"]["step_time_ms"]
    return {"ok": ok, "layers": ctx.args.real_layers, "width": ctx.args.width, "arms": results}


def check_offload(ctx):
    layers = max(2, ctx.args.real_layers // 2)
    config, sets = magihuman_shape_sets(ctx, layers)
    offload_dir = os.path.join(ctx.work, "offload_real")
    os.makedirs(offload_dir, exist_ok=True)
    results, ok = {}, True
    for feature in ["none", "activation_offload", "adamw_swap", "cpu_offload"]:
        try:
            records = ctx.train(f"offload_{feature}", config, ctx.args.device,
                                sets + offload_sets(feature, "magihuman", offload_dir) + ["training.train_iters=3"],
                                timeout=300)
            results[feature] = {key: steady(records, key) for key in
                                ["step_time_ms", "peak_device_allocated_mb", "peak_device_reserved_mb",
                                 "predicted_peak_device_mb", "peak_rss_mb"]}
            results[feature]["offload"] = records[-1].get("offload")
            results[feature]["phases_ms"] = records[-1].get("phases_ms")
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            results[feature] = {"error": str(e)}
            ok = False
    saves = {}
    save_config, save_sets = magihuman_shape_sets(ctx, 2)  # two layers: ~10 GB written per save
    for mode in ["sync", "async"]:
        save_dir = os.path.join(ctx.work, f"save_{mode}")
        shutil.rmtree(save_dir, ignore_errors=True)
        try:
            records = ctx.train(f"save_{mode}", save_config, ctx.args.device,
                                save_sets + ["training.train_iters=3", f"training.save={save_dir}", "training.save_interval=2",
                                        f"training.async_save={'true' if mode == 'async' else 'false'}"], timeout=300)
            saves[mode] = {"checkpoint_stall_ms": [r.get("checkpoint_stall_ms") for r in records],
                           "step_time_ms": [r["step_time_ms"] for r in records]}
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            saves[mode] = {"error": str(e)}
            ok = False
        shutil.rmtree(save_dir, ignore_errors=True)
    return {"ok": ok, "layers": layers, "width": ctx.args.width, "features": results, "saves": saves}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(REPO, "build-gpu"))
    parser.add_argument("--out", default=os.environ.get("OUT", os.path.join(REPO, "gpu_check_out")))
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--width", choices=["real", "tiny"], default="real")
    parser.add_argument("--profile", default="h200", help="device profile whose dense bf16 peak is the datasheet MFU's")
    parser.add_argument("--budget-s", type=float, default=420, help="checks that would start after this are skipped")
    parser.add_argument("--only", default=",".join(CHECKS))
    parser.add_argument("--features", default="none,activation_offload,adamw_swap,cpu_offload",
                        help="tiny_parity: the offload settings compared")
    parser.add_argument("--real-layers", type=int, default=8)
    args = parser.parse_args()
    unknown = set(args.only.split(",")) - set(CHECKS)
    if unknown:
        parser.error(f"--only: unknown checks {sorted(unknown)}; known: {CHECKS}")
    os.makedirs(args.out, exist_ok=True)
    ctx = Context(args)
    functions = {"comm": check_comm, "tiny_parity": check_tiny_parity, "attention": check_attention,
                 "magihuman_real": check_magihuman_real, "sampling": check_sampling, "qlora": check_qlora,
                 "offload": check_offload}
    summary = {"device": args.device, "width": args.width, "checks": {}}
    try:
        for name in CHECKS:
            if name not in args.only.split(","):
                summary["checks"][name] = "not asked for"
                continue
            if time.time() >= ctx.deadline:
                summary["checks"][name] = "skipped: out of budget"
                continue
            began = time.time()
            print(f"gpu_check: {name} ...", flush=True)
            try:
                result = functions[name](ctx)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                result = {"ok": False, "error": str(e)}
            result = {"check": name, "seconds": round(time.time() - began, 1), **result}
            with open(os.path.join(args.out, f"{name}.json"), "w") as f:
                json.dump(result, f, indent=1)
            summary["checks"][name] = "ok" if result["ok"] else "FAILED"
            print(f"gpu_check: {name}: {summary['checks'][name]} ({result['seconds']} s)", flush=True)
    finally:
        shutil.rmtree(ctx.work, ignore_errors=True)
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps(summary))
    sys.exit(0 if all(v in ("ok", "not asked for") for v in summary["checks"].values()) else 1)


if __name__ == "__main__":
    main()
