#!/usr/bin/env bash
# coldtest.sh [RUNS]: runs `make test` (as .ci/run does) RUNS times (default 1) on fresh
# clones of HEAD with cold caches, beside BUSY busy-looping processes (default 2: "a
# background load of two busy cores"), and prints for each run its result, wall time, peak
# summed RSS (scripts/peakrss.sh) and the load average seen during it.
#
# Cold: each run gets its own empty XDG_CACHE_HOME, so the Go build cache, staticcheck's
# cache and the tokenizer tests' npm packages start empty; the Go module cache, the
# tools `make tools` installs into GOPATH/bin and the Debian packages stay (a CI image
# holds them). Logs go to OUT (default a temporary folder, printed): runN.txt the run's
# output, runN.peak the processes at its peak RSS (scripts/peakrss.sh's PEAKRSS_LOG).
#
# Each run also samples, once a second, the threads the machine has runnable
# (/proc/stat's procs_running, less the busy loops and the sampler): the average is how
# many threads make test kept ready to run, which decides its share of the two cores
# beside the busy loops (each runnable thread gets an equal share). runN.threads holds
# the samples, "SECONDS THREADS" a line.
set -uo pipefail
runs=${1:-1}
busy=${BUSY:-2}
root=$(git rev-parse --show-toplevel)
out=${OUT:-$(mktemp -d)}
mkdir -p "$out" || exit 1
echo "coldtest: $runs run(s) of make test beside $busy busy loop(s); logs in $out"
pids=()
for ((i = 0; i < busy; i++)); do
	bash -c 'while :; do :; done' &
	pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
# loops_cpu: the busy loops' CPU time so far, in clock ticks.
loops_cpu() {
	local p t=0
	for p in "${pids[@]}"; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat"))); done
	echo $t
}
hz=$(getconf CLK_TCK)
fail=0
for ((r = 1; r <= runs; r++)); do
	work=$(mktemp -d)
	git clone -q "$root" "$work/kvindex"
	ln -s "$(cd "$root/.." && pwd)/shared" "$work/shared" 2>/dev/null || true
	mkdir -p "$work/cache"
	(while :; do cut -d' ' -f1 /proc/loadavg; sleep 30; done) >"$out/load$r.txt" &
	sampler=$!
	(
		# The shell's own read and clock: one process (sleep) a second.
		printf -v t0 '%(%s)T' -1
		while :; do
			while read -r key n _; do [ "$key" = procs_running ] && break; done </proc/stat
			printf -v now '%(%s)T' -1
			echo "$((now - t0)) $((n - busy - 1))"
			sleep 1
		done
	) >"$out/run$r.threads" &
	threads=$!
	before=$(loops_cpu)
	t0=$(date +%s)
	(cd "$work/kvindex" && XDG_CACHE_HOME="$work/cache" GOCACHE="$work/cache/go-build" CI=true PEAKRSS_LOG="$out/run$r.peak" \
		bash scripts/peakrss.sh .ci/run) >"$out/run$r.txt" 2>&1
	rc=$?
	wall=$(($(date +%s) - t0))
	loops=$((($(loops_cpu) - before) / hz))
	kill "$sampler" "$threads" 2>/dev/null
	loads=$(sort -n "$out/load$r.txt" | sed -n '1p;$p' | paste -sd- -)
	ready=$(awk '{ s += ($2 > 0 ? $2 : 0); n++ } END { if (n) printf "%.1f", s / n }' "$out/run$r.threads")
	echo "run $r: exit $rc; $(grep '^peakrss:' "$out/run$r.txt" | tail -1); load average $loads; $ready threads runnable on average; the busy loops took $loops s of CPU in $wall s (what was left: $(awk -v c="$(nproc)" -v w="$wall" -v l="$loops" 'BEGIN { printf "%.2f", (c * w - l) / w }') cores)"
	grep -E '^==> .*(ok|FAIL)' "$out/run$r.txt"
	[ $rc = 0 ] || fail=1
	rm -rf "$work"
done
exit $fail
