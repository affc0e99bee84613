#!/usr/bin/env bash
# The C++ dependencies of mmtrain, as Debian packages downloaded here and extracted (not installed)
# into third_party_device/root (git-ignored, ~14 MB), for a GPU machine that has CUDA, cmake, ninja,
# a compiler and a CUDA torch but no Debian packages: the device tool carries the folder there and
# scripts/gpu_check.sh builds against it (scripts/build_cuda.sh, DEPS=...). Runtime libraries
# (yaml-cpp, stb, tcmalloc) are found through the build's RPATH.
# Usage: scripts/device_deps.sh [DEST]   (default third_party_device)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-third_party_device}
PACKAGES=(libgloo-dev libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libcli11-dev libgtest-dev
          libstb-dev libstb0 libpcre2-dev libpcre2-8-0 libtcmalloc-minimal4)
rm -rf "$DEST"
mkdir -p "$DEST/debs"
(cd "$DEST/debs" && apt-get download -q "${PACKAGES[@]}")
for deb in "$DEST"/debs/*.deb; do dpkg -x "$deb" "$DEST/root"; done
ls "$DEST"/debs/*.deb > "$DEST/packages.txt"
rm -rf "$DEST/debs"
echo "device_deps: ${#PACKAGES[@]} packages extracted into $DEST/root ($(du -sh "$DEST/root" | cut -f1))"
