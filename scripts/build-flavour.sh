#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Build both module flavours of ibext against one kernel, each in its own copy
# of the tree so that flavours and kernels never rebuild each other:
#   <out>/product/ibext.ko                 the module as shipped
#   <out>/kunit/ibext.ko                   the same crate with its KUnit suites
#   <out>/kunit/kunit/ibext_test_ulp.ko    a minimal C ULP, for the harness
# Usage: build-flavour.sh <kdir> <out> [extra make arguments...]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
kdir=$1 out=$2
shift 2

for kind in product kunit; do
	mkdir -p "$out/$kind"
	rsync -a --delete --exclude='*.o' --exclude='.*.cmd' --exclude='.*.d' \
		--exclude='bindings_generated.rs' --exclude='*.ko' --exclude='*.mod*' \
		"$top/Kbuild" "$top/rust" "$top/include" "$top/kunit" "$out/$kind/"
	flags=(IBEXT_SRC="$top")
	[ "$kind" = kunit ] && flags+=(IBEXT_KUNIT=y)
	make -s -C "$kdir" LLVM=1 M="$out/$kind" "${flags[@]}" "$@" modules
done
