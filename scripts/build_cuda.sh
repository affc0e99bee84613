#!/usr/bin/env bash
# Builds mmtrain with -DMMTRAIN_CUDA=ON (NCCL, CUDA streams for the offload tiers, pinned host
# memory) against the CUDA torch wheel, on a machine with nvcc and no GPU: it shows the CUDA path
# compiles and links; it runs nothing on a GPU. The CUDA torch lives in its own venv (.venv-cuda,
# several GB: pip takes torch 2.14.1 and its nvidia-* packages from this machine's wheel store),
# the build in BUILD_DIR (default build-cuda). The CUDA binary also runs on CPU ranks (gloo): its
# host pool pins memory only when the run's device is a GPU (docs/offload.md has such a run).
# Usage: scripts/build_cuda.sh [BUILD_DIR]   Knobs: PYTHON (python3.11), TORCH_CUDA (torch==2.14.1),
#   JOBS (nproc), CUDA_HOME (/usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-cuda}
PYTHON=${PYTHON:-python3.11}
TORCH_CUDA=${TORCH_CUDA:-torch==2.14.1}
JOBS=${JOBS:-$(nproc)}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
command -v nvcc >/dev/null || [ -x "$CUDA_HOME/bin/nvcc" ] || { echo "build_cuda: no nvcc (CUDA_HOME=$CUDA_HOME)" >&2; exit 1; }
if ! .venv-cuda/bin/python -c "import torch, nvidia.nccl; assert torch.version.cuda" 2>/dev/null; then
  echo "build_cuda: creating .venv-cuda with $TORCH_CUDA (a CUDA build)"
  "$PYTHON" -m venv .venv-cuda
  .venv-cuda/bin/pip install -q --disable-pip-version-check "$TORCH_CUDA"
fi
echo "build_cuda: $(.venv-cuda/bin/python -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)')"
# TorchConfig looks for the toolkit with FindCUDA (CUDA_TOOLKIT_ROOT_DIR) and links NVRTC, which
# the wheel ships in its nvidia package rather than the toolkit here.
NVRTC=$(.venv-cuda/bin/python -c "import glob, os, nvidia; print(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], '*', 'lib', 'libnvrtc.so.*')))[0])")
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMMTRAIN_CUDA=ON \
  -DMMTRAIN_PYTHON="$PWD/.venv-cuda/bin/python" -DCUDA_TOOLKIT_ROOT_DIR="$CUDA_HOME" -DCUDA_nvrtc_LIBRARY="$NVRTC" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target mmtrain
echo "build_cuda: built $BUILD_DIR/bin/mmtrain"
"$BUILD_DIR/bin/mmtrain" --help >/dev/null
echo "build_cuda: ok"
