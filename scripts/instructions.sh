#!/usr/bin/env bash
# instructions.sh counts the instructions one pass of the bench package's event
# benchmark costs on the locked index, by cachegrind (valgrind): the benchmark run for
# two passes of the log minus one pass, so that loading the log, the benchmark's setup
# and its memory measurement cancel. A pass applies every event of the log to a fresh
# index, one call per event (events) or the peer drivers' coalesced calls (coalesced),
# as `kvindex bench --peers` times it. Instruction counts move far less than timings on
# a shared 2-core machine, but they do move between runs of one tree (the count takes
# in every thread of the process, and the runtime's own threads run for as long as the
# run takes; a build with fixed table seeds, not kept, spread as much): a per-event pass of the conversation trace read 196.3-201.4M in four runs
# of one tree, a coalesced pass 84.9-92.8M in eight. So the script counts RUNS passes
# (default 3) and prints each and their range: two versions of the event path differ
# only where their ranges do not overlap. Counts are not time (cache misses are not in
# them), so a change they favour is then timed beside the peers.
#
# usage: [RUNS=N] scripts/instructions.sh [events|coalesced]   (from the repository root;
#        the log is the bench package's: KVINDEX_CONFORMANCE=DIR, the folder holding
#        trace_conversation.jsonl, else ../shared/conformance, else the built-in workload)
#
# Needs valgrind (installed by scripts/apt-install.sh where missing). The Go runtime runs
# with one P and no collector, and without RDTSCP (which valgrind 3.19 does not decode).
set -euo pipefail
mode=${1:-events}
case $mode in
events) bench='BenchmarkEvents/impl=locked/producers=1$' ;;
coalesced) bench='BenchmarkEventsCoalesced/impl=locked$' ;;
*)
	sed -n '12,14p' "$0" >&2
	exit 2
	;;
esac
if ! command -v valgrind >/dev/null; then
	# shellcheck source=scripts/apt-install.sh
	. "$(dirname "$0")/apt-install.sh"
	apt_install instructions.sh valgrind valgrind || exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/bench.test" ./bench/
cd bench # (the benchmark finds ../../shared from its package's folder)
# The pass's length in events: the benchmark logs it.
n=$("$tmp/bench.test" -test.run '^$' -test.bench "$bench" -test.benchtime 1x -test.v 2>&1 |
	sed -n 's/.*: \([0-9][0-9]*\) events, .*/\1/p' | head -1)
[ -n "$n" ] || {
	echo "instructions.sh: no event count from $bench" >&2
	exit 1
}
total() { # total N: the instructions of the benchmark run for N events
	GOMAXPROCS=1 GOGC=off GODEBUG=cpu.rdtscp=off valgrind --tool=cachegrind --cache-sim=no \
		--cachegrind-out-file="$tmp/cg.$1" "$tmp/bench.test" -test.run '^$' -test.bench "$bench" \
		-test.benchtime "$1x" >"$tmp/out.$1" 2>&1 || {
		cat "$tmp/out.$1" >&2
		exit 1
	}
	awk '/^summary:/ {print $2}' "$tmp/cg.$1"
}
runs=${RUNS:-3}
[[ $runs =~ ^[1-9][0-9]?$ ]] || {
	echo "instructions.sh: RUNS=$runs (want 1..99)" >&2
	exit 2
}
counts=()
for ((r = 1; r <= runs; r++)); do
	one=$(total "$n")
	two=$(total $((2 * n)))
	counts+=($((two - one)))
	echo "run $r: $((two - one)) instructions a pass"
done
read -r lo hi < <(printf '%s\n' "${counts[@]}" | sort -n | awk 'NR==1 {lo=$1} {hi=$1} END {print lo, hi}')
echo "$lo-$hi instructions a pass of $n events over $runs runs, $mode ($bench; two passes minus one)"
