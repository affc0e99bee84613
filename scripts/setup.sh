#!/usr/bin/env bash
# Idempotent set-up of everything mmtrain needs on a fresh Debian machine:
#   - Debian packages: compilers' helpers, gloo headers, yaml-cpp, nlohmann-json, CLI11, gtest, ccache;
#     strace and a single-node SLURM (slurmctld, slurmd, munge) for the fault and launcher tests
#   - the project venv .venv with torch==2.13.0 (CPU build) and the Python test/benchmark packages
# Re-running it only checks what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(cmake ninja-build g++ ccache libgloo-dev libyaml-cpp-dev nlohmann-json3-dev
              libcli11-dev googletest libgtest-dev libstb-dev libpcre2-dev
              libtcmalloc-minimal4 libjemalloc2 strace slurmctld slurmd slurm-client munge)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch, safetensors, numpy, pytest, mistral_common, tokenizers, transformers, PIL, matplotlib, tensorboard, peft, diffusers, av, bitsandbytes" 2>/dev/null; then
  echo "setup: installing Python packages into .venv (torch 2.13.0 CPU build)"
  .venv/bin/pip install -q --disable-pip-version-check -r scripts/requirements.txt
fi
echo "setup: ok ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
