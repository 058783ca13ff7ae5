#!/usr/bin/env bash
# apt_install WHO WHAT PACKAGE...: installs Debian packages for a test dependency,
# sourced by testdata/publisher/install.sh and api/kvindexv1/install-protoc.sh. WHO names
# the calling script in messages, WHAT says what is missing. Returns 0 after installing;
# returns 3, with a message on stderr, when it cannot install (no apt-get, or not root
# and no sudo), so that the caller can skip visibly instead of failing.
apt_install() {
	local who=$1 what=$2
	shift 2
	if ! command -v apt-get >/dev/null 2>&1; then
		echo "$who: $what missing and apt-get is not available" >&2
		return 3
	fi
	local sudo=""
	if [ "$(id -u)" != "0" ]; then
		if command -v sudo >/dev/null 2>&1; then
			sudo="sudo -n"
		else
			echo "$who: $what missing, not root and no sudo" >&2
			return 3
		fi
	fi
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get update -qq
	$sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
