#!/usr/bin/env bash
# Installs protoc (Debian's protobuf-compiler) when it is missing, as
# testdata/publisher/install.sh does for the test publisher. Idempotent and quiet when
# protoc is there. Exits 0 without it when it cannot install (no apt-get, not root and
# no sudo): make proto-check then skips, visibly.
set -euo pipefail
if command -v protoc >/dev/null 2>&1; then
	exit 0
fi
. "$(dirname "$0")/../../scripts/apt-install.sh"
rc=0
apt_install install-protoc.sh protoc protobuf-compiler || rc=$?
if [ "$rc" = 3 ]; then
	exit 0
elif [ "$rc" != 0 ]; then
	exit "$rc"
fi
echo "install-protoc.sh: installed $(protoc --version)"
