#!/usr/bin/env bash
# Builds a libgosym.so that embeds only the sm_90 kernels (H100/H200), about 14 MB against the
# full library's 34: the device call carries at most 64 MiB with the checkout, so the full
# library leaves no room for build/cudacheck or for a second library to compare against.
# Usage: scripts/device_lib.sh OUT [TREE]
#   OUT   the library to write (put it under build/, which git ignores, and carry it)
#   TREE  the checkout to build (default: this one), e.g. a `git worktree` with a kernel
#         constant changed, to measure a variant beside main (GOSYM_LIBRARY=OUT on the device)
# Needs Go and the venv's NVRTC (make venv); the tree's kernels/prebuilt is left as it was.
set -euo pipefail
out=$(realpath -m "$1")
repo=$(cd "$(dirname "$0")/.." && pwd)
tree=$(cd "${2:-$repo}" && pwd)
nvrtc=${GOSYM_NVRTC:-$(ls "$(make -s -C "$repo" print-venv)"/lib/python3*/site-packages/nvidia/cu1*/lib/libnvrtc.so.1* | head -1)}
aside=$(mktemp -d)
# the tree's other images go aside (kernelgen removes what it was not asked for) and come back
# whatever happens; its sm_90 images stay, and kernelgen rebuilds them only if stale
trap 'mv "$aside"/*.img "$tree"/kernels/prebuilt/ 2>/dev/null; rm -rf "$aside"' EXIT
find "$tree"/kernels/prebuilt -name '*.img' ! -name '*.sm_90.img' -exec mv {} "$aside"/ \;
cd "$tree"
GOSYM_NVRTC=$nvrtc CGO_ENABLED=1 go run -trimpath ./gobackend/cmd/kernelgen -out kernels/prebuilt -targets sm_90
mkdir -p "$(dirname "$out")"
CGO_ENABLED=1 go build -trimpath -buildvcs=false -buildmode=c-shared -o "$out" ./cabi
rm -f "${out%.so}.h"
ls -l "$out"
