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
export PATH=/usr/sbin:/usr/bin:/bin:/sbin
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
	grep -q "^srqs [0-9]* srq_size 32 max_srq_size 64 step 32 " $D/rxe0/srq_pool.*/stats ||
		{ cat $D/rxe0/srq_pool.*/stats; return 1; }
	grep -q "^srq 0 refs 1 bufs 32 posted 32 " $D/rxe0/srq_pool.*/stats ||
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

# NVMe over RDMA through ibext: the ports of ulp/ (nvmet-rdma-ibext as the
# target, nvme-rdma-ibext as the host) in this guest, looped back over rxe1.
# Not rxe0: an address whose GID index is above 255 cannot be connected to
# (struct ib_global_route's sgid_index is a u8), and rxe0's table is filled
# to 994 entries for the GID tests. The namespace is a memory-backed null_blk
# device, so data written before a reconnect can be verified after it. Every
# wait is bounded by a watchdog, never by a sleep that assumes the guest's
# speed.
NVME_ADDR=10.12.0.1
NVME_RXE=rxe1
NVME_RXE_ADD=$RXE_ADD1
NQN=nqn.2026-12.org.ibext:$NVME_RXE
HOSTID=4f2c8a1e-6d3b-4e5f-8a9b-0c1d2e3f4a5b
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:$HOSTID
CFS=/sys/kernel/config
# KASAN makes each I/O about ten times slower: the debug kernel verifies a
# smaller namespace (its bugs show as reports, not as volume).
NS_MB=32
[ "$FLAVOUR" = debug ] && NS_MB=4
NVME_IOQ=4
# The ports of ulp/: the target and the host.
PORT_TARGET=/ibext/ulp/nvmet-rdma-ibext.ko
PORT_HOST=/ibext/ulp/nvme-rdma-ibext.ko

# wait_for <seconds> <what> <command...>: poll once a second until the command
# succeeds; fail with <what> after <seconds>.
wait_for() {
	limit=$1 what=$2
	shift 2
	t=0
	until "$@"; do
		sleep 1
		t=$((t + 1))
		[ $t -lt "$limit" ] || { echo "$what: not after ${t}s"; return 1; }
	done
}

nvme_target_up() {
	nvme_target_config && insmod $PORT_TARGET && nvme_port_enable
}

# The namespace, subsystem and port in configfs; no transport loaded, the
# port not enabled.
nvme_target_config() {
	grep -q " $CFS " /proc/mounts || mount -t configfs configfs $CFS || return 1
	ip addr add $NVME_ADDR/24 dev veth2 2>/dev/null
	wait_for 300 "$NVME_RXE's GID of $NVME_ADDR" gid_of_nvme_addr || return 1
	modprobe null_blk nr_devices=0 && modprobe nvmet || return 1
	B=$CFS/nullb/nullb0
	mkdir $B && echo $NS_MB > $B/size && echo 4096 > $B/blocksize &&
		echo 1 > $B/memory_backed && echo 1 > $B/power || return 1
	S=$CFS/nvmet/subsystems/$NQN
	mkdir $S && echo 1 > $S/attr_allow_any_host || return 1
	mkdir $S/namespaces/1 && echo /dev/nullb0 > $S/namespaces/1/device_path &&
		echo 1 > $S/namespaces/1/enable || return 1
	P=$CFS/nvmet/ports/1
	mkdir $P && echo rdma > $P/addr_trtype && echo ipv4 > $P/addr_adrfam &&
		echo $NVME_ADDR > $P/addr_traddr && echo 4420 > $P/addr_trsvcid
}

# Linking the subsystem to the port makes nvmet-rdma listen on it.
nvme_port_enable() { ln -s $CFS/nvmet/subsystems/$NQN $CFS/nvmet/ports/1/subsystems/$NQN; }
nvme_port_disable() { rm $CFS/nvmet/ports/1/subsystems/$NQN; }

nvme_target_down() {
	nvme_port_disable || return 1
	rmdir $CFS/nvmet/ports/1 $CFS/nvmet/subsystems/$NQN/namespaces/1 \
		$CFS/nvmet/subsystems/$NQN || return 1
	rmmod nvmet_rdma_ibext || return 1
	rmdir $CFS/nullb/nullb0 || return 1
	rmmod nvmet null_blk
}

