#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Build both module flavours of ibext against one kernel, each in its own copy
# of the tree so that flavours and kernels never rebuild each other:
#   <out>/product/ibext.ko                 the module as shipped
#   <out>/kunit/ibext.ko                   the same crate with its KUnit suites
#   <out>/test-ulps/ibext_{test,cm}_ulp.ko the harness's C ULPs (kunit/Kbuild)
#   <out>/ulp/nvme{,t}-rdma.ko             the NVMe over RDMA ports (ulp/)
#   <out>/ulp/ib_srp{,t}.ko                the SRP ports (ulp/), and
#   <out>/ulp/ib_srp_{none,dim}.ko         the initiator's variants for make bench
#   <out>/ulp/rds_rdma.ko                  RDS's IB transport on ibext's DIM (ulp/)
#   <out>/modroot/lib/modules/<release>    the guest's module tree (below)
# Usage: build-flavour.sh <kdir> <out> [extra make arguments...]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
kdir=$1 out=$2
shift 2

# Kbuild's dependency files name the kernel's headers by path: a build made
# against another kernel (another config, another cache directory) is not
# rebuilt by make, so it is thrown away.
kid=$(cd "$kdir" && pwd -P)
if [ -d "$out" ] && [ "$(cat "$out/.kdir" 2>/dev/null)" != "$kid" ]; then
	rm -rf "$out"
fi
mkdir -p "$out" && echo "$kid" > "$out/.kdir"

for kind in product kunit; do
	mkdir -p "$out/$kind"
	rsync -a --delete --exclude='*.o' --exclude='.*.cmd' --exclude='.*.d' \
		--exclude='bindings_generated.rs' --exclude='*.ko' --exclude='*.mod*' \
		"$top/Kbuild" "$top/rust" "$top/include" "$top/kunit" "$out/$kind/"
	flags=(IBEXT_SRC="$top")
	[ "$kind" = kunit ] && flags+=(IBEXT_KUNIT=y)
	make -s -C "$kdir" LLVM=1 M="$out/$kind" "${flags[@]}" "$@" modules
done

# The harness's C ULPs, against the product module's exports, in a tree of
# their own.
mkdir -p "$out/test-ulps"
rsync -a "$top/kunit/Kbuild" "$top"/kunit/*.c "$out/test-ulps/"
make -s -C "$kdir" LLVM=1 M="$out/test-ulps" IBEXT_INCLUDE="$top/include" \
	KBUILD_EXTRA_SYMBOLS="$out/product/Module.symvers" "$@" modules

# The ports: the kernel's own sources with ulp/*.patch applied.  A source is
# rewritten only when it changes, so an unchanged port is not rebuilt.
src=$kdir
[ -d "$kdir/source" ] && src=$(cd "$kdir/source" && pwd -P)
mkdir -p "$out/ulp"
cp "$top/ulp/Kbuild" "$top"/ulp/*.c "$out/ulp/"
for port in nvme-rdma:host nvmet-rdma:target; do
	name=${port%%:*} dir=${port#*:}
	patch -s -o "$out/ulp/$name.c.new" "$src/drivers/nvme/$dir/rdma.c" \
		< "$top/ulp/$name.patch" || {
		echo "ibext: ulp/$name.patch does not apply to $src/drivers/nvme/$dir/rdma.c" >&2
		exit 1
	}
	if cmp -s "$out/ulp/$name.c.new" "$out/ulp/$name.c"; then
		rm "$out/ulp/$name.c.new"
	else
		mv "$out/ulp/$name.c.new" "$out/ulp/$name.c"
	fi
done
# SRP's ports patch a driver and its private header: the files are copied
# into a tree of their own and patched there (patch -p1).
for port in srp:ib_srp srpt:ib_srpt; do
	dir=drivers/infiniband/ulp/${port%%:*} name=${port#*:}
	stage=$out/ulp/.stage/$name
	rm -rf "$stage" && mkdir -p "$stage/$dir"
	cp "$src/$dir/$name.c" "$src/$dir/$name.h" "$stage/$dir/"
	patch -s -p1 -d "$stage" < "$top/ulp/$name.patch" || {
		echo "ibext: ulp/$name.patch does not apply to $src/$dir" >&2
		exit 1
	}
	for f in "$name.c" "$name.h"; do
		cmp -s "$stage/$dir/$f" "$out/ulp/$f" || cp "$stage/$dir/$f" "$out/ulp/$f"
	done
done
# RDS's IB transport (rds_rdma): all of net/rds is staged, as its objects
# include the whole transport's private headers, into ulp/rds/; only ib_cm.c
# is patched (rds_rdma.patch).
stage=$out/ulp/.stage/rds
rm -rf "$stage" && mkdir -p "$stage/net/rds" "$out/ulp/rds"
cp "$src"/net/rds/*.[ch] "$stage/net/rds/"
patch -s -p1 -d "$stage" < "$top/ulp/rds_rdma.patch" || {
	echo "ibext: ulp/rds_rdma.patch does not apply to $src/net/rds" >&2
	exit 1
}
for f in "$stage"/net/rds/*.[ch]; do
	cmp -s "$f" "$out/ulp/rds/${f##*/}" || cp "$f" "$out/ulp/rds/"
done
make -s -C "$kdir" LLVM=1 M="$out/ulp" IBEXT_INCLUDE="$top/include" \
	KBUILD_EXTRA_SYMBOLS="$out/product/Module.symvers" "$@" modules

# The guest's /lib/modules/<release> (kunit/guest/lib.sh): the kernel's own
# modules (virtme-ng's links in <kdir>/.virtme_mods) and, in updates/, which
# depmod prefers, ibext and the ports under the kernel's module names, so
# that "modprobe ibext", "nvme connect -t rdma" and nvmet's request_module()
# load them as on a system with the ports installed. depmod runs here, on the
# host: over the guest's 9p root it costs the debug kernel a minute.
PATH=$PATH:/sbin:/usr/sbin
vm=$kdir/.virtme_mods/lib/modules/0.0.0
[ -f "$vm/modules.dep" ] || (cd "$kdir" && virtme-prep-kdir-mods >/dev/null)
rel=$(cat "$kdir/include/config/kernel.release")
m=$out/modroot/lib/modules/$rel
rm -rf "$out/modroot"
mkdir -p "$m/updates"
# kernel/ is a directory of links to upstream's modules, not one link to
# theirs: blktests finds a module with find(1) under /lib/modules/<rel>/kernel,
# which does not descend a starting point that is a link ("module ib_srp is
# not available" for the ports in make blktests).
(cd "$vm/kernel" && find . -name '*.ko*') | while read -r f; do
	mkdir -p "$m/kernel/${f%/*}"
	ln -s "$(readlink -f "$vm/kernel/$f")" "$m/kernel/$f"
done
cp "$vm"/modules.order "$vm"/modules.builtin* "$m/"
cp "$out/product/ibext.ko" "$out"/ulp/*.ko "$m/updates/"
depmod -b "$out/modroot" "$rel"
