#!/usr/bin/env bash
# scaling.sh [OUTDIR]: the shard-scaling measurement, for a machine with more cores than
# the 2-core ones this project is built on (the 16-core device some tasks are lent).
#
# For each op log in bench/out/scaling-logs/*.jsonl (copy the trace-driven logs there; the
# folder is ignored by git), or the built-in workload when there is none, it runs
# `kvindex bench` with the engine at every shard count up to the cores and the locked
# index: event throughput with 1 to 8 producers, find-matches latency at rest and under
# events (2 and 8 queriers), bytes per membership. Where bench/peers/build/bin holds the
# peer drivers (make bench-peers), it adds the peer table of each log. Each result is a
# markdown file in OUTDIR (default bench/out/scaling), with the machine it ran on.
#
# The binary is bench/out/kvindex when present (build it where Go is: go build -o
# bench/out/kvindex ./cmd/kvindex, and carry bench/out to the machine), else `go build`.
# DURATION (default 400ms) is each timed measurement's budget; ROUNDS (default 3) the
# peer table's alternating rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/out/scaling}
mkdir -p "$out"
bin=bench/out/kvindex
if [ ! -x "$bin" ]; then
	go build -o "$bin" ./cmd/kvindex
fi
duration=${DURATION:-400ms}
rounds=${ROUNDS:-3}
cores=$(nproc)
shards=1
for s in 2 4 8 16; do
	if [ "$s" -le "$cores" ]; then shards="$shards,$s"; fi
done
producers=1
for p in 2 4 8; do
	if [ "$p" -le "$cores" ]; then producers="$producers,$p"; fi
done
{
	echo "# Shard scaling on $(uname -m), $cores cores ($(date -u +%Y-%m-%dT%H:%MZ))"
	echo
	grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/^model name[[:space:]]*: /CPU: /' || true
} >"$out/machine.md"
logs=$(ls bench/out/scaling-logs/*.jsonl 2>/dev/null || true)
run() { # run NAME ARGS...: one kvindex bench, its markdown in $out/NAME.md
	local name=$1
	shift
	echo "scaling.sh: $name: kvindex bench $*" >&2
	"$bin" bench "$@" --duration "$duration" --markdown >"$out/$name.md"
}
if [ -z "$logs" ]; then
	echo "scaling.sh: no log in bench/out/scaling-logs: the built-in workload" >&2
	for q in 2 8; do
		run "builtin-q$q" --impls engine,locked --shards "$shards" --producers "$producers" --queriers "$q"
	done
fi
for f in $logs; do
	base=$(basename "$f" .jsonl)
	for q in 2 8; do
		run "$base-q$q" --ops "$f" --impls engine,locked --shards "$shards" --producers "$producers" --queriers "$q" --no-verify
	done
	if ls bench/peers/build/bin/smg-* >/dev/null 2>&1; then
		run "$base-peers" --ops "$f" --peers bench/peers/build/bin --impls engine,locked --shards "$shards" --rounds "$rounds"
	fi
done
echo "scaling.sh: results in $out" >&2