nvme_dev() {
	for b in /sys/block/nvme*n1; do
		[ -e "$b" ] && echo /dev/${b##*/} && return 0
	done
	return 1
}
no_nvme_dev() { ! nvme_dev >/dev/null; }
# gone <pid>: the process has ended.
gone() { ! kill -0 "$1" 2>/dev/null; }

nvme_up() {
	modprobe nvme_fabrics || return 1
	grep -q '^nvme_rdma_ibext ' /proc/modules || insmod $PORT_HOST || return 1
	nvme_connect $NVME_IOQ
}

# nvme_connect <I/O queues>: with whichever "rdma" host transport is loaded.
nvme_connect() {
	# A 60 s keep-alive: keep-alive timeouts must not depend on the guest's speed.
	nvme connect -t rdma -a $NVME_ADDR -s 4420 -n $NQN --hostnqn=$HOSTNQN \
		--hostid=$HOSTID -i $1 -k 60 || return 1
	wait_for 120 "namespace of $NQN" nvme_dev >/dev/null
}

nvme_down() {
	nvme disconnect -n $NQN >/dev/null || return 1
	wait_for 120 "controller of $NQN gone" no_nvme_dev
}

# fio_verify <jobs> <depth> <write|verify>: <jobs> jobs at queue depth <depth>,
# each on its own slice of the namespace, 4 KiB random writes each verified
# by reading it back (crc32c); "verify" only reads and verifies what a
# previous "write" pass of the same shape wrote.
fio_verify() {
	nj=$1 depth=$2 what=$3
	slice=$((NS_MB / nj))
	set -- --name=v$nj.$depth --filename="$(nvme_dev)" --direct=1 --ioengine=libaio \
		--bs=4k --rw=randwrite --numjobs=$nj --iodepth=$depth --size=${slice}M \
		--offset_increment=${slice}M --verify=crc32c --verify_fatal=1 \
		--randseed=$((nj * 100 + depth)) --group_reporting --minimal
	[ "$what" = verify ] && set -- "$@" --verify_only
	out=$(fio "$@") || { echo "$out"; return 1; }
	# --minimal: field 5 is the error number; fio also exits non-zero on a failed verify.
	echo "$out" | awk -F';' '$5 != 0 { bad = 1 } END { exit bad }' || { echo "$out"; return 1; }
	log "# nvme: fio $what, $nj jobs at depth $depth over ${NS_MB} MiB: every block verified"
}

# RNR NAKs the responders of every rxe device have sent: a receive arrived
# with no receive posted (on an SRQ: the SRQ ran dry).
rnr_naks() {
	cat /sys/class/infiniband/rxe*/ports/*/hw_counters/send_rnr_err 2>/dev/null |
		awk '{ n += $1 } END { print n + 0 }'
}

# The ports' queues hold entries on the pooled CQs and the target's SRQ pool.
cqes_in_use() { awk '$6 == "used" { n += $7 } END { print n + 0 }' $D/$NVME_RXE/cq_pools; }
nvme_uses_ibext() {
	ls $D/$NVME_RXE/srq_pool.* >/dev/null 2>&1 ||
		{ echo "no SRQ pool on $NVME_RXE"; ls $D/$NVME_RXE; return 1; }
	[ "$(cqes_in_use)" -gt 0 ] ||
		{ echo "no pooled CQ in use on $NVME_RXE"; cat $D/$NVME_RXE/cq_pools; return 1; }
}

# rdma_cm binds to an address only once its GID is in the device's table,
# which roce_gid_mgmt fills from a work item after the address or the device
# appears.
gid_of_nvme_addr() { grep -qs "ffff:0a0c:0001" /sys/class/infiniband/$NVME_RXE/ports/1/gids/*; }

nvme_verify() {
	insmod /ibext/ibext.ko && nvme_target_up && nvme_up || return 1
	nvme_uses_ibext || return 1
	fio_verify 1 1 write
}
nvme_verify_deep() { fio_verify 4 32 write && fio_verify 2 8 write; }

# The target's SRQs follow the load (ulp/nvmet-rdma.patch): each starts with
# srq_start commands, posts a step more when ibext says IBEXT_SRQ_LOW, and
# retires one when it says IBEXT_SRQ_QUIET, a quiet period (60 s) after the
# last limit event. Forced: a second namespace on a null_blk device that
# completes each I/O 5 s after it arrives holds every command of a fio at
# the target, 7/8 of srq_start on one SRQ: past the limit (a quarter of what
# is posted), so the SRQ must grow, by a step as large as what it holds,
# after which the limit is not reached again; and below srq_start, so no
# command finds the SRQ empty. No RNR NAK may be sent: over rxe one ends
# nvme-rdma's connection (see ulp/nvmet-rdma.patch), which the step also
# checks for (no error recovery of the host). What each SRQ holds is what the port said last
# (ibext_srq_pool_set_posted()), shown as owner_posted in ibext's debugfs.
NVME_HOLD_NS=2
# srq_said <max|min>: the largest or smallest owner_posted over the SRQs.
srq_said() {
	cat $D/$NVME_RXE/srq_pool.*/stats |
		awk -v w=$1 '/^srq / { for (i = 1; i < NF; i++) if ($i == "owner_posted") {
			v = $(i + 1); if (n++ == 0 || (w == "max" ? v > m : v < m)) m = v } }
			END { print m + 0 }'
}
srq_all_at() { [ "$(srq_said max)" = "$1" ] && [ "$(srq_said min)" = "$1" ]; }
held_dev() {
	for b in /sys/block/nvme*n$NVME_HOLD_NS; do
		[ -e "$b" ] && echo /dev/${b##*/} && return 0
	done
	return 1
}
no_held_dev() { ! held_dev >/dev/null; }
# The host's error recoveries so far (each is a reconnect).
recoveries() { dmesg | grep -c 'nvme nvme[0-9]*: starting error recovery'; }
nvme_srq_elastic() {
	start=$(cat /sys/module/nvmet_rdma_ibext/parameters/srq_start) || return 1
	srq_all_at $start || { echo "SRQs not at srq_start $start"; cat $D/$NVME_RXE/srq_pool.*/stats; return 1; }
	B1=$CFS/nullb/nullb1 N2=$CFS/nvmet/subsystems/$NQN/namespaces/$NVME_HOLD_NS
	mkdir $B1 && echo 4 > $B1/size && echo 4096 > $B1/blocksize && echo 2 > $B1/irqmode &&
		echo 5000000000 > $B1/completion_nsec && echo 256 > $B1/hw_queue_depth &&
		echo 1 > $B1/power || return 1
	mkdir $N2 && echo /dev/nullb1 > $N2/device_path && echo 1 > $N2/enable || return 1
	wait_for 120 "namespace $NVME_HOLD_NS on the host" held_dev >/dev/null || return 1
	le0=$(nb_srq limit_events) rnr0=$(rnr_naks) rec0=$(recoveries)
	hold=$((start * 7 / 8))
	out=$(fio --name=held --filename="$(held_dev)" --direct=1 --ioengine=libaio --bs=4k \
		--rw=randread --numjobs=1 --iodepth=$hold --number_ios=$hold --size=4M --minimal) ||
		{ echo "$out"; return 1; }
	echo "$out" | awk -F';' '$5 != 0 { bad = 1 } END { exit bad }' || { echo "$out"; return 1; }
	grown=$(srq_said max) le=$(($(nb_srq limit_events) - le0)) rnr=$(($(rnr_naks) - rnr0))
	rec=$(($(recoveries) - rec0))
	log "# nvme: $hold held commands: $le SRQ limit events, an SRQ grew from $start to $grown, $rnr RNR NAKs, $rec host error recoveries"
	echo 0 > $N2/enable && rmdir $N2 || return 1
	wait_for 120 "namespace $NVME_HOLD_NS gone from the host" no_held_dev || return 1
	echo 0 > $B1/power && rmdir $B1 || return 1
	[ $le -gt 0 ] && [ $grown -ge $((2 * start)) ] && [ $rnr = 0 ] && [ $rec = 0 ] ||
		{ echo "no growth, or RNR NAKs or a reconnect"; cat $D/$NVME_RXE/srq_pool.*/stats; return 1; }
	# One step per quiet period (60 s after the last limit event).
	wait_for $(((grown / start) * 70 + 60)) "SRQs back at $start after quiet periods" \
		srq_all_at $start || { cat $D/$NVME_RXE/srq_pool.*/stats; return 1; }
	log "# nvme: every SRQ back at $start commands after the quiet periods"
	# The retired steps' commands come back as commands consume them.
	fio_verify 1 1 verify
}

NVME_RECONNECTS=3
nvme_reconnect() {
	i=0
	while [ $i -lt $NVME_RECONNECTS ]; do
		nvme_down && nvme_up || { echo "reconnect $i"; return 1; }
		fio_verify 2 8 verify || { echo "reconnect $i"; return 1; }
		i=$((i + 1))
	done
}

# The device deleted while fio runs: the link deletion must finish, fio must
# end (its I/O fails or is requeued as NVMe's error handling decides), and
# after the link is back and the port re-enabled (its listener was bound to
# the device, and rdma_cm destroyed it), a new connect and a verified pass
# must work.
# I/Os completed on block device $1 (reads plus writes).
io_done() { awk '{ print $1 + $5 }' /sys/block/$1/stat; }
# True once fio ($1) has ended or 512 more I/Os than $3 completed on $2.
fio_going() { gone $1 || [ "$(io_done $2)" -ge $(($3 + 512)) ]; }
nvme_link_delete() {
	dev=$(nvme_dev) || return 1
	fio --name=unplug --filename=$dev --direct=1 --ioengine=libaio --bs=4k --rw=randrw \
		--numjobs=2 --iodepth=16 --time_based --runtime=3600 --minimal > /tmp/fio-unplug 2>&1 &
	fpid=$!
	wait_for 300 "fio doing I/O" fio_going $fpid ${dev##*/} "$(io_done ${dev##*/})" ||
		{ kill $fpid; return 1; }
	! gone $fpid || { echo "fio ended before the deletion"; cat /tmp/fio-unplug; return 1; }
	link_delete_watched $NVME_RXE || return 1
	wait_for 300 "fio ending after $NVME_RXE was deleted" gone $fpid ||
		{ kill -9 $fpid; return 1; }
	wait $fpid
	log "# nvme: fio under the link deletion exited with $? ($(wc -l < /tmp/fio-unplug) lines)"
	wait_for 120 "controller gone with $NVME_RXE" no_nvme_dev || return 1
	$NVME_RXE_ADD || return 1
	wait_for 300 "$NVME_RXE's GID of $NVME_ADDR" gid_of_nvme_addr || return 1
	nvme_port_disable && nvme_port_enable || return 1
	nvme_up || return 1
	nvme_uses_ibext || return 1
	fio_verify 4 32 write
}

nvme_unload() {
	nvme_down && rmmod nvme_rdma_ibext && nvme_target_down || return 1
	rmmod nvme_fabrics nvme_core 2>/dev/null
	# Pooled CQs stay until the device or ibext goes; their entries must be back.
	[ "$(cqes_in_use)" = 0 ] || { cat $D/$NVME_RXE/cq_pools; return 1; }
	grep -q "srq_pool made \([0-9]*\) freed \1 live 0" $D/objects || { cat $D/objects; return 1; }
	rmmod ibext || return 1
	[ ! -e $D ] || { echo "debugfs left behind"; return 1; }
}

nvme_steps() {
	step "NVMe over RDMA on ibext: connect, fio verified at depth 1" nvme_verify
	step "NVMe over RDMA on ibext: the target's SRQs grow under held commands, give back when quiet" nvme_srq_elastic
	step "NVMe over RDMA on ibext: fio verified at depths 32, 8" nvme_verify_deep
	step "NVMe over RDMA on ibext: $NVME_RECONNECTS reconnects, data verified after each" nvme_reconnect
	step "NVMe over RDMA on ibext: $NVME_RXE deleted under fio, re-added, verified again" nvme_link_delete
	step "NVMe over RDMA on ibext: disconnect and unload, nothing left" nvme_unload
}

# make bench: NVMe over RDMA through upstream's nvme-rdma and nvmet-rdma
# against the ports of ulp/, side by side in this boot. Each of
# NB_REPS repetitions loads one pair, connects ($SMP I/O queues), runs every
# fio point, disconnects and unloads, then does the same with the other pair;
# the order alternates. A point is fio's 4 KiB random reads at one queue depth
# and job count for NB_SECS seconds of guest time, after a 1 s ramp. Its
# completion events are counted the same way for both pairs, as calls of a
# CQ's completion handler: ib_core's cq_schedule tracepoint for ib_core's
# CQs (upstream's pool, and the MAD CQs for both), plus the "events" of
# ibext's pooled CQs (which do not go through ib_core's handlers).
NB_REPS=5
NB_SECS=3
TR=/sys/kernel/tracing
nb_pair() {
	case $1.$2 in
	upstream.load) modprobe nvmet-rdma && modprobe nvme-rdma ;;
	upstream.unload) rmmod nvme_rdma nvmet_rdma ;;
	ibext.load) insmod $PORT_TARGET && insmod $PORT_HOST ;;
	ibext.unload) rmmod nvme_rdma_ibext nvmet_rdma_ibext ;;
	esac
}
nb_events() {
	core=$(awk '/^ *Hits:/ { print $2; exit }' $TR/events/rdma_core/cq_schedule/hist)
	ours=$(cat $D/*/cq_pools 2>/dev/null |
		awk '{ for (i = 1; i < NF; i++) if ($i == "events") n += $(i + 1) } END { print n + 0 }')
	echo $((${core:-0} + ours))
}
# nb_srq <stat>: the sum of one counter over every SRQ of ibext's SRQ pools
# (the port's target; upstream's nvmet-rdma has none): limit_events, the
# SRQ limit events, and limit_arms, the ib_modify_srq() calls that arm it.
# A point reports both over its fio window, and the arms since the pools
# were made (one per SRQ at creation: a reading of 0 there means no pool).
nb_srq() {
	cat $D/*/srq_pool.*/stats 2>/dev/null |
		awk -v k=$1 '/^srq / { for (i = 1; i < NF; i++) if ($i == k) n += $(i + 1) } END { print n + 0 }'
}
# nb_point <setup> <rep> <order> <jobs> <depth>: one fio run, one bench line.
nb_point() {
	dev=$(nvme_dev) || return 1
	le0=$(nb_srq limit_events) la0=$(nb_srq limit_arms) rnr0=$(rnr_naks)
	ev0=$(nb_events) io0=$(io_done ${dev##*/})
	out=$(fio --name=nb --filename="$(nvme_dev)" --direct=1 --ioengine=libaio --bs=4k \
		--rw=randread --numjobs=$4 --iodepth=$5 --size=${NS_MB}M --time_based \
		--ramp_time=1 --runtime=$NB_SECS --percentile_list=99 --group_reporting \
		--minimal) || { echo "$out"; return 1; }
	ev1=$(nb_events) io1=$(io_done ${dev##*/})
	le1=$(nb_srq limit_events) la1=$(nb_srq limit_arms) rnr1=$(rnr_naks)
	# --minimal: field 8 is read IOPS; the first "99.000000%=" field is the read
	# completion latency's p99 in microseconds. Events and I/Os are counted over
	# the same window (the ramp included).
	echo "$out" | awk -F';' -v s=$1 -v r=$2 -v o=$3 -v j=$4 -v d=$5 -v ev=$((ev1 - ev0)) \
		-v ios=$((io1 - io0)) -v le=$((le1 - le0)) -v la=$((la1 - la0)) \
		-v lt=$la1 -v rnr=$((rnr1 - rnr0)) '
		$5 != 0 { exit 1 }
		{ for (i = 18; i <= NF; i++) if ($i ~ /^99\.0+%=/) { split($i, p, "="); break }
		  printf "ibext-bench: {\"bench\":\"nvme\",\"setup\":\"%s\",\"jobs\":%d,\"depth\":%d,\"rep\":%d,\"order\":%d,\"iops\":%d,\"clat_p99_us\":%d,\"events_per_io\":%.4f,\"srq_limit_events\":%d,\"srq_limit_arms\":%d,\"srq_limit_arms_total\":%d,\"ios\":%d,\"rnr_naks\":%d,\"rnr_naks_per_io\":%.5f}\n", s, j, d, r, o, $8, p[2], (ios ? ev / ios : 0), le, la, lt, ios, rnr, (ios ? rnr / ios : 0) }' \
		> /dev/kmsg || { echo "fio: $out"; return 1; }
}
nb_setup() {
	setup=$1 rep=$2 order=$3
	nb_pair $setup load && nvme_port_enable && nvme_connect $SMP || return 1
	for point in "1 1" "1 32" "$SMP 1" "$SMP 32"; do
		nb_point $setup $rep $order $point || return 1
	done
	nvme_down && nvme_port_disable && nb_pair $setup unload
}
# The target's receive buffers (its commands, their nvme_command and their
# inline-data pages) when <controllers> hosts connect with <queues> I/O queues
# each: the bytes allocated under nvmet_rdma_alloc_cmd*() and
# nvmet_rdma_alloc_inline_pages() while they connect, read off kmem
# histograms keyed by stack trace. The host is upstream's nvme-rdma for all
# three targets: upstream's nvmet-rdma, the same with use_srq=1, and the port.
nb_hist_bytes() {
	awk -v per=$2 '
		/^\{/ { mine = 0 }
		/nvmet_rdma_alloc_cmd|nvmet_rdma_alloc_inline_pages/ { mine = 1 }
		/^\}/ && mine {
			for (i = 1; i < NF; i++) {
				if ($i == "hitcount:") h = $(i + 1)
				if ($i == "bytes_alloc:") b = $(i + 1)
			}
			n += per ? h * per : b
		}
		END { print n + 0 }' $TR/events/kmem/$1/hist
}
nb_mem() {
	setup=$1 nctrl=$2 nq=$3 rep=$4 order=$5
	case $setup in
	upstream) modprobe nvmet-rdma ;;
	upstream_srq) modprobe nvmet-rdma use_srq=1 ;;
	ibext) insmod $PORT_TARGET ;;
	esac || return 1
	nvme_port_enable || return 1
	echo "hist:keys=common_stacktrace:vals=bytes_alloc" > $TR/events/kmem/kmalloc/trigger &&
		echo "hist:keys=common_stacktrace" > $TR/events/kmem/mm_page_alloc/trigger || return 1
	c=0
	while [ $c -lt $nctrl ]; do
		# A host ID of its own for every connect of the benchmark.
		NB_HOSTS=$((NB_HOSTS + 1))
		id=$HOSTID_PREFIX$(printf %02x $NB_HOSTS)
		# Through the kernel's interface: nvme-cli refuses a second controller to
		# the same address and subsystem ("already connected"), even from another host.
		echo "transport=rdma,traddr=$NVME_ADDR,trsvcid=4420,nqn=$NQN,keep_alive_tmo=60,nr_io_queues=$nq,hostnqn=nqn.2014-08.org.nvmexpress:uuid:$id,hostid=$id" \
			> /dev/nvme-fabrics || return 1
		c=$((c + 1))
	done
	# Inline-data pages are order 0 (one page of inline data, the default).
	bytes=$(($(nb_hist_bytes kmalloc) + $(nb_hist_bytes mm_page_alloc 4096)))
	echo "!hist:keys=common_stacktrace:vals=bytes_alloc" > $TR/events/kmem/kmalloc/trigger
	echo "!hist:keys=common_stacktrace" > $TR/events/kmem/mm_page_alloc/trigger
	printf 'ibext-bench: {"bench":"nvme_mem","setup":"%s","host_queues":%d,"controllers":%d,"rep":%d,"order":%d,"target_recv_bytes":%d}\n' \
		$setup $((nctrl * nq)) $nctrl $rep $order $bytes > /dev/kmsg
	nvme disconnect -n $NQN >/dev/null || return 1
	wait_for 120 "controllers of $NQN gone" no_nvme_ctrl || return 1
	nvme_port_disable || return 1
	case $setup in
	ibext) rmmod nvmet_rdma_ibext ;;
	*) rmmod nvmet_rdma ;;
	esac
}
HOSTID_PREFIX=4f2c8a1e-6d3b-4e5f-8a9b-0c1d2e3f4a
NB_HOSTS=0
no_nvme_ctrl() { ! ls -d /sys/class/nvme/nvme* >/dev/null 2>&1; }
# NB_MEM_REPS repetitions of the three targets, their order rotated, so that
# every ratio has a median and a range (a page more or less is 4 KiB of noise).
NB_MEM_REPS=3
nvme_bench_mem() {
	modprobe nvme-rdma || return 1
	rep=0
	while [ $rep -lt $NB_MEM_REPS ]; do
		case $((rep % 3)) in
		0) set -- upstream upstream_srq ibext ;;
		1) set -- upstream_srq ibext upstream ;;
		2) set -- ibext upstream upstream_srq ;;
		esac
		order=0
		for setup in "$@"; do
			nb_mem $setup 1 1 $rep $order && nb_mem $setup 2 2 $rep $order &&
				nb_mem $setup 8 2 $rep $order || return 1
			order=$((order + 1))
		done
		rep=$((rep + 1))
	done
	rmmod nvme_rdma
}

