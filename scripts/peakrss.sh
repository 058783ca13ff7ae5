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
tree_rss() { # the summed RSS in KiB of $root's process tree
	ps -e -o pid=,ppid=,rss= | awk -v root="$root" '
		{ parent[$1] = $2; rss[$1] = $3 }
		END {
			for (p in parent) {
				q = p
				for (d = 0; d < 64 && q != "" && q != 0; d++) {
					if (q == root) { sum += rss[p]; break }
					q = parent[q]
				}
			}
			print sum + 0
		}'
}
while kill -0 "$root" 2>/dev/null; do
	r=$(tree_rss)
	((r > peak)) && peak=$r
	sleep 0.5
done
wait "$root"
rc=$?
echo "peakrss: peak $((peak / 1024)) MiB summed over the process tree, $(($(date +%s) - start)) s wall, exit $rc" >&2
exit "$rc"
