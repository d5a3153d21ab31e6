#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# /init of the ibext test guest (see kunit/run.py).  Sets up two soft-RoCE
# devices, rxe0 on veth0 and rxe1 on veth2, then runs the mode the host asked
# for on the kernel command line (ibext.mode=check|run) and powers off.
#
# Markers and step results go through /dev/kmsg so that they stay in order
# with the kernel's own messages on the console; the host parses them:
#   ibext-guest: ok|not ok <n> - <what>     one guest-side test step
#   ibext-guest: begin kunit <module>       KTAP of <module> follows
#   ibext-guest: end kunit <module>
#   ibext-guest: setup done                 veth, rxe0 and rxe1 are up (timing only)
#   ibext-guest: done <steps>               the guest finished normally

/bin/busybox --install -s /bin
export PATH=/usr/sbin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug
mkdir -p /tmp && mount -t tmpfs tmp /tmp

# busybox sh prefers its own applets to PATH, so iproute2's ip is named in full.
ip() { /usr/sbin/ip "$@"; }

log() { echo "ibext-guest: $*" > /dev/kmsg; }
param() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p"; }

MODE=$(param ibext.mode)
SUITE=$(param ibext.suite)
SMP=$(param ibext.smp)
FLAVOUR=$(param ibext.flavour)
STEPS=0

# step <description> <command...>: one guest-side test, reported ok/not ok.
step() {
	desc=$1; shift
	STEPS=$((STEPS + 1))
	if out=$("$@" 2>&1); then
		log "ok $STEPS - $desc"
	else
		log "not ok $STEPS - $desc"
		echo "$out" | while read -r l; do log "# $l"; done
	fi
}

# The debug kernel: report any leak before powering off. kmemleak ignores
# objects younger than 5 s, so wait that long first.
leak_scan() {
	[ -e /sys/kernel/debug/kmemleak ] || return 0
	sleep 6
	echo scan > /sys/kernel/debug/kmemleak
	echo scan > /sys/kernel/debug/kmemleak
	cat /sys/kernel/debug/kmemleak > /tmp/kmemleak
	if [ -s /tmp/kmemleak ]; then
		while read -r l; do log "# kmemleak: $l"; done < /tmp/kmemleak
		log "kmemleak: unreferenced object(s) reported above"
		return 1
	fi
}

finish() {
	if [ "$MODE" = check ] && [ -e /sys/kernel/debug/kmemleak ]; then
		step "kmemleak scan finds no leak" leak_scan
	fi
	log "done $STEPS"
	sync
	poweroff -f
	sleep 5
	reboot -f
}

D=/sys/kernel/debug/ibext
RXE_ADD0="rdma link add rxe0 type rxe netdev veth0"
RXE_ADD1="rdma link add rxe1 type rxe netdev veth2"

setup() {
	echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad
	echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad
	ip link set lo up
	ip link add veth0 type veth peer name veth1 &&
	ip link add veth2 type veth peer name veth3 || return 1
	for i in 0 1 2 3; do ip link set veth$i up || return 1; done
	# rxe asks the crypto API for "crc32" at link time: not a symbol dependency.
	modprobe crc32_generic && modprobe rdma_rxe || return 1
	populate_gids || return 1
	$RXE_ADD0 || return 1
	log "setup: rxe0 added"
	$RXE_ADD1
}

# Nearly fill rxe0's GID table (1024 entries) for the GID index tests and
# benchmarks: rxe has RoCE v2 GIDs only, so each IPv6 address of veth0 is one
# entry, after the default GID: 1 + 993 = 994 entries, which leaves room for
# the addresses the tests add and remove (at most 12 at a time). rxe1 keeps a
# small table.
# Added in batches of 128, each logged: on the debug kernel under load this takes minutes,
# and the host counts a silent console as a hang (run.py --stall).
GID_ADDRS=993
populate_gids() {
	i=1
	while [ $i -le $GID_ADDRS ]; do
		: > /tmp/gid-addrs
		n=0
		while [ $n -lt 128 ] && [ $i -le $GID_ADDRS ]; do
			printf 'addr add 2001:db8:1::%x/64 dev veth0\n' $i >> /tmp/gid-addrs
			i=$((i + 1))
			n=$((n + 1))
		done
		ip -6 -batch /tmp/gid-addrs || return 1
		log "setup: $((i - 1)) addresses on veth0"
	done
}

cpus_match() { [ "$(grep -c ^processor /proc/cpuinfo)" = "$SMP" ]; }

