#!/usr/bin/env bash
# peakrss.sh CMD...: runs CMD and samples, twice a second, the summed resident memory of
# CMD and every process it started (go, the compilers, the test binaries, the shells); at
# the end prints the peak sum and the wall time on stderr. Exits with CMD's status. Used to
# measure `make test`'s memory (README, "Tests").
#
# A sample reads each process's /proc/PID/stat (its parent and resident pages) with the
# shell's own read, starting no process: about 13 ms of CPU on a loaded 2-core machine,
# where one ps took 46 ms, and at two samples a second that had taken about 60 s of CPU
# from the cold make test it measured.
set -uo pipefail
"$@" &
root=$!
peak=0
start=$(date +%s)
# PEAKRSS_LOG=FILE keeps, at a new peak, the tree's largest processes (RSS in KiB,
# command) in FILE: which phases and binaries made the peak. Their commands come from
# ps, run only when the peak has grown by 16 MiB since FILE was written or 10 s have
# passed since.
log=${PEAKRSS_LOG:-}
logged=0 loggedat=0
pagekib=$(($(getconf PAGESIZE) / 1024))
declare -A parent rss intree
# sample: sets sum to the summed RSS in KiB of $root's process tree and members to its
# processes ("PID KIB" words).
sample() {
	local f line p q chain files=(/proc/[0-9]*/stat)
	parent=() rss=() intree=([$root]=1)
	set -f
	for f in "${files[@]}"; do
		{ read -r line <"$f"; } 2>/dev/null || continue
		# shellcheck disable=SC2086 # split the fields after the command's name
		set -- ${line##*) }
		parent[${line%% *}]=$2
		rss[${line%% *}]=${22}
	done
	set +f
	sum=0 members=()
	for p in "${!parent[@]}"; do
		q=$p chain=()
		while [ -z "${intree[$q]:-}" ] && [ -n "${parent[$q]:-}" ] && [ "$q" != 0 ]; do
			chain+=("$q")
			q=${parent[$q]}
		done
		[ "${intree[$q]:-}" = 1 ] || { for q in "${chain[@]}"; do intree[$q]=0; done; continue; }
		for q in "${chain[@]}"; do intree[$q]=1; done
		sum=$((sum + rss[$p] * pagekib))
		members+=("$p $((rss[$p] * pagekib))")
	done
}
while kill -0 "$root" 2>/dev/null; do
	sample
	if ((sum > peak)); then
		peak=$sum
		now=$(date +%s)
		if [ -n "$log" ] && ((sum > logged + 16384 || now >= loggedat + 10)); then
			logged=$sum loggedat=$now
			{
				echo "peak $((sum / 1024)) MiB at $(date -u +%H:%M:%S)"
				printf '%s\n' "${members[@]}" | sort -k2 -rn | head -15 | while read -r pid kib; do
					echo "$kib $(ps -o args= -p "$pid" 2>/dev/null | cut -c1-160)"
				done
			} >"$log"
		fi
	fi
	sleep 0.5
done
wait "$root"
rc=$?
echo "peakrss: peak $((peak / 1024)) MiB summed over the process tree, $(($(date +%s) - start)) s wall, exit $rc" >&2
exit "$rc"
