#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# The command kunit/run.py gives virtme-ng: sets up two soft-RoCE devices,
# rxe0 on veth0 and rxe1 on veth2, then runs the KTAP documents run.py asks
# for, in order: "kunit" (the KUnit flavour of ibext), "finish" (below), or
# a script of this directory (nvme_bench is nvme-bench.sh).
# Usage: main.sh <flavour> <build dir> <kernel dir> <smp> <doc,doc,...> [suite]
#
# Everything goes to the kernel log, in order with the kernel's messages:
#   ibext-guest: begin|end ktap <name>   the KTAP of a script or KUnit module
#   ibext-ktap: <line>                   a line a script printed (its KTAP)
#   ibext-guest: done                    the guest finished normally
#   ibext-bench: {json}                  one benchmark point (kunit/bench.py)
FLAVOUR=$1 BDIR=$2 KDIR=$3 SMP=$4 DOCS=$5 SUITE=${6:-}
KSRC=$(readlink -f "$KDIR/source")
G=$(cd "$(dirname "$0")" && pwd)
export FLAVOUR BDIR SMP KSRC KDIR SUITE
# The host's filesystem is read-only in the guest; /tmp is the guest's own
# (fio writes its verify state to the current directory).
cd /tmp || exit 1
. "$G/lib.sh"
# /dev/kmsg takes one record per write(), at most about 1000 bytes: lines
# go one by one (programs writing to a pipe write whole buffers). Tagged: the
# kernel's own lines between the markers (a KUnit module loaded by a script
# prints KTAP of its own) are not the script's.
exec 3> /dev/kmsg
kmsg() { while IFS= read -r l; do printf 'ibext-ktap: %s\n' "${l:0:900}" >&3; done; }
log() { echo "ibext-guest: $*" >&3; }

# 993 IPv6 addresses on veth0 nearly fill rxe0's GID table (1 + 993 of 1024
# entries, RoCE v2 only) for the GID index tests and benchmarks, leaving
# room for the addresses the tests add; rxe1 keeps a small table.
populate_gids() {
	for i in $(seq 1 993); do printf 'addr add 2001:db8:1::%x/64 dev veth0\n' $i; done > /tmp/gids
	ip -6 -batch /tmp/gids
}

setup() {
	for f in debugfs:/sys/kernel/debug configfs:$CFS tracefs:$TR; do
		grep -q " ${f#*:} " /proc/mounts || mount -t ${f%%:*} ${f%%:*} ${f#*:} || return 1
	done
	echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad
	echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad
	ip link set lo up
	ip link add veth0 type veth peer name veth1 && ip link add veth2 type veth peer name veth3 &&
		for i in 0 1 2 3; do ip link set veth$i up || return 1; done
	# The addresses go on while the modules load (on the debug kernel each
	# takes tens of seconds); rxe0 finds them when it is added.
	populate_gids &
	gids=$!
	modules_tree || return 1
	# The RDMA core and its ULP-facing modules first, as a real system loads
	# them; rxe asks the crypto API for "crc32" at link time.
	modprobe -a ib_core rdma_cm ib_uverbs crc32_generic rdma_rxe || return 1
	wait $gids && $RXE_ADD0 && $RXE_ADD1 && failslab_setup
}

# ktap <name> <command...>: one KTAP document, between markers.
ktap() {
	name=$1
	shift
	log "begin ktap $name"
	"$@" 2>&1 | kmsg
	log "end ktap $name"
}

# kunit <module>: the KUnit flavour of ibext; its suites run during insmod.
KUNIT=
kunit() {
	ktap kunit insmod "$1"
	KUNIT=unloaded
	rmmod ibext || KUNIT=stuck
}

# The debug kernel's failslab: KUnit's fail-nth sweeps allocate with
# GFP_KERNEL, which failslab skips by default.
failslab_setup() {
	[ -d /sys/kernel/debug/failslab ] || return 0
	echo N > /sys/kernel/debug/failslab/ignore-gfp-wait
	echo 1 > /sys/kernel/debug/failslab/verbose
}

# The debug kernel: any leak is reported before the guest ends. A scan
# reports an object at least 5 s old at its start, unreferenced, and
# unchanged since the scan before (mm/kmemleak.c, kmemleak_scan()): two
# scans, the second begun 6 s after this step.
uptime_cs() { read -r up _ < /proc/uptime && echo $((${up%.*}${up#*.})); }
six_s_since() { [ $(($(uptime_cs) - $1)) -ge 600 ]; }
leak_scan() {
	t=$(uptime_cs)
	echo scan > /sys/kernel/debug/kmemleak
	wait_for 60 "6 s after the first scan" six_s_since $t || return 1
	echo scan > /sys/kernel/debug/kmemleak
	cat /sys/kernel/debug/kmemleak > /tmp/kmemleak
	[ ! -s /tmp/kmemleak ] || { cat /tmp/kmemleak; return 1; }
}

finish() {
	ktap_print_header
	ktap_set_plan $([ -n "$KUNIT" ] && echo 3 || echo 2)
	[ -z "$KUNIT" ] || step "the KUnit flavour of ibext unloads" [ $KUNIT = unloaded ]
	step "rdma link delete rxe0 rxe1 after the tests" \
		sh -c "rdma link delete rxe0 && rdma link delete rxe1"
	if [ -e /sys/kernel/debug/kmemleak ]; then
		step "kmemleak finds no leak" leak_scan
	else
		ktap_test_skip "kmemleak finds no leak (not in this kernel)"
	fi
}

if ! setup > /tmp/setup.log 2>&1; then
	log "begin ktap setup"
	{ echo "TAP version 13"; echo 1..1; sed 's/^/# /' /tmp/setup.log
	  echo "not ok 1 guest setup (veth, modules, rdma_rxe, rxe0, rxe1)"; } | kmsg
	log "end ktap setup"
	log "done"
	exit 1
fi
log "setup done"
for doc in ${DOCS//,/ }; do
	case $doc in
	kunit) kunit "$BDIR/kunit/ibext.ko" ;;
	finish) ktap finish finish ;;
	*) ktap $doc bash "$G/${doc//_/-}.sh" ;;
	esac
done
log "done"
