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
if ! command -v apt-get >/dev/null 2>&1; then
	echo "install.sh: python3 zmq/msgpack missing and apt-get is not available; publisher tests will skip" >&2
	exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
	if command -v sudo >/dev/null 2>&1; then
		SUDO="sudo -n"
	else
		echo "install.sh: python3 zmq/msgpack missing, not root and no sudo; publisher tests will skip" >&2
		exit 0
	fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends python3 python3-zmq python3-msgpack >/dev/null
if have; then
	echo "install.sh: installed python3-zmq and python3-msgpack"
else
	echo "install.sh: python3-zmq/python3-msgpack installed but the import still fails" >&2
	exit 1
fi
