#!/usr/bin/env bash
# together.sh CMD...: runs each CMD (a bash command line) at the same time, each with its
# output kept aside; once all have ended, prints each one's output in the order given and
# exits 1 if any failed (naming them). make test's plain-index phase runs its two parts
# through it (the index's differentials; serve's and the subscriber's memory tests).
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: together.sh CMD..." >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pids=()
for i in $(seq 1 $#); do
	bash -c "${!i}" >"$work/$i.out" 2>&1 &
	pids+=($!)
done
failed=()
for i in $(seq 1 $#); do
	wait "${pids[$((i - 1))]}" || failed+=("$i")
done
for i in $(seq 1 $#); do cat "$work/$i.out"; done
for i in "${failed[@]}"; do echo "FAILED: ${!i}"; done
[ ${#failed[@]} = 0 ]
