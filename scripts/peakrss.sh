#!/usr/bin/env bash
# peakrss.sh CMD...: runs CMD and samples, twice a second, the summed resident memory of
# CMD and every process it started (go, the compilers, the test binaries, the shells); at
# the end prints the peak sum and the wall time on stderr. Exits with CMD's status. Used to
# measure `make test`'s memory (README, "Tests").
set -uo pipefail
"$@" &
root=$!
peak=0
start=$(date +%s)
# PEAKRSS_LOG=FILE keeps, at each new peak, the tree's processes (RSS in KiB, command)
# in FILE: which phases and binaries made the peak.
log=${PEAKRSS_LOG:-}
snap=$(mktemp)
trap 'rm -f "$snap"' EXIT
tree_rss() { # the summed RSS in KiB of $root's process tree; its processes into $snap
	ps -e -o pid=,ppid=,rss=,args= | awk -v root="$root" -v snap="$snap" '
		{ pid = $1; parent[pid] = $2; rss[pid] = $3; a = $0; sub(/^ *[0-9]+ +[0-9]+ +[0-9]+ /, "", a); args[pid] = substr(a, 1, 160) }
		END {
			printf "" > snap
			for (p in parent) {
				q = p
				for (d = 0; d < 64 && q != "" && q != 0; d++) {
					if (q == root) { sum += rss[p]; printf "%d %s\n", rss[p], args[p] >> snap; break }
					q = parent[q]
				}
			}
			print sum + 0
		}'
}
while kill -0 "$root" 2>/dev/null; do
	r=$(tree_rss)
	if ((r > peak)); then
		peak=$r
		[ -n "$log" ] && { echo "peak $((r / 1024)) MiB at $(date -u +%H:%M:%S)"; sort -rn "$snap" | head -15; } >"$log"
	fi
	sleep 0.5
done
wait "$root"
rc=$?
echo "peakrss: peak $((peak / 1024)) MiB summed over the process tree, $(($(date +%s) - start)) s wall, exit $rc" >&2
exit "$rc"
