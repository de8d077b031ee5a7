#!/usr/bin/env bash
# One call on the 2-GPU machine for the CUDA data plane: the GPU pytest suite
# (tests/jobs/cuda/test_cuda.py: every collective against NCCL, graphs, DDP), then
# python -m gosym.bench --device cuda, eager and CUDA-graph captured, gosym
# against NCCL and PyTorch symmetric memory. Carry python/gosym/libgosym.so
# (built here; the device has no Go) and, for the checker, build/cudacheck; for conform,
# build/pydeps (make pydeps: expecttest, which torch's suite imports). The full library and
# build/cudacheck together pass the call's 64 MiB: carry scripts/device_lib.sh's sm_90-only
# library instead (it also lets a kernel variant's library ride beside main's).
# Refuses to run anything unless the multicast safety variables are set. Do not wrap it in
# `timeout`: bash runs its TERM trap (which packs $out) only once the running step returns,
# and `timeout` signals the script alone, so a cut-off call returned nothing (session 29);
# the device's own limit signals the whole process group, and each step has its own limit.
# GOSYM_TEST_RANKS_PER_GPU=k (tests/README.md) runs the GPU jobs at k ranks per GPU.
# Usage: scripts/device_cuda.sh [c10d] [small] [warm] [check] [nvswitch] [fuzz-seeds] [fuzz-hosts] [fuzz-slow] [test] [clients] [hier] [fuzz] [conform] [hostbench] [cpuhostbench] [cpubench] [foldbench] [flatcost] [switchcost] [cpuhostprofile] [contact-probe] [lost-probe] [defer-probe] [sync-probe] [queue-probe] [callcost] [drivercost] [pdl] [graphab] [step] [variants] [bench] [batch] [graph] [tune] [ll] [moves] [overlap] [a2av] [vmm] [expandable] [sanitize] [sanitize-quick] [probe] [pinned] [host]
# (default: check test bench graph sanitize)
set -uo pipefail
cd "$(dirname "$0")/.."
for kv in NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1; do
	name="${kv%%=*}" want="${kv#*=}"
	[[ "${!name-}" == "$want" ]] || { echo "REFUSING: $name=${!name-<unset>}, need $want" >&2; exit 2; }