nb_prepare() {
	insmod /ibext/ibext.ko && nvme_target_config && modprobe nvme_fabrics || return 1
	grep -q " $TR " /proc/mounts || mount -t tracefs tracefs $TR
}
nvme_mem_only() { nb_prepare && nvme_bench_mem; }
nvme_bench() {
	nb_prepare || return 1
	echo "hist:keys=cq_id" > $TR/events/rdma_core/cq_schedule/trigger || return 1
	rep=0
	while [ $rep -lt $NB_REPS ]; do
		if [ $((rep % 2)) = 0 ]; then set -- upstream ibext; else set -- ibext upstream; fi
		nb_setup $1 $rep 0 && nb_setup $2 $rep 1 || return 1
		rep=$((rep + 1))
	done
	log "# nvme bench: $NB_REPS repetitions of both pairs"
	nvme_bench_mem
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
	if [ "$SUITE" != ibext_guest ] && [ "$SUITE" != ibext_nvme ]; then
		kunit /ibext/kunit/ibext.ko
	fi
	if [ -z "$SUITE" ] || [ "$SUITE" = ibext_nvme ]; then
		nvme_steps
	fi
	step "rdma link delete rxe0 rxe1 after the tests" \
		sh -c "rdma link delete rxe0 && rdma link delete rxe1"
}

