#!/usr/bin/env bash
# Installs what the test publisher (publisher.py) needs: Debian's python3-zmq and
# python3-msgpack, only when no python3 on this machine can `import zmq, msgpack`.
# Idempotent and quiet when there is nothing to do, so the Makefile may call it on every
# run. Tests that need the publisher skip, visibly, when the import still fails (set
# KVINDEX_REQUIRE_PUBLISHER=1 to make them fail instead).
#
# Debian's packages install into /usr/bin/python3; a python3 earlier on PATH (pyenv, a
# venv) does not see them, which is why both are tried here and by subscriber/pubtest.
set -euo pipefail

have() {
	for py in python3 /usr/bin/python3; do
		if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import zmq, msgpack' >/dev/null 2>&1; then
			return 0
		fi
	done
	return 1
}

if have; then
	exit 0
fi
. "$(dirname "$0")/../../scripts/apt-install.sh"
rc=0
apt_install install.sh "python3 zmq/msgpack (publisher tests will skip)" python3 python3-zmq python3-msgpack || rc=$?
if [ "$rc" = 3 ]; then
	exit 0
elif [ "$rc" != 0 ]; then
	exit "$rc"
fi
if have; then
	echo "install.sh: installed python3-zmq and python3-msgpack"
else
	echo "install.sh: python3-zmq/python3-msgpack installed but the import still fails" >&2
	exit 1
fi
