#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# make blktests: find blktests, build its helper programs, and run the given
# groups against upstream's modules and the ports (kunit/blktests.py).
# blktests is a separate tool, as fio is: BLKTESTS=<checkout> names one; else
# the pinned snapshot in ../shared/vendor/ is unpacked into the cache.
# Usage: blktests.sh <kdir> <build dir> <out dir> <group...>
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${IBEXT_CACHE:-$HOME/.cache/ibext}
kdir=$1 bdir=$2 out=$3
shift 3

bt=${BLKTESTS:-}
if [ -z "$bt" ]; then
	tgz=$(ls "$top"/../shared/vendor/blktests-*.tar.gz 2>/dev/null | head -n 1 || true)
	if [ -z "$tgz" ]; then
		echo "ibext: make blktests needs blktests: git clone https://github.com/osandov/blktests" >&2
		echo "       and run make blktests BLKTESTS=<that checkout>" >&2
		exit 1
	fi
	bt=$CACHE/blktests/$(basename "$tgz" .tar.gz)
	if [ ! -x "$bt/check" ]; then
		echo "ibext: unpacking $tgz into $bt"
		rm -rf "$bt" "$bt.tmp" && mkdir -p "$bt.tmp"
		tar -xzf "$tgz" -C "$bt.tmp" --strip-components=1 && mv "$bt.tmp" "$bt"
	fi
fi
bt=$(cd "$bt" && pwd)
# clang and clang++, which setup.sh installs for the kernel; its C++ helper
# (discontiguous-io) is for the srp group.
make -s -C "$bt" CC=clang CXX=clang++ >/dev/null
echo "ibext: blktests $(git -C "$bt" rev-parse HEAD 2>/dev/null || basename "$bt") in $bt"
exec python3 "$top/kunit/blktests.py" --flavour "test:$kdir:$bdir" --blktests "$bt" --out "$out" "$@"
