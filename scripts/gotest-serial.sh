#!/usr/bin/env bash
# gotest-serial.sh BUILDFLAGS TESTFLAGS PKG...: go test for PKGs, with the test binaries
# built in parallel (go's default -p) and run one at a time.
#
#   scripts/gotest-serial.sh "-race -count=1" "-test.timeout=15m" ./server ./fabric
#
# `go test -p 1` runs one test binary at a time, which make test's race-pkgs phase needs
# (two race-detector binaries at once, beside race-invariants' engine binary, took the
# suite past 1.5 GB), but -p also limits the build: it compiled one package at a time,
# and on a cold cache beside two busy cores the phase spent 800 s of wall time on 359 s
# of CPU, the longest path through make test. Here `go test -c` builds every test binary
# at go's default parallelism (running go vet's checks, as go test does), then each
# binary runs in its package's folder, as go test runs it, with TESTFLAGS (the binary's
# own -test.* flags). The output is go test's: an "ok" line per passing package, the
# whole output of a failing one and a FAIL line; the exit status is 1 if any failed.
set -uo pipefail
build=${1:?usage: gotest-serial.sh BUILDFLAGS TESTFLAGS PKG...}
testflags=${2?usage: gotest-serial.sh BUILDFLAGS TESTFLAGS PKG...}
shift 2
go=${GO:-go}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT

# shellcheck disable=SC2086 # BUILDFLAGS is a list of flags
$go test -c -o "$bin/" $build "$@" || exit 1

fail=0
# shellcheck disable=SC2086
while read -r path dir; do
	exe="$bin/${path##*/}.test"
	[ -x "$exe" ] || continue # a package without test files
	out="$bin/out"
	start=$(date +%s%N)
	(cd "$dir" && "$exe" -test.paniconexit0 $testflags) >"$out" 2>&1
	rc=$?
	ms=$((($(date +%s%N) - start) / 1000000))
	if [ $rc = 0 ]; then
		printf 'ok  \t%s\t%d.%03ds\n' "$path" $((ms / 1000)) $((ms % 1000))
	else
		cat "$out"
		printf 'FAIL\t%s\t%d.%03ds\n' "$path" $((ms / 1000)) $((ms % 1000))
		fail=1
	fi
done < <($go list -f '{{.ImportPath}} {{.Dir}}' "$@")
exit $fail
