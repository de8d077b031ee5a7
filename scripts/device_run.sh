#!/usr/bin/env bash
# One call on the GPU machine: the CUDA data plane check, then the CPU
# benchmark (gosym staged and bound against gloo, 2 ranks) on its idle cores.
# Carry build/cudacheck and python/gosym/libgosym.so (both built here; the
# device has no Go). The safety variables are checked by gpu_check.sh, which
# refuses to run anything without them.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=python PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
timeout 300 scripts/gpu_check.sh || echo "gpu_check exit $?"
for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS; do
	[[ -n "${!v-}" ]] || { echo "refusing: $v unset" >&2; exit 2; }
done
echo "== CPU benchmark, 2 ranks"
timeout 280 python3 -m gosym.bench --nproc 2 --json "$out/bench-cpu-device.json" 2>&1 | tail -60