done
export PYTHONPATH=python PYTHONUNBUFFERED=1
# Everything is written under $out; the device tool returns at most 8 files, so with $OUT set
# (the device tool's folder) $out is packed into one $OUT/device-out.tgz on exit, a step cut off
# by the call's limit (SIGTERM) included.
out=/tmp/gosym-device
mkdir -p "$out"
pack() { [[ -n ${OUT-} ]] && tar czf "$OUT/device-out.tgz" -C "$out" . 2>/dev/null; }
trap pack EXIT
trap 'exit 143' TERM INT
steps=("$@")
summary=() # repeated at the end: the device returns only the output's tail
# rows: a bench table cut to size, latency, baseline, ratio and check (and its failures)
# GOSYM_CPUHOST_ENV's setting $1 ("default", or NAME=VALUE joined by +): $extra, the env
# words, and $tag, the file names' part for it
setting() {
	tag="" extra=()
	[[ $1 == default ]] || { tag="-${1//[^A-Za-z0-9]/-}"; IFS=+ read -ra extra <<<"$1"; }
}
# the CPU benches' ops and sizes (cpuhostbench, cpubench)
cpu_ops=${GOSYM_CPUHOST_OPS:-all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast,all_to_all_single}
cpu_sizes=${GOSYM_CPUHOST_SIZES:-1K,4K,16K,64K,256K,1M,4M,16M,64M}
# the skewed all_to_all's mode $1 (host: agreed on the host; pull, push, push64: the paced
# kernel, push64 in a 64 MiB staging; a suffix -nbN: N blocks per pair, 64 without) as $nb,
# $push and $stage, the values of GOSYM_GPU_A2AV_BLOCKS, GOSYM_GPU_A2AV_PUSH and
# GOSYM_GPU_STAGE_BYTES
a2av_mode() {
	nb=64 push=0 stage=$((32 << 20))
	[[ $1 == *-nb* ]] && nb=${1##*-nb}
	[[ $1 == host ]] && nb=0
	[[ $1 == push* ]] && push=1
	[[ $1 == push64 ]] && stage=$((64 << 20))
}
# the ranks the GPU jobs may place: the GPUs times GOSYM_TEST_RANKS_PER_GPU
slots() { echo $(($(nvidia-smi -L | wc -l) * ${GOSYM_TEST_RANKS_PER_GPU:-1})); }
rows() { grep -E "^[a-z_]+ +[0-9]+[KMG]? |CORRECTNESS|^error" | awk '/^[a-z_]+ /{print $2, $3, $4, $5, $NF; next} {print}'; }
((${#steps[@]})) || steps=(check test bench graph sanitize)
nvidia-smi -L
for s in "${steps[@]}"; do
	case "$s" in
	check)
		echo "== cudacheck"
		timeout 200 scripts/gpu_check.sh >"$out/gpu_check.out" 2>&1
		rc=$?
		echo "exit $rc"; grep -E "FAIL|passed|failed" "$out/gpu_check.out" | tail -15
		summary+=("cudacheck: exit $rc, $(grep -E "passed|failed" "$out/gpu_check.out" | tail -1)") ;;
	warm)
		# two ranks compile the kernels into the cache (NVRTC, about a minute) before many do at once
		echo "== warm the kernel cache"
		timeout 200 torchrun --nproc-per-node 2 scripts/sanitize_cuda.py ops 2>&1 | tail -3 ;;
	clients)
		# real clients (FSDP2, DTensor, DDP, pipelining, DCP, compile) against NCCL, one pytest
		# per world (GOSYM_CLIENTS_WORLDS, default every GPU world here), each within its own limit;
		# the outcomes of each world land in $out as soon as its jobs end
		ngpu=$(slots)
		for w in ${GOSYM_CLIENTS_WORLDS:-$(seq 2 "$ngpu")}; do
			((w > ngpu)) && continue
			echo "== pytest tests/jobs/clients/test_clients.py -k cuda-w$w-"
			lim=${GOSYM_CLIENTS_S:-520} # world 3 on 4xH200 took 410 s (session 22)
			GOSYM_TEST_OUT=$out timeout "$lim" python3 -m pytest -q -rfE --timeout=$((lim - 10)) -p no:cacheprovider \
				tests/jobs/clients/test_clients.py -k "cuda-w$w-" --junitxml="$out/clients-w$w.xml" 2>&1 | tail -30 | tee /tmp/gosym-pytest.tail
			summary+=("clients w$w: $(tail -1 /tmp/gosym-pytest.tail)")
		done ;;
	hier | fuzz)
		# two simulated hosts of half the GPUs each, NCCL between them; or the fuzzer's random
		# programs on CUDA tensors (every GPU, and across two simulated hosts)
		sel=(tests/jobs/hier/test_hier.py -k "cuda and not fuzz" tests/jobs/conformance/test_conformance.py)
		[[ $s == fuzz ]] && sel=(tests/jobs/fuzz/test_fuzz.py tests/jobs/hier/test_hier.py -k "fuzz and cuda")
		if [[ $s == hier ]] && (($(nvidia-smi -L | wc -l) >= 4)); then
			# two of the GPUs alone: two simulated hosts of one GPU each (the 2-GPU kind's case)
			echo "== pytest tests/jobs/hier/test_hier.py -k cuda_across_hosts on GPUs 0,1 (2 hosts x 1 GPU)"
			CUDA_VISIBLE_DEVICES=0,1 timeout 300 python3 -m pytest -q -rfE --timeout=280 -p no:cacheprovider \
				tests/jobs/hier/test_hier.py -k cuda_across_hosts --junitxml="$out/hier-2x1.xml" 2>&1 | tail -20 | tee /tmp/gosym-pytest.tail
			summary+=("hier 2x1: $(tail -1 /tmp/gosym-pytest.tail)")
		fi
		echo "== pytest ${sel[*]}"
		timeout 560 python3 -m pytest -q -rfE --timeout=540 -p no:cacheprovider "${sel[@]}" \
			--junitxml="$out/$s.xml" 2>&1 | tail -40 | tee /tmp/gosym-pytest.tail
		summary+=("$s: $(tail -1 /tmp/gosym-pytest.tail)") ;;
	conform)
		# torch's own suite, NCCL's selection, NCCL and gosym, at world 2 and (4 GPUs) world 4, or
		# at the worlds GOSYM_CONFORM_WORLDS names (one call per world where both do not fit):
		# every run in shards, all at once on shared GPUs (outcomes are written test by test, so
		# a shard cut off at the limit keeps what it finished), then merged and compared
		[[ -d build/pydeps ]] && export PYTHONPATH=$PYTHONPATH:build/pydeps
		if ! python3 -c "import expecttest" 2>/dev/null; then
			# torch's suite imports it and this machine has no network (session 24 lost a call)
			echo "conform: torch's suite needs expecttest: run 'make pydeps' and carry build/pydeps"
			summary+=("conform: not run, no expecttest (carry build/pydeps)")
			continue
		fi
		# at world 4 on 4xH200, gosym's shards finished 253 of its 281 tests in 470 s with 3 shards
		# a backend (session 24) and 238 in 430 s with 6 (session 25: 48 ranks on 16 cores)
		ngpu=$(nvidia-smi -L | wc -l) shards=${GOSYM_CONFORM_SHARDS:-3} cf=/tmp/gosym-conform
		worlds=(2) && ((ngpu >= 4)) && worlds=(2 4)
		[[ -n ${GOSYM_CONFORM_WORLDS-} ]] && read -ra worlds <<<"$GOSYM_CONFORM_WORLDS"
		# GOSYM_CONFORM_K_FILE: a file holding a -k pattern (a rerun of some tests)
		sel=() && [[ -n ${GOSYM_CONFORM_K_FILE-} ]] && sel=(-k "$(<"$GOSYM_CONFORM_K_FILE")")
		mkdir -p $cf
		# a cold kernel cache costs each rank's first CUDA op a minute of NVRTC under this load,
		# past the suite's 60 s group timeout: two ranks fill it first
		timeout 200 torchrun --nproc-per-node 2 scripts/sanitize_cuda.py ops >$cf/warm.log 2>&1
		# GOSYM_CONFORM_BACKENDS=gosym: gosym's shards alone, compared with NCCL's committed
		# outcomes (tests/jobs/conformance/expected/nccl-cuda-w*.json): NCCL's do not change
		# with gosym's commits, and half the ranks finish more of the suite in a call
		read -ra backends <<<"${GOSYM_CONFORM_BACKENDS:-nccl gosym}"
		echo "== torch's distributed suite on CUDA, worlds ${worlds[*]}, ${backends[*]}, $shards shards each"
		for w in "${worlds[@]}"; do
			for b in "${backends[@]}"; do
				for ((i = 0; i < shards; i++)); do
					first=$(((i * w) % ngpu))
					((first + w > ngpu)) && first=0
					CUDA_VISIBLE_DEVICES=$(seq -s, $first $((first + w - 1))) timeout "${GOSYM_CONFORM_S:-480}" \
						python3 tests/jobs/conformance/run_dist_suite.py --device cuda --backend $b --world $w \
						--shard $i/$shards "${sel[@]}" --test-timeout 120 --json $cf/$b-w$w-$i.json >$cf/$b-w$w-$i.log 2>&1 &
				done
			done
		done
		wait
		for w in "${worlds[@]}"; do
			for b in "${backends[@]}"; do
				against=() && [[ $b == gosym && -f $out/conform-nccl-w$w.json ]] && against=(--against "$out/conform-nccl-w$w.json")
				python3 tests/jobs/conformance/run_dist_suite.py --device cuda --backend $b --world $w \
					--outcomes $cf/$b-w$w-*.json --json "$out/conform-$b-w$w.json" "${against[@]}" 2>&1 |
					grep -v "^note:" | tee $cf/$b-w$w-merged.log | tail -60
				summary+=("conform $b w$w: $(grep -E "^$b \(cuda" $cf/$b-w$w-merged.log)")
			done
		done
		tar czf "$out/conform-logs.tgz" -C $cf . ;;
	hostbench)
		# two simulated hosts of half the GPUs each (at most 2): gosym (the choice table's
		# schedule), always hierarchical (gosym-hier: inside a host gosym, NCCL between) and
		# always flat (gosym-flat), against flat NCCL over the same ranks (NCCL sees two hosts
		# too). gosym-hier and gosym-flat of the JSON are what scripts/hier_table.py takes.
		# three runs (GOSYM_HOSTBENCH_RUNS), about 75 s each on 4xH200: one run's points
		# differ by up to 25% between two backends on the same path (session 26), and the
		# table takes the median of several files (scripts/hier_table.py)
		per=$(($(nvidia-smi -L | wc -l) >= 4 ? 2 : 1))
		for i in $(seq 1 "${GOSYM_HOSTBENCH_RUNS:-3}"); do
			echo "== bench across two simulated hosts, $per GPU(s) each, run $i: gosym, gosym-hier, gosym-flat against flat NCCL"
			timeout 180 python3 tests/jobs/hier/simhosts.py --hosts $per,$per --gpus -- python3 -m gosym.bench --device cuda \
				--backends gosym,gosym-hier,gosym-flat,nccl --batch 10 --ops all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast,all_to_all_single \
				--sizes 1K,4K,16K,64K,256K,1M,4M,16M,64M --target-time 0.05 --json "$out/bench-hier-cuda-${per}x2-run$i.json" 2>&1 | tail -50
		done ;;
	cpuhostbench)
		# CPU tensors across hosts told apart by id (IdHosts: this machine has no `ip`), on this
		# quiet many-core host: gosym-hier (gosym inside a host, Gloo between), gosym-flat (Gloo
		# over every rank through gosym) and a plain Gloo group, for each shape of
		# GOSYM_CPUHOST_SHAPES ("ranks per host, comma-joined:runs", space-separated): the CPU
		# entries of the choice's table (scripts/hier_table.py), which the 2-core VM, its ranks
		# fighting for two cores, cannot measure; the backends take turns (GOSYM_CPUHOST_INTERLEAVE)
		echo "== what each step of an op across two hosts of 2 ranks costs (scripts/hier_steps.py)"
		((${GOSYM_HIER_STEPS:-1})) && GOSYM_HIER_CHOICE=hier timeout 200 python3 tests/jobs/hier/simhosts.py --hosts 2,2 -- python3 scripts/hier_steps.py \
			--sizes 64K,1M,4M,16M --json "$out/hier-steps-cpu-2x2-idhosts.json" 2>&1 | grep -v socket.cpp | tail -70
		# GOSYM_CPUHOST_OPS and _SIZES narrow the bench; GOSYM_CPUHOST_ENV (space-separated
		# NAME=VALUE, each a job of its own, its value in the file name) sweeps a setting
		for spec in ${GOSYM_CPUHOST_SHAPES:-2,2:3 4,4:1}; do
			h=${spec%%:*} runs=${spec##*:}
			name=$(python3 -c "import sys; c=sys.argv[1].split(','); print(f'{len(c)}x{c[0]}' if len(set(c)) == 1 else '+'.join(c))" "$h")
			for setting in ${GOSYM_CPUHOST_ENV:-default}; do
				setting "$setting"
				for i in $(seq 1 "$runs"); do
					echo "== CPU bench across hosts of $h ranks ($name, told apart by id) $setting, run $i: gosym-hier, gosym-flat, gloo"
					env "${extra[@]}" timeout 480 python3 tests/jobs/hier/simhosts.py --hosts "$h" -- python3 -m gosym.bench --device cpu \
						--backends gosym-hier,gosym-flat,gloo --ops "$cpu_ops" \
						--sizes "$cpu_sizes" --target-time 0.3 --min-iters 5 --interleave "${GOSYM_CPUHOST_INTERLEAVE:-5}" \
						--json "$out/bench-hier-cpu-$name-idhosts$tag-run$i.json" 2>&1 | tail -48
				done
			done
		done ;;
	cpubench)
		# CPU tensors on one host of 2 and of 4 ranks (the hosts of cpuhostbench's shapes), on
		# this quiet many-core host: gosym against gloo, GOSYM_CPUHOST_OPS / _SIZES / _ENV as there
		for setting in ${GOSYM_CPUHOST_ENV:-default}; do
			setting "$setting"
			for n in 2 4; do
				echo "== CPU bench on one host of $n ranks $setting: gosym, gloo"
				env "${extra[@]}" timeout 240 python3 -m gosym.bench --device cpu --nproc "$n" --backends gosym,gloo \
					--ops "$cpu_ops" \
					--sizes "$cpu_sizes" --target-time 0.3 --min-iters 5 \
					--json "$out/bench-cpu-1x$n$tag.json" 2>&1 | grep -E "^[a-z_]+ +[0-9]"
			done
		done ;;
	foldbench)
		# the across-hosts fold (scripts/fold_bench.py): the engine's loops against torch's ops,
		# 4 processes folding at once (a host's ranks), torch's threads as a launcher other than
		# torchrun leaves them (one per core) and as torchrun sets them (1)
		for tt in 0 1; do
			for h in 2 3; do
				echo "== fold of $h hosts' buffers, 4 processes, torch threads ${tt/#0/left}"
				timeout 120 python3 scripts/fold_bench.py --procs 4 --hosts $h --sizes 64K,512K,4M,16M,64M \
					--torch-threads $tt --json "$out/foldbench-h$h-t$tt.json" 2>&1 | tail -6
			done
		done ;;
	flatcost)
		# what gosym adds to a host op across hosts that the choice runs flat (Gloo's own op:
		# scripts/hier_flat_cost.py): against a do-nothing C++ group at 1+1 hosts, and the real
		# op against a plain Gloo group at the shapes of GOSYM_FLATCOST_HOSTS (space-separated),
		# both the C++ backend's (gosym._c10d.Hier) and the Python group's
		echo "== gosym's flat path over a do-nothing C++ group, 1+1 hosts"
		GOSYM_HIER_CHOICE=flat timeout 150 python3 tests/jobs/hier/simhosts.py --hosts 1,1 -- python3 scripts/hier_flat_cost.py \
			--json "$out/hier-flat-cost-1x1.json" 2>&1 | grep "^rank 0" | grep -v paths
		for h in ${GOSYM_FLATCOST_HOSTS:-2,2 4,4}; do
			echo "== gosym's flat op over a plain Gloo group, hosts of $h ranks"
			GOSYM_HIER_CHOICE=flat timeout 200 python3 tests/jobs/hier/simhosts.py --hosts "$h" -- python3 scripts/hier_flat_cost.py \
				--gloo --json "$out/hier-flat-cost-gloo-${h//,/x}.json" 2>&1 | grep "^rank 0" | grep -v paths
		done ;;
	switchcost)
		# what a small host op across hosts pays for the ops before it on other groups
		# (scripts/switch_cost.py), at the shapes of GOSYM_FLATCOST_HOSTS
		for h in ${GOSYM_FLATCOST_HOSTS:-2,2 4,4}; do
			echo "== a Gloo broadcast of 1 KiB after other groups' ops, hosts of $h ranks"
			GOSYM_HIER_CHOICE=hier timeout 200 python3 tests/jobs/hier/simhosts.py --hosts "$h" -- python3 scripts/switch_cost.py \
				--trials 500 --json "$out/switch-cost-${h//,/x}.json" 2>&1 | grep -E " us$"
		done ;;
	lost-probe)
		# a rank lost on CUDA across hosts (hier_worker's scenario die), one job per shape of
		# GOSYM_LOST_HOSTS (default "2,2 1,1"), the victim the second host's first rank, the
		# rails' chunks of GOSYM_LOST_CHUNK bytes (default 4096, test_hier's; "" the default
		# chunk): what each survivor raised and when, and whether an inner group's abort hung
		# (session 50, 4 ranks on one H200, GOSYM_TEST_RANKS_PER_GPU=4 as on any one GPU: at 2,2
		# the first host's rank of the victim's peer's rail waited past the group's timeout,
		# its rail's NCCL abort hung; 1,1 passed)
		for h in ${GOSYM_LOST_HOSTS:-2,2 1,1}; do
			victim=${h%%,*}
			log=$out/lost-${h//,/x}.log
			mkdir -p "$out/lost-${h//,/x}"
			chunk=() && [[ -n ${GOSYM_LOST_CHUNK-4096} ]] && chunk=("GOSYM_HIER_CHUNK=${GOSYM_LOST_CHUNK-4096}")
			echo "== hosts $h, victim $victim, die in a loop of all_reduces (${chunk[*]:-the default chunk})"
			env "${chunk[@]}" GOSYM_HIER_RAIL_MIN=4096 GOSYM_HIER_CHOICE=hier GOSYM_HIER_REPORT_S=8 GOSYM_TEST_OUT="$out/lost-${h//,/x}" \
				PYTHONPATH=python:tests/jobs/common:tests/jobs/hier:tests/jobs/collectives \
				timeout 100 python3 tests/jobs/hier/simhosts.py --hosts "$h" --gpus --timeout 85 -- python3 tests/jobs/hier/hier_worker.py \
				--backend gosym --hosts "$h" --device cuda --scenario die --victim "$victim" --timeout 60 >"$log" 2>&1
			echo "exit $?"
			grep -E "hier die:|named within|names the lost rank|scenario step 3|NCCL work across|abort timed out" "$log" | cut -c1-260 | head -14
		done ;;
	contact-probe)
		# does a pair's first CUDA send wait for a kernel of this process spinning on another
		# peer? (scripts/first_contact_probe.py; session 51's hang of the conformance batch
		# across 2 x 2 hosts): NCCL alone, then gosym across hosts; 4 ranks (GPUs times
		# GOSYM_TEST_RANKS_PER_GPU); contact_s near delay_s on rank 0 means it waited
		# variants: any long kernel (sleep), a gosym receive beside NCCL's world group (gosym),
		# and the same with the world's communicator made at init and the contact a batch
		# (only the pair's connection new)
		for v in "" "--spin sleep" "--spin gosym" "--spin gosym --eager --contact batch"; do
			echo "== first contact while a receive spins: NCCL alone (torchrun, 4 ranks) ${v:-}"
			timeout 90 torchrun --nproc-per-node 4 scripts/first_contact_probe.py --backend nccl --delay 8 $v 2>&1 \
				| grep -E '^\{|Error|error' | cut -c1-300 | head -12
		done
		# CUDA_DEVICE_MAX_CONNECTIONS=32: the device's work queues that streams share (8 by
		# default); a stream sharing one with the spinning kernel's would wait behind it
		for e in "" "CUDA_DEVICE_MAX_CONNECTIONS=32"; do
			echo "== the same on gosym across 2 x 2 simulated hosts ${e:-}"
			env $e PYTHONPATH=python:tests/jobs/common GOSYM_TEST_OUT="$out/contact" timeout 90 python3 tests/jobs/hier/simhosts.py --hosts 2,2 --gpus --timeout 80 -- \
				python3 scripts/first_contact_probe.py --backend gosym --delay 8 2>&1 | grep -E '^\{|Error|error' | cut -c1-300 | head -12
		done ;;
	cpuhostprofile)
		# where an op across hosts spends its time, in place (scripts/hier_profile.py,
		# GOSYM_PROFILE_OPS: op:sizes, space-separated), on the hierarchical schedule, on hosts of
		# GOSYM_PROFILE_HOSTS (ranks per host, space-separated shapes; default 2,2)
		for h in ${GOSYM_PROFILE_HOSTS:-2,2}; do
			for spec in ${GOSYM_PROFILE_OPS:-all_reduce:1M,4M broadcast:4K}; do
				echo "== profile of ${spec%%:*} at ${spec##*:} across hosts of $h ranks (hierarchical)"
				GOSYM_HIER_CHOICE=hier timeout 200 python3 tests/jobs/hier/simhosts.py --hosts "$h" -- python3 scripts/hier_profile.py \
					--op "${spec%%:*}" --sizes "${spec##*:}" --timeline 2 --out "$out/profile-${h//,/x}" 2>&1 | grep -v socket.cpp | head -70
			done
		done ;;
	step)
		# an FSDP2 step of a 1.07 B-parameter model (bf16), gosym against NCCL in one job
		echo "== FSDP2 step (gosym.stepbench)"
		timeout 300 python3 -m gosym.stepbench --device cuda --json "$out/stepbench.json" 2>&1 | tail -8 ;;
	defer-probe)
		# GOSYM_GPU_DEFER=1 hung an FSDP2 step on 4xH200 (sessions 25 and 26): the step under
		# eager module loading, under lazy loading with the engine's debug log, and with 32
		# hardware queues (CUDA_DEVICE_MAX_CONNECTIONS); a rank still running near the limit
		# prints its threads' stacks (stepbench --timeout). sync-probe and queue-probe ask the
		# driver's questions alone, on one GPU.
		echo "== FSDP2 step, GOSYM_GPU_DEFER=1, CUDA_MODULE_LOADING=EAGER"
		GOSYM_GPU_DEFER=1 CUDA_MODULE_LOADING=EAGER timeout 200 python3 -m gosym.stepbench --device cuda --timeout 180 \
			--json "$out/stepbench-defer-eager.json" >"$out/defer-eager.log" 2>&1
		tail -8 "$out/defer-eager.log"
		echo "== FSDP2 step, GOSYM_GPU_DEFER=1, lazy loading, GOSYM_DEBUG=1"
		GOSYM_GPU_DEFER=1 GOSYM_DEBUG=1 timeout 120 python3 -m gosym.stepbench --device cuda --timeout 100 \
			--json "$out/stepbench-defer-lazy.json" >"$out/defer-lazy.log" 2>&1
		grep -v "deferred: its caller\|ran (deferred" "$out/defer-lazy.log" | tail -60
		grep "deferred: its caller\|ran (deferred" "$out/defer-lazy.log" | tail -8
		echo "== FSDP2 step, GOSYM_GPU_DEFER=1, CUDA_DEVICE_MAX_CONNECTIONS=32"
		GOSYM_GPU_DEFER=1 CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 150 python3 -m gosym.stepbench --device cuda --timeout 130 \
			--json "$out/stepbench-defer-conn32.json" >"$out/defer-conn32.log" 2>&1
		grep -v "^  File\|no Python frame\|^Thread\|^$" "$out/defer-conn32.log" | tail -12 ;;
	sync-probe)
		# which driver calls wait for the device, or hold back another thread's launch, while
		# a stream waits for a host-written flag (scripts/syncprobe.py, no torch), under lazy
		# and eager module loading; one GPU
		# and again with the wait a kernel spinning on a pinned host word stored to with no
		# driver call (the kernel launched at the call: the way on)
		# (and with a driver call before that store)
		for w in "--wait stream" "--wait kernel" "--wait kernel --driver-first"; do
			for m in LAZY EAGER; do
				for c in $(python3 scripts/syncprobe.py --case list); do
					CUDA_MODULE_LOADING=$m timeout 40 python3 scripts/syncprobe.py $w --case "$c" 2>&1 | tail -1
				done
			done
		done | tee "$out/syncprobe.txt" ;;
	queue-probe)
		# does a stream waiting for a host-written flag hold back a stream made GAP streams
		# later (a shared hardware queue), at CUDA's default 8 queues and at 32
		# (scripts/streamwait_probe.py); one GPU
		for c in 8 32; do
			for g in 1 2 4 7 8 9 16 32; do
				CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 30 python3 scripts/streamwait_probe.py --gap $g 2>&1 | tail -1
			done
		done | tee "$out/streamwait_probe.txt" ;;
	c10d)
		# the group's C++ backend (gosym._c10d) for this machine's torch and Python: the device
		# has no venv of ours, so it is built here (g++, ~20 s); without it gosym runs its
		# Python group and says why
		echo "== python/gosym/build_c10d.py"
		timeout 200 python3 -P python/gosym/build_c10d.py 2>&1 | tail -5
		got=$(python3 -c "import gosym.c10d as c; print(c.module() is not None, c.why())" 2>&1 | tail -1)
		echo "gosym._c10d: $got"
		summary+=("c10d: $got") ;;
	small)
		# issue 35's small eager ops: all_reduce against symm_mem's one-shot and two-shot, the
		# other ops against NCCL, 40 and 1 per sample, on torch's C++ group (gosym._c10d) and on
		# the Python group (GOSYM_C10D=0), one job each
		for c in 1 0; do
			for b in 40 1; do
				echo "== small ops, GOSYM_C10D=$c, $b per sample"
				GOSYM_C10D=$c timeout 150 python3 -m gosym.bench --device cuda --ops all_reduce \
					--backends gosym,nccl,symm-1shot,symm-2shot --batch "$b" --sizes 1K,4K,16K,64K,256K,1M \
					--target-time 0.1 --json "$out/small-ar-c10d$c-b$b.json" 2>&1 | tail -12
				GOSYM_C10D=$c timeout 150 python3 -m gosym.bench --device cuda \
					--ops broadcast,all_gather_into_tensor,reduce_scatter_tensor,all_to_all_single \
					--backends gosym,nccl --batch "$b" --sizes 1K,16K,256K,1M \
					--target-time 0.1 --json "$out/small-ops-c10d$c-b$b.json" 2>&1 | tail -22
			done
		done ;;
	callcost)
		# the host cost of one small eager op, layer by layer (torch's wrapper, gosym's Python,
		# ctypes, Go, the driver), beside torch's do-nothing groups: one rank, then every GPU
		ngpu=$(nvidia-smi -L | wc -l)
		for w in $(printf "%s\n" 1 "$ngpu" | sort -un); do
			echo "== python -m gosym.callcost --device cuda --nproc $w"
			timeout 200 python3 -m gosym.callcost --device cuda --nproc "$w" \
				--json "$out/callcost-cuda-w$w.json" 2>&1 | tail -40 | tee /tmp/gosym-callcost.tail
			summary+=("callcost w$w: $(grep -E "all_reduce: gosym dist" /tmp/gosym-callcost.tail)")
		done ;;
	drivercost)
		# the floor under the native call: what each driver call of a small eager op costs
		# alone and in gosym's sequence, on torch's default (legacy) stream and a non-blocking one
		echo "== driver calls of one small op (scripts/driver_cost.cu)"
		nvcc -O2 -arch=sm_90 -o /tmp/driver_cost scripts/driver_cost.cu -lcuda &&
			timeout 120 /tmp/driver_cost "$out/driver-cost.json" | tee /tmp/gosym-drivercost.tail
		summary+=("drivercost: $(grep -E "^query \+ launch \+ record" /tmp/gosym-drivercost.tail)") ;;
	pdl)
		# what programmatic dependent launch saves a chain of small exchange kernels in a graph
		echo "== PDL probe (scripts/pdl_probe.cu)"
		nvcc -O2 -arch=sm_90 -o /tmp/pdl_probe scripts/pdl_probe.cu &&
			timeout 120 /tmp/pdl_probe "$out/pdl-probe.json" | tee /tmp/gosym-pdl.tail
		summary+=("pdl: $(tail -3 /tmp/gosym-pdl.tail | tr '\n' ';')") ;;
	graphab)
		# captured small ops of each library of GOSYM_AB_LIBS (colon-separated; default the one
		# GOSYM_LIBRARY names) under each setting of GOSYM_AB_ENVS (space-separated, as
		# GOSYM_CPUHOST_ENV: default, or NAME=VALUE joined by +), in turn, twice, at slots ranks:
		# a kernel or launch variant beside main's (scripts/device_lib.sh builds each; carry them)
		for run in 1 2; do
			IFS=: read -ra libs <<<"${GOSYM_AB_LIBS:-${GOSYM_LIBRARY:?graphab needs GOSYM_AB_LIBS or GOSYM_LIBRARY}}"
			for lib in "${libs[@]}"; do
				for s in ${GOSYM_AB_ENVS:-default}; do
					setting "$s"
					name=$(basename "$(dirname "$lib")")$tag
					echo "== captured, GOSYM_LIBRARY=$lib ${extra[*]}, run $run"
					env "${extra[@]}" GOSYM_LIBRARY="$lib" timeout 120 python3 -m gosym.bench --device cuda \
						--nproc "$(slots)" --cuda-graph 10 --ops all_reduce,reduce_scatter_tensor,all_gather_into_tensor \
						--backends gosym --sizes 1K,4K,16K,64K,256K --target-time 0.1 \
						$([[ $run == 2 ]] && echo --no-check) --json "$out/graphab-$name-$run.json" 2>&1 | rows
				done
			done
		done ;;
	nvswitch)
		# what SM push/pull and the copy engines move per pair, all-to-all and from one root
		echo "== NVSwitch copy probe (scripts/nvswitch_probe.cu)"
		nvidia-smi topo -m | head -$(($(nvidia-smi -L | wc -l) + 1))
		nvcc -O3 -arch=sm_90 -o /tmp/nvswitch_probe scripts/nvswitch_probe.cu &&
			timeout 200 /tmp/nvswitch_probe "${GOSYM_PROBE_MIB:-256}" | tee "$out/nvswitch_probe.txt" ;;
	fuzz-seeds)
		# the CUDA fuzzer at every GPU over GOSYM_FUZZ_SEEDS (default: 20 seeds from 1000), with
		# GOSYM_FUZZ_THREADS programs per rank (default: 1 and 2 by turns, each program on its
		# own streams: session 43's race in the staged broadcast showed only with two), one
		# job at a time (four jobs sharing the GPUs ran past a 60 s limit where one alone takes
		# about 10 s), then worlds 2 and 3 on the first GPUs over the CI seeds; with
		# GOSYM_TEST_RANKS_PER_GPU=k, k ranks a GPU (every GPU visible: the worker picks its own);
		# GOSYM_FUZZ_GROUPS subgroups besides the world (the worker's default 3)
		ngpu=$(slots) fz=$out/fuzz-seeds
		seeds=($(echo "${GOSYM_FUZZ_SEEDS:-$(seq -s, 1000 1019)}" | tr , " "))
		mkdir -p $fz
		runs=() && for sd in "${seeds[@]}"; do runs+=("$ngpu $sd"); done
		for w in 2 3; do ((w < ngpu)) && runs+=("$w 101" "$w 202"); done
		echo "== fuzzer on CUDA: ${#seeds[@]} seeds at world $ngpu, then worlds 2 and 3"
		i=0
		for run in "${runs[@]}"; do
			read -r w sd <<<"$run"
			th=${GOSYM_FUZZ_THREADS:-$((1 + i++ % 2))}
			mkdir -p $fz/w$w-$sd
			vis=$(seq -s, 0 $((w - 1)))
			((${GOSYM_TEST_RANKS_PER_GPU:-1} > 1)) && vis=$(seq -s, 0 $(($(nvidia-smi -L | wc -l) - 1)))
			CUDA_VISIBLE_DEVICES=$vis GOSYM_TEST_OUT=$fz/w$w-$sd PYTHONPATH=python:tests/jobs/common:tests/jobs/fuzz \
				timeout "${GOSYM_FUZZ_S:-90}" torchrun --nproc-per-node "$w" tests/jobs/fuzz/fuzz_worker.py --cuda --seed "$sd" \
				--ops "${GOSYM_FUZZ_OPS:-300}" --threads "$th" --groups "${GOSYM_FUZZ_GROUPS:-3}" \
				--timeout 60 >$fz/w$w-$sd.log 2>&1
			rc=$?
			echo "world $w seed $sd threads $th: exit $rc $(grep -h 'fuzz seed' $fz/w$w-$sd.log | head -1)"
			((rc == 0)) || grep -h "FAIL" $fz/w$w-$sd.log | head -3
		done | tee $out/fuzz-seeds.txt
		summary+=("fuzz-seeds: $(grep -c 'exit 0' $out/fuzz-seeds.txt) of ${#runs[@]} passed") ;;
	fuzz-hosts)
		# the CUDA fuzzer across two simulated hosts of half the GPU slots each, one job per seed
		# of GOSYM_FUZZ_SEEDS (default 303, test_cuda_fuzz_across_hosts's), each rank's every
		# step named as it begins (GOSYM_FUZZ_TRACE), every thread's Python stack and the
		# engine's goroutines at GOSYM_FUZZ_STACKS_S (default 150) of a job still running, the
		# job killed at GOSYM_FUZZ_S (default 240) by simhosts (its ranks with it), the whole
		# log in $out: what session 32 lacked when that test ran past its step's limit on 2xH200;
		# GOSYM_FUZZ_THREADS programs a rank, GOSYM_FUZZ_GROUPS subgroups (as fuzz-seeds)
		per=$(($(slots) / 2))
		for sd in $(echo "${GOSYM_FUZZ_SEEDS:-303}" | tr , " "); do
			log=$out/fuzz-hosts-$sd.log
			mkdir -p "$out/fuzz-hosts-$sd"
			GOSYM_FUZZ_TRACE=1 GOSYM_FUZZ_STACKS_S=${GOSYM_FUZZ_STACKS_S:-150} GOSYM_TEST_OUT=$out/fuzz-hosts-$sd \
				PYTHONPATH=python:tests/jobs/common:tests/jobs/fuzz:tests/jobs/hier \
				python3 tests/jobs/hier/simhosts.py --hosts "$per,$per" --gpus --timeout "${GOSYM_FUZZ_S:-240}" -- \
				python3 tests/jobs/fuzz/fuzz_worker.py --cuda --seed "$sd" --ops "${GOSYM_FUZZ_OPS:-300}" \
				--threads "${GOSYM_FUZZ_THREADS:-1}" --groups "${GOSYM_FUZZ_GROUPS:-3}" --timeout 60 >"$log" 2>&1
			rc=$?
			echo "hosts $per,$per seed $sd: exit $rc $(grep -h 'fuzz seed' "$log" | head -1)"
			((rc == 0)) || grep -hE "FAIL|illegal|rror:" "$log" | grep -v "should dump" | head -5
			for r in $(seq 0 $((2 * per - 1))); do
				echo "  rank $r last began: $(grep -h "fuzz rank $r: begins" "$log" | tail -1 | cut -c1-160)"
			done
		done | tee "$out/fuzz-hosts.txt"
		summary+=("fuzz-hosts: $(grep -c 'exit 0' "$out/fuzz-hosts.txt") passed") ;;
	fuzz-slow)
		# the CUDA fuzzer at every GPU (GPU slot), each step slower than 1 s named (where a run stalls)
		ngpu=$(slots)
		echo "== fuzzer on CUDA at world $ngpu, seed ${GOSYM_FUZZ_SEED:-101}, threads ${GOSYM_FUZZ_THREADS:-1}"
		mkdir -p /tmp/fuzz-slow
		GOSYM_FUZZ_SLOW_S=1 GOSYM_TEST_OUT=/tmp/fuzz-slow PYTHONPATH=python:tests/jobs/common:tests/jobs/fuzz timeout "${GOSYM_FUZZ_S:-240}" torchrun --nproc-per-node "$ngpu" \
			tests/jobs/fuzz/fuzz_worker.py --cuda --seed "${GOSYM_FUZZ_SEED:-101}" --ops "${GOSYM_FUZZ_OPS:-300}" \
			--threads "${GOSYM_FUZZ_THREADS:-1}" --backend "${GOSYM_FUZZ_BACKEND:-gosym}" --timeout 60 >/tmp/fuzz-slow/log 2>&1
		echo "exit $?"; grep -E "^fuzz rank|rror|FAIL" /tmp/fuzz-slow/log | tail -40
		cp /tmp/fuzz-slow/log "$out/fuzz-slow.log" ;;
	test)
		# one line per test into $out as it ends (a call cut off by its limit still says which
		# test ran last: session 30's world-4 run kept 13 progress dots and no name);
		# GOSYM_PYTEST_TIMEOUT bounds each test
		echo "== pytest tests/jobs/cuda/test_cuda*.py"
		timeout 480 python3 -m pytest -v -rfE --timeout="${GOSYM_PYTEST_TIMEOUT:-450}" -p no:cacheprovider tests/jobs/cuda/test_cuda*.py \
			${GOSYM_PYTEST_K:+-k "$GOSYM_PYTEST_K"} --junitxml="$out/test_cuda.xml" >"$out/test_cuda.log" 2>&1
		grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|Timeout" "$out/test_cuda.log" | tail -45 | tee /tmp/gosym-pytest.tail
		summary+=("pytest: $(tail -1 /tmp/gosym-pytest.tail)")
		# the workers' result files, flat (the device returns shallow trees only)
		find /tmp/pytest-of-*/ -name '*.json' 2>/dev/null | while read -r f; do
			cp "$f" "$out/result$(echo "${f#/tmp/pytest-of-*/}" | tr '/' '_')"
		done ;;
	bench)
		echo "== bench eager"
		timeout 400 python3 -m gosym.bench --device cuda --sizes 1K,4K,16K,64K,256K,1M,4M,16M,64M,256M \
			--target-time 0.1 --json "$out/bench-cuda-eager.json" --plot "$out/bench-cuda-eager.png" 2>&1 | tail -80 ;;
	sanitize | sanitize-quick)
		echo "== compute-sanitizer memcheck"
		if command -v compute-sanitizer >/dev/null || [[ -x /usr/local/cuda/bin/compute-sanitizer ]]; then
			cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
			# the quick parts first (gosym.empty buffers read in place, a view, expandable segments'
			# runs of pages): the ops part may run for minutes (sanitize-quick stops here). API
			# errors are not reported here: on expandable segments the engine's cuIpcGetMemHandle
			# fails by design (no legacy handle: it publishes a run of pages), and torch's own first
			# cuMemCreate fails under the sanitizer (it retries another way).
			GOSYM_GPU_DIRECT_MIN=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 200 torchrun --nproc-per-node 2 \
				--no-python "$cs" --tool memcheck --report-api-errors no --target-processes all --error-exitcode 9 --print-limit 20 \
				python3 scripts/sanitize_cuda.py vmm view paged 2>&1 | tail -12
			rc=${PIPESTATUS[0]}
			echo "sanitizer (gosym.empty buffers and runs of pages, direct) exit $rc"
			summary+=("memcheck (vmm view paged): exit $rc")
			[[ $s == sanitize-quick ]] && continue
			GOSYM_GPU_STAGE_BYTES=$((1 << 20)) timeout 300 torchrun --nproc-per-node 2 --no-python "$cs" --tool memcheck \
				--target-processes all --error-exitcode 9 --print-limit 20 python3 scripts/sanitize_cuda.py ops 2>&1 | tail -30
			echo "sanitizer exit ${PIPESTATUS[0]}"
			GOSYM_GPU_DIRECT_MIN=1 timeout 300 torchrun --nproc-per-node 2 --no-python "$cs" --tool memcheck \
				--target-processes all --error-exitcode 9 --print-limit 20 python3 scripts/sanitize_cuda.py ops 2>&1 | tail -30
			echo "sanitizer (direct path) exit ${PIPESTATUS[0]}"
		else
			echo "no compute-sanitizer on this machine"
		fi ;;
	variants)
		# what session 23 built and could not measure, side by side (40 ops per sample): all_reduce
		# on gs_arpush (GOSYM_GPU_AR_PUSH=1, checked against gloo) against two-shot and NCCL; the
		# broadcast push's blocks per chunk; and, where build/libgosym-tail.so exists (branch
		# try/copy-tail-predicated: make lib there, copy python/gosym/libgosym.so to it, carry it),
		# the predicated copy tail against this library on the copy-shaped ops
		B=(python3 -m gosym.bench --device cuda --batch 40 --target-time 0.05)
		echo "== all_reduce: two-shot and NCCL, then gs_arpush"
		timeout 150 "${B[@]}" --ops all_reduce --backends gosym,nccl --sizes 16M,64M,256M,1G --json "$out/var-ar.json" 2>&1 | rows
		GOSYM_GPU_AR_PUSH=1 timeout 150 "${B[@]}" --ops all_reduce --backends gosym --sizes 16M,64M,256M,1G \
			--json "$out/var-arpush.json" 2>&1 | rows
		for g in 16 24 32; do
			echo "== broadcast, GOSYM_GPU_RELAY_BLOCKS=$g"
			GOSYM_GPU_RELAY_BLOCKS=$g timeout 100 "${B[@]}" --ops broadcast --backends gosym --sizes 8M,16M,64M,256M \
				--no-check --json "$out/var-bcast-$g.json" 2>&1 | rows
		done
		if [[ -f build/libgosym-tail.so ]]; then
			for lib in python/gosym/libgosym.so build/libgosym-tail.so; do
				echo "== copy-shaped ops, GOSYM_LIBRARY=$lib"
				GOSYM_LIBRARY=$lib timeout 150 "${B[@]}" --ops broadcast,all_gather_into_tensor,all_to_all_single \
					--backends gosym --sizes 4M,16M,64M --json "$out/var-lib-$(basename "$lib" .so).json" 2>&1 | rows
			done
		fi ;;
	batch)
		echo "== bench eager, 40 back-to-back ops per pair of CUDA events (the baselines' method)"
		timeout 400 python3 -m gosym.bench --device cuda --backends gosym,nccl,symm-2shot --batch 40 \
			--sizes 1K,4K,16K,64K,256K,1M,4M,16M,64M,256M --target-time 0.1 \
			--json "$out/bench-cuda-batch.json" --plot "$out/bench-cuda-batch.png" 2>&1 | tail -80 ;;
	tune)
		echo "== tunables (gosym alone, 40 ops per sample)"
		for cb in 64 128; do
			echo "-- GOSYM_GPU_COPY_BLOCKS=$cb"
			GOSYM_GPU_COPY_BLOCKS=$cb timeout 200 python3 -m gosym.bench --device cuda --backends gosym --batch 40 \
				--ops all_gather_into_tensor,broadcast,all_to_all_single,reduce_scatter_tensor --sizes 1M,4M \
				--target-time 0.05 --no-check --json "$out/tune-copyblocks-$cb.json" 2>&1 | tail -12
		done
		echo "-- host cost per call, layer by layer"
		timeout 200 python3 -m gosym.callcost --device cuda --nproc 2 --json "$out/callcost-tune.json" 2>&1 | tail -40 ;;
	ll)
		echo "== small all_reduce: LL kernel (default) against the one-shot (GOSYM_GPU_LL_MAX=0), gosym alone"
		for ll in 0 524288; do
			echo "-- GOSYM_GPU_LL_MAX=$ll, graph"
			GOSYM_GPU_LL_MAX=$ll timeout 200 python3 -m gosym.bench --device cuda --ops all_reduce --cuda-graph 10 \
				--backends gosym --sizes 1K,16K,64K,128K,256K,512K --target-time 0.05 --no-check \
				--json "$out/tune-ll-graph-$ll.json" 2>&1 | tail -9
			echo "-- GOSYM_GPU_LL_MAX=$ll, eager, 40 per sample"
			GOSYM_GPU_LL_MAX=$ll timeout 200 python3 -m gosym.bench --device cuda --ops all_reduce --batch 40 \
				--backends gosym --sizes 1K,16K,64K,128K,256K,512K --target-time 0.05 --no-check \
				--json "$out/tune-ll-batch-$ll.json" 2>&1 | tail -9
		done ;;
	moves)
		echo "== small data movement: the LL move kernel (default) against gs_copy (GOSYM_GPU_LL_MAX=0)"
		for ll in 0 262144; do
			echo "-- GOSYM_GPU_LL_MAX=$ll, eager, 40 per sample"
			GOSYM_GPU_LL_MAX=$ll timeout 200 python3 -m gosym.bench --device cuda --batch 40 \
				--ops broadcast,all_gather_into_tensor,all_to_all_single --backends gosym,nccl \
				--sizes 1K,16K,64K,256K --target-time 0.05 --no-check \
				--json "$out/moves-batch-$ll.json" 2>&1 | tail -14
			echo "-- GOSYM_GPU_LL_MAX=$ll, graph of 10"
			GOSYM_GPU_LL_MAX=$ll timeout 200 python3 -m gosym.bench --device cuda --cuda-graph 10 \
				--ops broadcast,all_gather_into_tensor,all_to_all_single,reduce_scatter_tensor --backends gosym,nccl \
				--sizes 1K,16K,64K,256K --target-time 0.05 --no-check \
				--json "$out/moves-graph-$ll.json" 2>&1 | tail -18
		done ;;
	overlap)
		# a copy-engine move's local piece on a second stream (GOSYM_GPU_CE_OVERLAP_MIN: 1 byte)
		# against one stream (2^62), on, off, on again in one call (session 36; the reports
		# scripts/gpu_table.py reads for the knob)
		echo "== the local piece beside the peers' on the copy engines, 10 per sample"
		for run in on-a off on-b; do
			chk=() && [[ $run != on-a ]] && chk=(--no-check)
			min=1 && [[ $run == off ]] && min=$((1 << 62))
			echo "-- GOSYM_GPU_CE_OVERLAP_MIN=$min ($run)"
			GOSYM_GPU_CE_OVERLAP_MIN=$min timeout 200 python3 -m gosym.bench --device cuda --backends gosym,nccl --batch 10 \
				--ops all_gather_into_tensor,all_to_all_single,all_to_all_single_skew --sizes 32M,64M,256M,1G \
				--target-time 0.1 "${chk[@]}" --json "$out/ce-overlap-$run.json" 2>&1 | rows
		done ;;
	a2av)
		# the skewed all_to_all: the host agreement (default) against the paced kernel
		# (GOSYM_GPU_A2AV_BLOCKS=64), pulling and pushing (GOSYM_GPU_A2AV_PUSH, session 37), and
		# pushing in a 64 MiB staging (four 256 KiB slots at two ranks before session 38, where
		# 32 MiB gave 128 KiB; with two slots a lane since, 32 MiB gives 256 KiB already);
		# GOSYM_A2AV_MODES picks some of them (default: all four)
		echo "== skewed all_to_all: host agreement, paced pulling, pushing, pushing in 64 MiB; 40 per sample to 64 MiB, 10 above"
		for run in a b; do
			for mode in ${GOSYM_A2AV_MODES:-host pull push push64}; do
				a2av_mode "$mode"
				chk=() && [[ $run == b ]] && chk=(--no-check)
				echo "-- $mode: GOSYM_GPU_A2AV_BLOCKS=$nb GOSYM_GPU_A2AV_PUSH=$push GOSYM_GPU_STAGE_BYTES=$stage ($run)"
				for part in "40 1K,64K,1M,4M,16M,64M" "10 256M,1G"; do
					GOSYM_GPU_A2AV_BLOCKS=$nb GOSYM_GPU_A2AV_PUSH=$push GOSYM_GPU_STAGE_BYTES=$stage timeout 200 \
						python3 -m gosym.bench --device cuda --batch "${part% *}" --ops all_to_all_single_skew \
						--backends gosym,nccl --sizes "${part#* }" --target-time 0.05 "${chk[@]}" \
						--json "$out/a2av-$mode-$run-b${part% *}.json" 2>&1 | rows
				done
			done
		done
		echo "-- graph of 10: host-agreed, paced pulling, paced pushing"
		for mode in host pull push; do
			a2av_mode "$mode"
			GOSYM_GPU_A2AV_BLOCKS=$nb GOSYM_GPU_A2AV_PUSH=$push timeout 200 python3 -m gosym.bench --device cuda \
				--cuda-graph 10 --ops all_to_all_single_skew --backends gosym,nccl --sizes 1K,64K,1M,4M \
				--target-time 0.05 --no-check --json "$out/tune-a2av-graph-$mode.json" 2>&1 | rows | sed "s/^/graph $mode /"
		done ;;
	vmm)
		echo "== large ops on gosym.empty buffers (gosym-bound: bound by fd, read in place) against torch tensors and NCCL, 40 per sample"
		for ubr in try no try no; do
			echo "-- GOSYM_ENABLE_UBR=$ubr (no: gosym.empty buffers staged, as before they could bind)"
			GOSYM_ENABLE_UBR=$ubr timeout 200 python3 -m gosym.bench --device cuda --batch 40 \
				--ops all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast,all_to_all_single \
				--backends gosym,gosym-bound,nccl --sizes 1M,4M,16M,64M,256M --target-time 0.05 \
				--json "$out/vmm-$ubr-$RANDOM.json" 2>&1 | tail -30
		done ;;
	expandable)
		echo "== torch's expandable segments (paged VMM memory, shared as runs of pages; GOSYM_ENABLE_UBR=no: staged as before)"
		echo "   against the default allocator, gosym and NCCL, 40 per sample"
		PYTHONPATH=python timeout 60 python3 scripts/probe_expandable.py >"$out/probe-expandable.json" 2>&1
		for run in True:try True:no False:try; do
			conf=expandable_segments:${run%:*} ubr=${run#*:}
			echo "-- PYTORCH_CUDA_ALLOC_CONF=$conf GOSYM_ENABLE_UBR=$ubr"
			PYTORCH_CUDA_ALLOC_CONF=$conf GOSYM_ENABLE_UBR=$ubr timeout 200 python3 -m gosym.bench --device cuda --batch 40 \
				--ops all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast,all_to_all_single \
				--backends gosym,nccl --sizes 1M,16M,64M,256M --target-time 0.05 \
				--json "$out/expandable-${run/:/-}.json" 2>&1 | grep -E "^[a-z_]+ +[0-9]+[KMG] |CORRECTNESS|^error" | cut -c1-70
		done ;;
	probe)
		echo "== NVLink probe (scripts/nvlink_probe.cu): SM loads/stores and copy engines, both GPUs at once"
		nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/nvlink_probe scripts/nvlink_probe.cu &&
			timeout 200 /tmp/nvlink_probe 2>&1 >"$out/nvlink-probe.json"
		echo "exit $?"
		:;;
	pinned)
		echo "== small all_reduce, eager 40 per sample, pinned 4 CPUs per rank against unpinned"
		for pin in 0 4 0 4; do
			timeout 200 python3 -m gosym.bench --device cuda --ops all_reduce --batch 40 --pin $pin \
				--backends gosym,nccl --sizes 1K,4K,64K,1M --target-time 0.1 --no-check \
				--json "$out/pinned-$pin-$RANDOM.json" 2>&1 | tail -6
		done ;;
	host)
		echo "== host cost per call: gosym's layers beside torch's do-nothing groups, then the other ops"
		timeout 200 python3 -m gosym.callcost --device cuda --nproc 2 --json "$out/callcost-cuda-w2.json" 2>&1 | tail -40
		timeout 200 torchrun --nproc-per-node 2 scripts/cuda_overhead.py --json "$out/overhead.json" 2>&1 | grep " us$" ;;
	graph)
		echo "== bench graph"
		timeout 300 python3 -m gosym.bench --device cuda --ops all_reduce --cuda-graph 10 \
			--backends gosym,nccl,symm-2shot --sizes 1K,4K,16K,64K,256K,1M,16M --target-time 0.1 \
			--json "$out/bench-cuda-graph.json" 2>&1 | tail -30 ;;
	esac
done
((${#summary[@]})) && printf '== summary\n' && printf '%s\n' "${summary[@]}"
exit 0
