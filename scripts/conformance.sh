#!/usr/bin/env bash
# conformance.sh KVINDEX LOG...: replays each golden op log through the kvindex binary
# KVINDEX at shards 1, 2, 3, 4 and 8, on the locked index and on the locked index with
# SPEC's prefix chain; every query's expected answer must come out (kvindex replay exits
# 1 otherwise). MATRIX=full (make test-long) runs each of the 7 at jumps 1, 4 and 64 (21
# replays a log); MATRIX=short (make test) runs 2 of them: eight shards at jump 1 and
# the locked index with the spec chain at jump 4, the pairings nothing else replays the
# logs at (the engine's differential tests cross every shard count with every jump on
# random histories, and internal/replay's TestConformance replays every log in process
# at shards 1 and 4 and every jump). Logs run JOBS at a time (default: the CPUs), each log's replays one
# after the other; a line per log says ok or what failed. Exits 1 when any replay
# failed. `make conformance` runs it.
set -uo pipefail
bin=$1
shift
jobs=${JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

case ${MATRIX:-full} in
full) configs=$(for s in 1 2 3 4 8 locked locked-spec; do for j in 1 4 64; do echo "$s:$j"; done; done) ;;
short) configs="8:1 locked-spec:4" ;;
*)
	echo "conformance.sh: MATRIX is full or short, not $MATRIX" >&2
	exit 2
	;;
esac

one() { # one LOG RESULT: every configuration of one log; RESULT gets its report
	local f=$1 res=$2 fail=0 s j c impl out
	for c in $configs; do
		s=${c%:*} j=${c#*:}
		case $s in
		locked) impl=--locked ;;
		locked-spec) impl="--locked --spec-chain" ;;
		*) impl="--shards $s" ;;
		esac
		# shellcheck disable=SC2086 # impl is two words for locked-spec
		if ! out=$("$bin" replay --ops "$f" $impl --jump "$j" --json 2>&1); then
			printf 'FAIL %s %s jump=%s\n%s\n' "$f" "$impl" "$j" "$out" >>"$res"
			fail=1
		fi
	done
	if [ $fail = 0 ]; then echo "ok   $(basename "$f")" >>"$res"; fi
}

i=0
for f in "$@"; do
	while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
	one "$f" "$tmp/$(printf %04d $i)" &
	i=$((i + 1))
done
wait
cat "$tmp"/* 2>/dev/null
! grep -q '^FAIL' "$tmp"/* 2>/dev/null