# Load and unload the product module with devices present, leaving and
# arriving in between; its exit warns (and the host fails) on any leak.
cycle() {
	insmod /ibext/ibext.ko || return 1
	[ -e $D/rxe0/state ] && [ -e $D/rxe1/state ] || { echo "no state"; return 1; }
	if [ "$1" = churn ]; then
		rdma link delete rxe1 || return 1
		[ ! -e $D/rxe1 ] || { echo "rxe1 state left"; return 1; }
		$RXE_ADD1 || return 1
		[ -e $D/rxe1/state ] || { echo "rxe1 state missing"; return 1; }
		grep -q "device_state made 3 freed 1 live 2" $D/objects ||
			{ cat $D/objects; return 1; }
	fi
	rmmod ibext || return 1
	[ ! -e $D ] || { echo "debugfs left behind"; return 1; }
	if [ "$1" = absent ]; then
		# A device registered while ibext is not loaded is picked up at load.
		rdma link delete rxe1 && $RXE_ADD1
	fi
}

# The C ULP pins ibext: rmmod ibext is refused while it holds pooled CQ
# entries, and a device can still be removed and re-added under it (its
# remove runs before ibext's).
ulp_pins_ibext() {
	insmod /ibext/ibext.ko && insmod /ibext/ibext_test_ulp.ko || return 1
	grep -q " used 64 " $D/rxe0/cq_pools || { cat $D/rxe0/cq_pools; return 1; }
	grep -q "^srq 0 refs 1 posted 32 " $D/rxe0/srq_pool.*/stats ||
		{ cat $D/rxe0/srq_pool.*/stats; return 1; }
	if rmmod ibext 2>/dev/null; then
		echo "rmmod ibext succeeded while a ULP used it"
		return 1
	fi
	rdma link delete rxe1 && $RXE_ADD1 || return 1
	grep -q " used 64 " $D/rxe1/cq_pools || { cat $D/rxe1/cq_pools; return 1; }
	grep -q "^srq 0 refs 1 " $D/rxe1/srq_pool.*/stats ||
		{ cat $D/rxe1/srq_pool.*/stats; return 1; }
	rmmod ibext_test_ulp || return 1
	grep -q "srq_pool made 3 freed 3 live 0" $D/objects || { cat $D/objects; return 1; }
	rmmod ibext || return 1
	[ ! -e $D ] || { echo "debugfs left behind"; return 1; }
}

# An rdma_cm-only ULP (no ib_client, like iSER or NFS/RDMA) runs traffic on
# rxe1 through ibext's pooled CQs (and, every other cycle, an SRQ pool) while
# rxe1 is deleted. rdma_cm is built in, so it registered before ibext and is
# removed from the device after it: the ULP tears down on DEVICE_REMOVAL,
# after ibext's remove. The deletion must complete (a watchdog bounds the
# wait; nothing here depends on the guest's speed), both connections must
# have been torn down, and re-adding the link and reconnecting must work.
# Every poll context is used in turn. The ULP's insmod returns only once
# traffic is flowing.
CM_ADDR=10.11.0.1
CM_CYCLES=10
link_delete_watched() {
	rdma link delete "$1" &
	pid=$!
	t=0
	while kill -0 $pid 2>/dev/null; do
		sleep 1
		t=$((t + 1))
		if [ $t -ge 120 ]; then
			echo "rdma link delete $1 still blocked after ${t}s"
			cat $D/objects 2>/dev/null
			return 1
		fi
	done
	wait $pid
}

cm_ulp_removal() {
	ip addr add $CM_ADDR/24 dev veth2 2>/dev/null
	insmod /ibext/ibext.ko || return 1
	i=0
	while [ $i -lt $CM_CYCLES ]; do
		ctx=$((i % 3))
		srq=$((i / 3 % 2))
		insmod /ibext/ibext_cm_ulp.ko addr=$CM_ADDR poll_ctx=$ctx srq=$srq ||
			{ echo "cycle $i: connect (poll_ctx=$ctx srq=$srq) failed"; return 1; }
		link_delete_watched rxe1 || { echo "cycle $i (poll_ctx=$ctx srq=$srq)"; return 1; }
		r=$(cat /sys/module/ibext_cm_ulp/parameters/removals)
		[ "$r" = 2 ] || { echo "cycle $i: $r connections torn down, want 2"; return 1; }
		rmmod ibext_cm_ulp || return 1
		$RXE_ADD1 || return 1
		i=$((i + 1))
	done
	grep -q "pooled_cq made \([0-9]*\) freed \1 live 0" $D/objects ||
		{ cat $D/objects; return 1; }
	grep -q "srq_pool made \([0-9]*\) freed \1 live 0" $D/objects ||
		{ cat $D/objects; return 1; }
	rmmod ibext || return 1
	echo "$CM_CYCLES removal cycles"
}

