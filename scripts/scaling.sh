#!/usr/bin/env bash
# scaling.sh [OUTDIR]: the shard-scaling measurement, for a machine with more cores than
# the 2-core ones this project is built on.
#
# For each core count C in 1 2 4 8 16 up to the machine's (CORES="1 2 4" to choose), the
# process runs on C cores (GOMAXPROCS=C, and taskset -c 0-(C-1) where taskset exists) and
# measures the locked index and the engine at every shard count 1 2 4 8 16 up to C:
#
#   - ordered replay of each op log (kvindex replay --json --repeat REPEAT): block ops/s
#     over wall time and over the process's CPU time, find-matches p99 of its queries;
#   - kvindex bench: events/s with 1 and C producers, find-matches p99 under events
#     (2 queriers and a streamer) and at rest.
#
# The logs are bench/out/scaling-logs/*.jsonl (copy the trace-driven logs there; the
# folder is ignored by git), else ../shared/conformance/trace_conversation.jsonl where it
# exists; kvindex bench runs the first of them, or its built-in workload when there is
# none. It prints one table per core count to stdout (markdown) and keeps every run's
# output in OUTDIR (default bench/out/scaling). The zero engine.Config picks the locked
# index at GOMAXPROCS <= 2 and one shard per core (at most 8) above: these tables are
# what to check that rule against on a bigger machine.
#
# The binary is bench/out/kvindex when present (build it where Go is: go build -o
# bench/out/kvindex ./cmd/kvindex, and carry bench/out to the machine), else `go build`.
# DURATION (default 400ms) is each kvindex bench measurement's budget; REPEAT (default 3)
# the replays per row (the median by wall time is reported).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/out/scaling}
mkdir -p "$out"
bin=bench/out/kvindex
if [ ! -x "$bin" ]; then
	go build -o "$bin" ./cmd/kvindex
fi
duration=${DURATION:-400ms}
repeat=${REPEAT:-3}
ncpu=$(nproc)
cores=${CORES:-}
if [ -z "$cores" ]; then
	for c in 1 2 4 8 16; do
		if [ "$c" -le "$ncpu" ]; then cores="$cores $c"; fi
	done
fi
logs=$(ls bench/out/scaling-logs/*.jsonl 2>/dev/null || true)
if [ -z "$logs" ] && [ -f ../shared/conformance/trace_conversation.jsonl ]; then
	logs=../shared/conformance/trace_conversation.jsonl
fi
benchlog=$(echo "$logs" | awk 'NF { print $1; exit }')

# oncores C CMD...: CMD on C cores.
oncores() {
	local c=$1
	shift
	if command -v taskset >/dev/null 2>&1; then
		GOMAXPROCS=$c taskset -c "0-$((c - 1))" "$@"
	else
		GOMAXPROCS=$c "$@"
	fi
}

# cell FILE TABLE IMPL COL: column COL (1-based, after the impl) of IMPL's row in the
# markdown table whose heading starts with TABLE.
cell() {
	awk -v table="$2" -v impl="$3" -v col="$4" -F' *[|] *' '
		/^#### / { in_table = index($0, "#### " table) == 1 }
		in_table && $2 == impl { print $(col + 2); exit }' "$1"
}

echo "# Shard scaling on $(uname -m), $ncpu cores ($(date -u +%Y-%m-%dT%H:%MZ))"
grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/^model name[[:space:]]*: /CPU: /' || true
command -v taskset >/dev/null 2>&1 || echo "(no taskset: GOMAXPROCS only, the process may run on every core)"
echo
for c in $cores; do
	shards=""
	for s in 1 2 4 8 16; do
		if [ "$s" -le "$c" ]; then shards="$shards $s"; fi
	done
	echo "## $c cores (GOMAXPROCS=$c)"
	echo
	for f in $logs; do
		base=$(basename "$f" .jsonl)
		echo "Ordered replay of $base: \`kvindex replay --ops $f --json --repeat $repeat [--locked | --shards S]\`"
		echo
		echo "| index | block ops/s (wall) | block ops per CPU second | find-matches p99 | answers |"
		echo "| --- | ---: | ---: | ---: | --- |"
		for impl in locked $shards; do
			if [ "$impl" = locked ]; then args=(--locked) name=locked; else args=(--shards "$impl") name="$impl shards"; fi
			j="$out/replay-$base-c$c-$impl.json"
			echo "scaling.sh: $c cores: replay $base $name" >&2
			oncores "$c" "$bin" replay --ops "$f" --json --repeat "$repeat" "${args[@]}" | tail -1 >"$j" || true
			python3 - "$j" "$name" <<-'EOF'
				import json, sys
				try:
				    d = json.load(open(sys.argv[1]))
				except Exception as err:
				    print(f"| {sys.argv[2]} | failed: {err} | | | |"); sys.exit()
				cpu = d.get("cpu_seconds", 0)
				per_cpu = f"{d['block_ops'] / cpu / 1e6:.2f}M" if cpu else "-"
				print(f"| {sys.argv[2]} | {d['block_ops_per_s'] / 1e6:.2f}M | {per_cpu} | {d['query_p99_ns'] / 1e3:.1f} µs | {d['passed']} passed, {d['failed']} failed |")
			EOF
		done
		echo
	done
	producers=1
	if [ "$c" -gt 1 ]; then producers="1,$c"; fi
	md="$out/bench-c$c.md"
	opsargs=(--gen 60000)
	if [ -n "$benchlog" ]; then opsargs=(--ops "$benchlog" --no-verify); fi
	echo "scaling.sh: $c cores: kvindex bench" >&2
	oncores "$c" "$bin" bench "${opsargs[@]}" --impls engine,locked --shards "$(echo $shards | tr ' ' ,)" \
		--producers "$producers" --queriers 2 --duration "$duration" --markdown >"$md" 2>/dev/null || true
	echo "kvindex bench ${opsargs[*]} --producers $producers --queriers 2 --duration $duration (full tables: $md)"
	echo
	pcol="events/s P=$c"
	if [ "$c" -eq 1 ]; then pcol="(one producer only)"; fi
	echo "| index | events/s P=1 | $pcol | p99 under events | p99 at rest |"
	echo "| --- | ---: | ---: | ---: | ---: |"
	for impl in locked $shards; do
		if [ "$impl" = locked ]; then row=locked name=locked; else row="engine/shards=$impl" name="$impl shards"; fi
		pc="-"
		if [ "$c" -gt 1 ]; then pc=$(cell "$md" "Event throughput" "$row" 3); fi
		echo "| $name | $(cell "$md" "Event throughput" "$row" 1) | $pc | $(cell "$md" "find-matches under load" "$row" 3) | $(cell "$md" "find-matches at rest" "$row" 3) |"
	done
	echo
done
echo "scaling.sh: every run's output in $out" >&2
