#!/usr/bin/env bash
# Device smoke test of the CUDA data plane (libcuda/NVRTC dispatch, the
# kernels of kernels/, VMM, stream memops), for the GPU machine.
#
# The GPU machine has no Go: build the checker first, from the repository
# root, on a machine that has Go (it needs only libc at run time):
#
#   CGO_ENABLED=1 go build -trimpath -buildvcs=false -o build/cudacheck ./gobackend/cmd/cudacheck
#
# then run this script there from the repository root, carrying build/cudacheck
# (build/ is git-ignored), on a 2-GPU machine to get the cross-GPU cases:
#
#   scripts/gpu_check.sh
#
# It prints nvidia-smi -L and the safety variables and stops with status 2,
# running nothing, unless NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# and NVSHMEM_DISABLE_NVLS=1 are all set. The checker itself never touches
# multicast (it only reads CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED). Results:
# one PASS/FAIL line per case, then $OUT/cudacheck.json and $OUT/gpu_check.log
# when $OUT is set. Exit status: the checker's (0 all passed, 1 a case failed,
# 2 unsafe environment or no CUDA, 3 timed out, or one case stuck past
# -case-timeout, 2 minutes: the report names it).
set -uo pipefail
cd "$(dirname "$0")/.."

bin="${GOSYM_CUDACHECK:-build/cudacheck}"
out="${OUT:-}"

echo "== machine"
date -u
uname -srm
if command -v nvidia-smi >/dev/null; then
	nvidia-smi -L
	nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv
else
	echo "nvidia-smi: not found"
fi

echo "== safety"
unsafe=0
for kv in NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1; do
	name="${kv%%=*}" want="${kv#*=}"
	have="${!name-<unset>}"
	echo "$name=$have (required: $want)"
	[[ "$have" == "$want" ]] || unsafe=1
done
echo "GOSYM_NVLS=${GOSYM_NVLS-<unset>} (not used: the checker never enables multicast)"
if ((unsafe)); then
	echo "REFUSING to run: a multicast safety variable is missing or changed" >&2
	exit 2
fi

echo "== checker"
if [[ ! -x "$bin" ]]; then
	echo "missing $bin; build it where Go is:" >&2
	echo "  CGO_ENABLED=1 go build -trimpath -buildvcs=false -o build/cudacheck ./gobackend/cmd/cudacheck" >&2
	exit 2
fi
ls -l "$bin"
echo "GOSYM_LIBCUDA=${GOSYM_LIBCUDA-<unset>} GOSYM_NVRTC=${GOSYM_NVRTC-<unset>}"
ls /usr/local/cuda/lib64/libnvrtc.so* 2>/dev/null || echo "no NVRTC in /usr/local/cuda/lib64"

args=(-timeout 7m)
if [[ -n "$out" ]]; then
	mkdir -p "$out"
	args+=(-json "$out/cudacheck.json")
fi
echo "== run: $bin ${args[*]}"
if [[ -n "$out" ]]; then
	timeout 560 "$bin" "${args[@]}" 2>&1 | tee "$out/gpu_check.log"
	rc=${PIPESTATUS[0]}
else
	timeout 560 "$bin" "${args[@]}"
	rc=$?
fi
echo "== exit status $rc"
exit "$rc"
