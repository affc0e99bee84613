#!/usr/bin/env bash
# Builds mmtrain with -DMMTRAIN_CUDA=ON (NCCL, CUDA streams for the offload tiers, pinned host
# memory, the caching allocator's peaks in metrics, ATen's CUDA flash attention). Two uses:
#   - here, on a machine with nvcc and no GPU: it shows the CUDA path compiles and links (it runs
#     nothing on a GPU). The CUDA torch lives in its own venv (.venv-cuda, several GB: pip takes the
#     torch pin of scripts/cuda_wheels.txt and its nvidia-* packages from this machine's wheel store);
#   - on a GPU machine (scripts/gpu_check.sh): TORCH_PYTHON names the Python whose CUDA torch is
#     already installed there, and DEPS the C++ dependencies extracted from Debian packages
#     (scripts/device_deps.sh), for a machine without them.
# CI compiles the files that differ under MMTRAIN_CUDA on every change, without this script
# (scripts/check_cuda_compile.py). The CUDA binary also runs on CPU ranks (gloo): its host pool pins
# memory only when the run's device is a GPU (docs/offload.md has such a run).
# Usage: scripts/build_cuda.sh [BUILD_DIR] [TARGET...]   (default build-cuda, target mmtrain)
# Knobs: PYTHON (python3.11, makes .venv-cuda), TORCH_PYTHON (a Python with a CUDA torch: no venv),
#   TORCH_CUDA (the torch pin of scripts/cuda_wheels.txt), DEPS (extracted Debian packages' root),
#   JOBS (nproc), CUDA_HOME (/usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-cuda}
shift || true
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(mmtrain)
PYTHON=${PYTHON:-python3.11}
TORCH_CUDA=${TORCH_CUDA:-$(grep -m1 '^torch==' scripts/cuda_wheels.txt)}
JOBS=${JOBS:-$(nproc)}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
command -v nvcc >/dev/null || [ -x "$CUDA_HOME/bin/nvcc" ] || { echo "build_cuda: no nvcc (CUDA_HOME=$CUDA_HOME)" >&2; exit 1; }
if [ -n "${TORCH_PYTHON:-}" ]; then
  TORCH_PYTHON=$(command -v "$TORCH_PYTHON")
else
  if ! .venv-cuda/bin/python -c "import torch, nvidia.nccl; assert torch.version.cuda" 2>/dev/null; then
    echo "build_cuda: creating .venv-cuda with $TORCH_CUDA (a CUDA build)"
    "$PYTHON" -m venv .venv-cuda
    .venv-cuda/bin/pip install -q --disable-pip-version-check "$TORCH_CUDA"
  fi
  TORCH_PYTHON=$PWD/.venv-cuda/bin/python
fi
"$TORCH_PYTHON" -c "import torch; assert torch.version.cuda, 'torch ' + torch.__version__ + ' is not a CUDA build'"
echo "build_cuda: $("$TORCH_PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)')"
# TorchConfig looks for the toolkit with FindCUDA (CUDA_TOOLKIT_ROOT_DIR) and links NVRTC, which
# the wheel ships in its nvidia package rather than the toolkit here.
NVRTC=$("$TORCH_PYTHON" -c "import glob, os, nvidia; print(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], '*', 'lib', 'libnvrtc.so.*')))[0])")
CMAKE_ARGS=(-DCMAKE_BUILD_TYPE=Release -DMMTRAIN_CUDA=ON -DMMTRAIN_PYTHON="$TORCH_PYTHON"
            -DCUDA_TOOLKIT_ROOT_DIR="$CUDA_HOME" -DCUDA_nvrtc_LIBRARY="$NVRTC")
if [ -n "${DEPS:-}" ]; then
  # Debian's layout under DEPS: CMake package files in lib/<arch>/cmake and share/cmake, libraries in
  # lib/<arch>, every header under include (gloo's, which no CMake package names, among them).
  DEPS=$(cd "$DEPS" && pwd)
  ARCH_LIB=$DEPS/usr/lib/$(uname -m)-linux-gnu
  CMAKE_ARGS+=(-DCMAKE_PREFIX_PATH="$DEPS/usr;$ARCH_LIB/cmake;$DEPS/usr/share/cmake" -DCMAKE_LIBRARY_PATH="$ARCH_LIB"
               -DCMAKE_INCLUDE_PATH="$DEPS/usr/include" -DCMAKE_CXX_FLAGS="-isystem $DEPS/usr/include")
fi
cmake -S . -B "$BUILD_DIR" -G Ninja "${CMAKE_ARGS[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}"
echo "build_cuda: built ${TARGETS[*]} in $BUILD_DIR"
"$BUILD_DIR/bin/mmtrain" --help >/dev/null
echo "build_cuda: ok"
