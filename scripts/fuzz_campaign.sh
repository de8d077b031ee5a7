#!/usr/bin/env bash
# The CPU fuzzer (tests/jobs/fuzz/fuzz_worker.py) over many seeds at shapes CI does not run:
# one host at worlds 2-8, and groups across simulated hosts (tests/jobs/hier/simhosts.py:
# network namespaces for two hosts where they can be made, host ids otherwise), threads 1-3,
# 2-5 random subgroups; one job at a time, a line per job in $out/summary, a job's log and
# result files kept where it failed. Session 31's campaigns found five bugs this way (one
# only with a CPU hog beside the jobs: HOG=1). Run from the repository root with the
# development venv's python on PATH or in PY:
#   scripts/fuzz_campaign.sh [host|hosts] [first seed] [jobs]
# e.g. scripts/fuzz_campaign.sh hosts 9500 36; a job's command is in its log's first line.
set -uo pipefail
cd "$(dirname "$0")/.."
kind=${1:-host} seed0=${2:-8300} jobs=${3:-28}
PY=${PY:-$(make -s print-venv)/bin/python}
out=${OUT_DIR:-/tmp/gosym-fuzz-campaign}
mkdir -p "$out"
shapes=(2,1 1,2 3,2 2,3 2,2,2 1,1,1 1,2,1 3,3 2,2 1,3 2,1,2 4,1)
hog=
if ((${HOG:-0})); then
	(while :; do :; done) &
	hog=$!
	trap 'kill $hog 2>/dev/null' EXIT
fi
failed=0
for i in $(seq 0 $((jobs - 1))); do
	seed=$((seed0 + i)) th=$((1 + (i / 7) % 3)) groups=$((2 + i % 4)) dir=$out/$seed
	mkdir -p "$dir"
	if [[ $kind == host ]]; then
		what="world $((2 + i % 7))"
		cmd=("$PY" -m torch.distributed.run --nproc-per-node $((2 + i % 7)) --master-port $((29800 + i % 7))
			tests/jobs/fuzz/fuzz_worker.py)
	else
		shape=${shapes[$((i % ${#shapes[@]}))]}
		what="hosts $shape"
		cmd=("$PY" tests/jobs/hier/simhosts.py --hosts "$shape" -- "$PY" tests/jobs/fuzz/fuzz_worker.py)
	fi
	args=(--seed "$seed" --ops "${OPS:-400}" --threads "$th" --groups "$groups" --timeout 120)
	start=$(date +%s)
	echo "${cmd[*]} ${args[*]}" >"$dir/log"
	GOSYM_TEST_OUT=$dir PYTHONPATH=python:tests/jobs/common timeout 900 "${cmd[@]}" "${args[@]}" >>"$dir/log" 2>&1
	rc=$?
	line="$what seed $seed threads $th groups $groups: exit $rc, $(($(date +%s) - start)) s"
	if ((rc)); then
		failed=$((failed + 1))
		line+=" $(grep -h 'fuzz seed' "$dir/log" | grep -v ' 0 failed' | head -1)"
	else
		rm -rf "$dir"
	fi
	echo "$line" | tee -a "$out/summary"
done
echo "$((jobs - failed)) of $jobs jobs passed ($out/summary)"
((failed == 0))
