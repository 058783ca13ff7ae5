#!/usr/bin/env bash
# phase.sh NAME CMD...: runs one phase of `make test` with its output kept aside, so that
# phases running side by side do not interleave. While the phase runs, a line every
# PHASE_TICK seconds (default 60) says it is still running and for how long; at its end
# its whole output is printed, then one line with its result, its wall time and the CPU
# time its processes took (user + system, from the shell's `times`). Exits
# with the command's status. `make test` runs every phase through it.
set -uo pipefail
name=$1
shift
tick=${PHASE_TICK:-60}
log=$(mktemp)
trap 'rm -f "$log" "$log.times"' EXIT
start=$(date +%s)
echo "==> $name: started $(date -u +%H:%M:%S)"
"$@" >"$log" 2>&1 &
pid=$!
# The ticker starts one process a minute (its sleep, stopped with it when the phase
# ends): sleeping a second at a time and reading the clock with date had started two a
# second per phase (a process start costs about 8 ms of CPU on a busy 2-core machine:
# about 50 ms a second with three phases at a time).
(
	nap=
	trap '[ -n "$nap" ] && kill "$nap" 2>/dev/null; exit 0' TERM
	while :; do
		sleep "$tick" >/dev/null 2>&1 &
		nap=$!
		wait "$nap"
		printf -v now '%(%s)T' -1
		echo "... $name: running for $((now - start)) s"
	done
) &
ticker=$!
wait "$pid"
rc=$?
kill "$ticker" 2>/dev/null
wait "$ticker" 2>/dev/null
secs=$(($(date +%s) - start))
times >"$log.times" # a builtin with a redirection: no subshell, whose children would be none
cpu=$(awk 'NR == 2 {
	n = split($1 " " $2, f, " "); s = 0
	for (i = 1; i <= n; i++) { split(f[i], p, "m"); sub(/s$/, "", p[2]); s += p[1] * 60 + p[2] }
	printf "%.0f", s }' "$log.times")
{
	echo "==> $name: output"
	cat "$log"
	if [ "$rc" -eq 0 ]; then
		echo "==> $name: ok in $secs s (CPU $cpu s)"
	else
		echo "==> $name: FAILED (exit $rc) after $secs s (CPU $cpu s)"
	fi
}
exit "$rc"
