#!/usr/bin/env bash
# gotest-lanes.sh BUILDFLAGS TESTFLAGS PKG[:RUN]...: go test for PKGs, with the test
# binaries built by one `go test -c` (go's default build parallelism) and run in two
# lanes side by side, each lane one binary at a time: the packages named in HEAVY
# (space-separated, in any form go list takes) in one, the others in the other.
# PKG:RUN runs only the tests matching the regular expression RUN in PKG.
#
#   HEAVY="./server" scripts/gotest-lanes.sh "-race" "-test.timeout=15m" ./server ./fabric './route:^TestTracker'
#
# Why lanes: `go test` runs as many test binaries at once as it builds packages (-p), and
# make test's race-pkgs phase cannot afford two of its large race-detector binaries
# (server 0.49 GB, subscriber 0.46 GB) beside race-invariants' engine binary (0.65 GB)
# within 1.5 GB; but one binary at a time left the phase, the longest path through make
# test, waiting on small binaries whose tests mostly sleep on sockets and timers. The
# heavy lane holds at most one large binary; the light lane's largest is 0.18 GB. With
# HEAVY_LOCK set (a file path), each heavy binary runs holding an flock on it, so that
# the heavy lanes of several invocations (make test's race-pkgs and race-invariants)
# run one large binary at a time between them.
# Each binary runs in its package's folder, as go test runs it, with TESTFLAGS (its own
# -test.* flags). The output is go test's, in the order the packages were given once all
# have run: an "ok" line per passing package, the whole output of a failing one and a
# FAIL line; the exit status is 1 if any failed.
set -uo pipefail
usage="usage: gotest-lanes.sh BUILDFLAGS TESTFLAGS PKG[:RUN]..."
build=${1?$usage}
testflags=${2?$usage}
shift 2
go=${GO:-go}
heavy=" "
if [ -n "${HEAVY:-}" ]; then # as import paths, however they were written
	# shellcheck disable=SC2086 # HEAVY is a list of packages
	heavy=" $($go list $HEAVY | tr '\n' ' ')" || exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

pkgs=() runs=()
for arg in "$@"; do
	pkgs+=("${arg%%:*}")
	if [[ $arg == *:* ]]; then runs+=("${arg#*:}"); else runs+=(""); fi
done

# shellcheck disable=SC2086 # BUILDFLAGS is a list of flags
$go test -c -o "$work/" $build "${pkgs[@]}" || exit 1

# one I: runs the binary of package number I; its report goes to $work/I.out.
one() {
	local i=$1 path=${paths[$1]} dir=${dirs[$1]} exe rc ms start out=$work/$1.log
	exe="$work/${path##*/}.test"
	[ -x "$exe" ] || return 0 # a package without test files
	local args=(-test.paniconexit0)
	[ -n "${runs[$i]}" ] && args+=(-test.run "${runs[$i]}")
	start=$(date +%s%N)
	# The subshell's `times` gives the binary's CPU time (its second line: the children's
	# user and system time), reported beside the wall time.
	# shellcheck disable=SC2086 # TESTFLAGS is a list of flags
	(
		cd "$dir" && "$exe" "${args[@]}" $testflags
		rc=$?
		times >&3
		exit $rc
	) >"$out" 2>&1 3>"$work/$i.times"
	rc=$?
	ms=$((($(date +%s%N) - start) / 1000000))
	cpu=$(tail -1 "$work/$i.times" | awk '{ t = 0; for (i = 1; i <= NF; i++) { split($i, a, "m"); t += a[1] * 60 + a[2] } printf "%.1f", t }')
	if [ $rc = 0 ]; then
		printf 'ok  \t%s\t%d.%03ds\tCPU %ss\n' "$path" $((ms / 1000)) $((ms % 1000)) "$cpu" >"$work/$i.out"
	else
		{
			cat "$out"
			printf 'FAIL\t%s\t%d.%03ds\tCPU %ss\n' "$path" $((ms / 1000)) $((ms % 1000)) "$cpu"
		} >"$work/$i.out"
	fi
}

paths=() dirs=()
for i in "${!pkgs[@]}"; do
	read -r p d < <($go list -f '{{.ImportPath}} {{.Dir}}' "${pkgs[$i]}") || exit 1
	paths+=("$p")
	dirs+=("$d")
done
# locked I: one I, holding HEAVY_LOCK where it is set and flock(1) exists.
locked() {
	if [ -n "${HEAVY_LOCK:-}" ] && command -v flock >/dev/null; then
		(
			flock 9
			one "$1"
		) 9>"$HEAVY_LOCK"
	else
		one "$1"
	fi
}
lane() { # lane HEAVY: runs, in order, the packages that are (1) or are not (0) heavy
	local i
	for i in "${!pkgs[@]}"; do
		if [[ $heavy == *" ${paths[$i]} "* ]]; then
			[ "$1" = 1 ] && locked "$i"
		else
			[ "$1" = 0 ] && one "$i"
		fi
	done
}
lane 1 &
heavylane=$!
lane 0
wait "$heavylane"

fail=0
for i in "${!pkgs[@]}"; do
	[ -f "$work/$i.out" ] || continue
	cat "$work/$i.out"
	grep -q '^FAIL' "$work/$i.out" && fail=1
done
exit $fail
