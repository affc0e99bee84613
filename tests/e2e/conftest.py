"""Shared helpers for end-to-end tests that run the mmtrain binary (alone or under torchrun)."""
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def mmtrain_bin() -> Path:
    path = Path(os.environ.get("MMTRAIN_BIN", REPO / "build" / "bin" / "mmtrain"))
    if not path.exists():
        pytest.skip(f"mmtrain binary not built at {path} (set MMTRAIN_BIN)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_mmtrain(args, world=1, check=True, timeout=300, env_extra=None, cwd=None):
    """Runs `mmtrain ARGS` (world == 1) or `torchrun --nproc-per-node W --no-python mmtrain ARGS`."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.update(env_extra or {})
    if world == 1:
        cmd = [str(mmtrain_bin()), *args]
    else:
        torchrun = Path(sys.executable).parent / "torchrun"
        cmd = [str(torchrun), "--nproc-per-node", str(world), "--master-port", str(free_port()),
               "--no-python", str(mmtrain_bin()), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{crash_lines(proc.stderr)}"
                             f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def crash_lines(stderr: str) -> str:
    """A rank's fatal-signal backtrace, which the other ranks' connection errors push out of the tail."""
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        if "mmtrain: fatal signal" in line or "terminate called" in line:
            return "--- crash report ---\n" + "\n".join(lines[max(0, i - 2):i + 40]) + "\n--- tails ---\n"
    return ""


def read_metrics(run_dir: Path):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def token_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "tokens.safetensors"
    run_mmtrain(["fixture", "tokens", "--out", str(out), "--samples", "64", "--seq-len", "17",
                 "--vocab", "64", "--seed", "3", "--learnable"])
    return out


def tiny_config(tmp: Path, tokens: Path, *, mbs=2, accum=1, iters=20, save_interval=0, load="", extra=""):
    return f"""
parallel:
  timeout_s: 120
  fsdp_plan:
    apply_modules: ["layers.{{*}}"]
    num_to_forward_prefetch: 1
    num_to_backward_prefetch: 1
model:
  model_id: test_transformer
  config: {{vocab_size: 64, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, ffn_hidden_size: 64}}
data:
  dataset_param: {{dataset_type: token_file, path: {tokens}}}
  dataloader_param: {{collate_param: {{model_name: causal_lm}}}}
features:
  recompute: true
  recompute_plan: {{apply_modules: ["layers.{{*}}"]}}
training:
  micro_batch_size: {mbs}
  gradient_accumulation_steps: {accum}
  train_iters: {iters}
  lr: 3.0e-3
  lr_min: 3.0e-4
  lr_warmup_ratio: 0.1
  lr_decay_style: cosine
  weight_decay: 0.01
  clip_grad: 1.0
  seed: 5
  save: {tmp / 'ckpt'}
  save_interval: {save_interval}
  load: "{load}"
logging:
  output_dir: {tmp / 'run'}
{extra}
"""


def strace_usable() -> str:
    """Why the strace-driven tests cannot run here ('' when they can)."""
    if shutil.which("strace") is None:
        return "strace is not installed (scripts/setup.sh installs it)"
    probe = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "true"], capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"strace cannot trace here: {probe.stderr.strip()[:200]}"
