#!/usr/bin/env bash
# together.sh CMD...: runs each CMD (a bash command line) at the same time, each with its
# output kept aside; once all have ended, prints each one's output in the order given and
# exits 1 if any failed (naming them). make test's plain phase runs its go test commands
# through it: one after another, the last of them started when the first had ended, and
# the phase, the last of make test, ran its final minute on one or two threads.
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
