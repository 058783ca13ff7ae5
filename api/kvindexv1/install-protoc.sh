#!/usr/bin/env bash
# Installs protoc (Debian's protobuf-compiler) when it is missing, as
# testdata/publisher/install.sh does for the test publisher. Idempotent and quiet when
# protoc is there. Exits 0 without it when it cannot install (no apt-get, not root and
# no sudo): make proto-check then skips, visibly.
set -euo pipefail
if command -v protoc >/dev/null 2>&1; then
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-protoc.sh: protoc missing and apt-get is not available" >&2
	exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
	if command -v sudo >/dev/null 2>&1; then
		SUDO="sudo -n"
	else
		echo "install-protoc.sh: protoc missing, not root and no sudo" >&2
		exit 0
	fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends protobuf-compiler >/dev/null
echo "install-protoc.sh: installed $(protoc --version)"