# The debug kernel's failslab: KUnit's fail-nth sweeps allocate with
# GFP_KERNEL, which failslab skips by default.
failslab_setup() {
	F=/sys/kernel/debug/failslab
	[ -d $F ] || return 0
	echo N > $F/ignore-gfp-wait
	echo 1 > $F/verbose
}

# kunit <module path>: insert a KUnit module; its suites run during insmod.
kunit() {
	name=$(basename "$1" .ko)
	log "begin kunit $name"
	insmod "$1"
	rc=$?
	log "end kunit $name"
	STEPS=$((STEPS + 1))
	if [ $rc = 0 ] && rmmod "$name"; then
		log "ok $STEPS - insmod and rmmod of the KUnit flavour of $name"
	else
		log "not ok $STEPS - insmod and rmmod of the KUnit flavour of $name"
	fi
}

check() {
	if [ -z "$SUITE" ] || [ "$SUITE" = ibext_guest ]; then
		step "guest sees $SMP CPUs (ACPI)" cpus_match
		step "insmod/rmmod cycle 1" cycle
		step "insmod/rmmod cycle 2, rxe1 removed and re-added while loaded" cycle churn
		step "insmod/rmmod cycle 3, rxe1 re-added while unloaded" cycle absent
		step "insmod/rmmod cycle 4" cycle
		step "a C ULP pins ibext; rxe1 removed and re-added under it" ulp_pins_ibext
		step "an rdma_cm-only ULP: rxe1 deleted under its traffic $CM_CYCLES times" cm_ulp_removal
	fi
	failslab_setup
	if [ "$SUITE" != ibext_guest ]; then
		kunit /ibext/kunit/ibext.ko
	fi
	step "rdma link delete rxe0 rxe1 after the tests" \
		sh -c "rdma link delete rxe0 && rdma link delete rxe1"
}

run() {
	echo "== RDMA devices"
	rdma link show
	echo "== insmod ibext.ko"
	insmod /ibext/ibext.ko || { log "not ok 1 - insmod"; return; }
	echo "== /sys/kernel/debug/ibext"
	for f in $D/*/state; do echo "-- $f"; cat "$f"; done
	echo "-- $D/objects"; cat $D/objects
	echo "== cached GID index (rxe0's table was filled with veth0's IPv6 addresses)"
	for f in $D/*/gid_index; do echo "-- $f"; cat "$f"; done
	echo "== rdma link delete rxe1 (ibext detaches)"
	rdma link delete rxe1
	ls $D
	echo "== rdma link add rxe1 (ibext attaches)"
	$RXE_ADD1
	ls $D
	cat $D/objects
	echo "== rmmod ibext"
	rmmod ibext
	echo "== kernel log"
	dmesg | grep 'ibext:'

	echo "== ping-pong over pooled CQs: 8 loopback RC QPs on rxe0 share the pool"
	echo "   (the KUnit flavour, running only its softirq traffic case)"
	# No trailing newline: the glob is matched as written.
	printf %s ibext_cq_pool.traffic_softirq > /sys/module/kunit/parameters/filter_glob
	insmod /ibext/kunit/ibext.ko || { log "not ok 1 - demo: insmod of the KUnit flavour"; return; }
	dmesg | grep -E '^ *(ok|not ok) [0-9]+ traffic'
	echo "-- $D/rxe0/cq_pools"
	cat $D/rxe0/cq_pools
	echo "-- $D/objects"
	cat $D/objects
	rmmod ibext

	echo "== 16 loopback QPs receiving through an SRQ pool (one SRQ per vector)"
	printf %s ibext_srq.traffic_exactly_once > /sys/module/kunit/parameters/filter_glob
	insmod /ibext/kunit/ibext.ko || { log "not ok 1 - demo: insmod of the KUnit flavour"; return; }
	dmesg | grep -E 'srq traffic|^ *(ok|not ok) [0-9]+ traffic_exactly_once'
	rmmod ibext
	if dmesg | grep -qE '^ *ok [0-9]+ traffic_softirq' &&
	   dmesg | grep -qE '^ *ok [0-9]+ traffic_exactly_once'; then
		log "ok 1 - demo"
	else
		log "not ok 1 - demo: the ping-pong or the SRQ traffic did not pass"
	fi
	STEPS=1
}

if setup > /tmp/setup.log 2>&1; then
	log "setup done"
	case "$MODE" in
	run) run ;;
	bench) kunit /ibext/kunit/ibext.ko ;;
	*) check ;;
	esac
else
	STEPS=1
	log "not ok 1 - guest setup (veth, rdma_rxe, rxe0, rxe1)"
	while read -r l; do log "# $l"; done < /tmp/setup.log
fi
finish
