#!/usr/bin/env bash
# Exports the SMG files the peer drivers compile, at the pinned commits, from a clone of
# SMG that you have (a work tree or a bare git directory), into OUT laid out for
# `make bench-peers SMG_SRC=OUT`. Nothing is downloaded; nothing lands in this repository.
#
#   bench/peers/export-smg.sh SMG_GIT OUT
#
# A commit the clone lacks is reported and its files skipped (build.sh then reports the
# peer as missing); fetch it into the clone and run this again.
set -euo pipefail
repo=${1:?usage: export-smg.sh SMG_GIT OUT}
out=${2:?usage: export-smg.sh SMG_GIT OUT}
if git --git-dir="$repo" rev-parse --git-dir >/dev/null 2>&1; then
	g=(git --git-dir="$repo")
elif git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
	g=(git -C "$repo")
else
	echo "export-smg: $repo is not a git repository" >&2
	exit 2
fi

p=crates/kv_index/src
# commit  path in SMG  path under OUT
pins="
f8daa8835a8b4419b53125a837aaab2b3ce895c3 $p/event_tree.rs          positional/event_tree.rs
19754b06a6724e7cdde0fd2e3603dbb1cf2bf2ec $p/chain_index.rs         chain/chain_index.rs
19754b06a6724e7cdde0fd2e3603dbb1cf2bf2ec $p/block.rs               chain/block.rs
19754b06a6724e7cdde0fd2e3603dbb1cf2bf2ec $p/sharded.rs             chain/sharded.rs
84258829eded2f714ef51fd4b2c1243dff160a48 $p/chain_index/arena.rs   chain/chain_index/arena.rs
84258829eded2f714ef51fd4b2c1243dff160a48 $p/lane_map.rs            chain/lane_map.rs
84258829eded2f714ef51fd4b2c1243dff160a48 $p/prefetch.rs            chain/prefetch.rs
fc5995b4784a08bd83be926f24725da59b6937a7 $p/chain_index/slab.rs    chain/chain_index/slab.rs
fc5995b4784a08bd83be926f24725da59b6937a7 $p/chain_index/walk.rs    chain/chain_index/walk.rs
"
fail=0
while read -r commit path dest; do
	[ -n "$commit" ] || continue
	mkdir -p "$out/$(dirname "$dest")"
	if "${g[@]}" show "$commit:$path" > "$out/$dest.tmp" 2>/dev/null; then
		mv "$out/$dest.tmp" "$out/$dest"
		echo "export-smg: $commit:$path -> $out/$dest"
	else
		rm -f "$out/$dest.tmp"
		echo "export-smg: MISSING $commit:$path (the clone lacks that commit or file)" >&2
		fail=1
	fi
done <<< "$pins"
exit $fail