# The kernel log without its timestamps (printk.time=1), so that KTAP lines
# can be matched from their start.
kmsg() { dmesg | sed 's/^\[[^]]*\] *//'; }

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
	kmsg | grep -E '^ *(ok|not ok) [0-9]+ traffic'
	echo "-- $D/rxe0/cq_pools"
	cat $D/rxe0/cq_pools
	echo "-- $D/objects"
	cat $D/objects
	rmmod ibext

	echo "== 16 loopback QPs receiving through an SRQ pool (one SRQ per vector)"
	printf %s ibext_srq.traffic_exactly_once > /sys/module/kunit/parameters/filter_glob
	insmod /ibext/kunit/ibext.ko || { log "not ok 1 - demo: insmod of the KUnit flavour"; return; }
	kmsg | grep -E 'srq traffic|^ *(ok|not ok) [0-9]+ traffic_exactly_once'
	rmmod ibext

	echo "== NVMe over RDMA on ibext: nvmet-rdma-ibext serves a null_blk namespace on"
	echo "   $NVME_ADDR ($NVME_RXE), nvme-rdma-ibext connects to it in loopback (ports in ulp/)"
	nvme=fail
	if insmod /ibext/ibext.ko && nvme_target_up && nvme_up; then
		nvme list
		echo "-- fio: 4 jobs of 4 KiB random writes at depth 32, each block read back and verified"
		fio_verify 4 32 write && nvme=ok
		echo "-- $D/$NVME_RXE/cq_pools (host queues: softirq; target queues: workqueue)"
		cat $D/$NVME_RXE/cq_pools
		for f in $D/$NVME_RXE/srq_pool.*/stats; do echo "-- $f"; cat "$f"; done
		echo "-- nvme disconnect, unload the ports and ibext"
		nvme_unload || nvme=fail
	fi
	if kmsg | grep -qE '^ *ok [0-9]+ traffic_softirq' &&
	   kmsg | grep -qE '^ *ok [0-9]+ traffic_exactly_once' && [ $nvme = ok ]; then
		log "ok 1 - demo"
	else
		log "not ok 1 - demo: the ping-pong, the SRQ traffic or NVMe over RDMA did not pass"
	fi
	STEPS=1
}

if setup > /tmp/setup.log 2>&1; then
	log "setup done"
	case "$MODE" in
	run) run ;;
	bench)
		case "$SUITE" in
		ibext_nvme_*) ;;
		*) kunit /ibext/kunit/ibext.ko ;;
		esac
		case "$SUITE" in
		""|ibext_nvme_bench)
			step "NVMe over RDMA benchmark: upstream's modules and the ports" nvme_bench ;;
		ibext_nvme_mem)
			step "NVMe over RDMA target receive memory" nvme_mem_only ;;
		esac
		;;
	*) check ;;
	esac
else
	STEPS=1
	log "not ok 1 - guest setup (veth, rdma_rxe, rxe0, rxe1)"
	while read -r l; do log "# $l"; done < /tmp/setup.log
fi
finish
