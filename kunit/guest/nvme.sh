#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# NVMe over RDMA on ibext: the ports of ulp/, loaded by the kernel under
# upstream's names, connected in loopback over rxe1.
. "$(dirname "$0")/nvme-lib.sh"

nvme_up() { nvme_connect 4 && nvme_uses_ibext; }

verify() {
	modprobe ibext && nvme_target_config && nvme_port_enable && nvme_up || return 1
	fio_verify 1 1 write
}

# The target's SRQs follow the load (ulp/nvmet-rdma.patch): each starts with
# srq_start commands, posts a step more on IBEXT_SRQ_LOW, and retires one on
# IBEXT_SRQ_QUIET, a quiet period (ibext.age_ms, 10 s here) after the last
# limit event. Forced: a namespace on a null_blk device that completes each
# I/O 3 s after it arrives (each read the kernel's partition scan and udev's
# probe make of it takes that long too) holds 7/8 of srq_start commands at
# the target: past the limit (a quarter of what is posted), so an SRQ must
# grow by a step as large as what it holds, after which the limit is not
# reached again; and below srq_start, so no command finds an SRQ empty. No
# RNR NAK may be sent: over rxe one ends nvme-rdma's connection (see
# ulp/nvmet-rdma.patch), so no error recovery of the host either. What each
# SRQ holds is what the port said last (ibext_srq_pool_set_posted()),
# owner_posted in ibext's debugfs, and the most it held owner_posted_peak.
AGE=/sys/module/ibext/parameters/age_ms
srq_all_at() { [ "$(srq_stat max owner_posted)" = $1 ] && [ "$(srq_stat min owner_posted)" = $1 ]; }
recoveries() { dmesg | grep -c 'nvme nvme[0-9]*: starting error recovery'; }
srq_elastic() {
	start=$(cat /sys/module/nvmet_rdma/parameters/srq_start) || return 1
	# Below 1 s, refused and unchanged.
	! echo 999 2>/dev/null > $AGE && [ "$(cat $AGE)" = 60000 ] && echo 10000 > $AGE ||
		{ echo "ibext.age_ms: $(cat $AGE)"; return 1; }
	srq_all_at $start || { echo "SRQs not at srq_start $start"; cat $D/rxe1/srq_pool.*/stats; return 1; }
	B=$CFS/nullb/nullb1 N=$CFS/nvmet/subsystems/$NQN/namespaces/2
	mkdir $B && echo 4 > $B/size && echo 4096 > $B/blocksize && echo 2 > $B/irqmode &&
		echo 3000000000 > $B/completion_nsec && echo 256 > $B/hw_queue_depth &&
		echo 1 > $B/power || return 1
	mkdir $N && echo /dev/nullb1 > $N/device_path && echo 1 > $N/enable || return 1
	wait_for 120 "namespace 2 on the host" nvme_dev 2 >/dev/null || return 1
	le0=$(srq_stat sum limit_events) rnr0=$(rnr_naks) rec0=$(recoveries) hold=$((start * 7 / 8))
	# fio on one CPU: all its commands on that CPU's I/O queue, so on one
	# target queue and one SRQ (a move to another CPU mid-way can split them
	# between two SRQs, neither reaching its limit).
	fio_ok --name=held --filename="$(nvme_dev 2)" --direct=1 --ioengine=libaio --bs=4k \
		--rw=randread --iodepth=$hold --number_ios=$hold --size=4M --cpus_allowed=0 \
		--minimal || return 1
	grown=$(srq_stat max owner_posted_peak) le=$(($(srq_stat sum limit_events) - le0))
	rnr=$(($(rnr_naks) - rnr0)) rec=$(($(recoveries) - rec0))
	note "nvme: $hold held commands: $le SRQ limit events, an SRQ grew from $start to $grown, $rnr RNR NAKs, $rec host error recoveries"
	# rmdir of the enabled namespace, as nvmetcli does: while a namespace is
	# disabled but present, each command for it (the host's rescan, udev's
	# probe) leaks it in 6.12, config_group_find_item() in
	# nvmet_subsys_nsid_exists() taking a reference nobody puts (kmemleak).
	rmdir $N && wait_for 120 "namespace 2 gone" no_nvme_dev 2 &&
		echo 0 > $B/power && rmdir $B || return 1
	[ $le -gt 0 ] && [ $grown -ge $((2 * start)) ] && [ $rnr = 0 ] && [ $rec = 0 ] ||
		{ echo "no growth, or RNR NAKs or a reconnect"; cat $D/rxe1/srq_pool.*/stats; return 1; }
	# One step retired per quiet period.
	wait_for $(((grown / start) * 70 + 60)) "SRQs back at $start" srq_all_at $start ||
		{ cat $D/rxe1/srq_pool.*/stats; return 1; }
	note "nvme: every SRQ back at $start commands after the quiet periods"
	echo 60000 > $AGE || return 1
	# The retired steps' commands come back as commands consume them.
	fio_verify 1 1 verify
}

deep() { fio_verify 4 32 write && fio_verify 2 8 write; }

reconnect() {
	for i in 1 2 3; do
		nvme_down && nvme_up && fio_verify 2 8 verify || { echo "reconnect $i"; return 1; }
	done
}

# rxe1 deleted under fio: the deletion must finish, fio must end (its I/O
# fails or is requeued as NVMe's error handling decides), and once the link
# is back and the port re-enabled (rdma_cm destroyed its listener), a new
# connect and a verified pass must work.
link_delete() {
	dev=$(nvme_dev) && fio_unplug $dev nvme || return 1
	wait_for 120 "controller gone with rxe1" no_nvme_dev && $RXE_ADD1 &&
		wait_for 300 "rxe1's GID of $NVME_ADDR" gid_of_nvme_addr || return 1
	nvme_port_disable && nvme_port_enable && nvme_up && fio_verify 4 32 write
}

# Pooled CQs stay until the device or ibext goes; their entries must be back.
unload() {
	nvme_down && rmmod nvme_rdma && nvme_target_down && rmmod nvme_fabrics nvme_core || return 1
	[ "$(cqes_in_use)" = 0 ] || { cat $D/rxe1/cq_pools; return 1; }
	objects_balanced srq_pool && unload_ibext
}

ktap_print_header
ktap_set_plan 6
step "NVMe over RDMA on ibext: connect, fio verified at depth 1" verify
step "NVMe over RDMA on ibext: the target's SRQs grow under held commands, give back when quiet" srq_elastic
step "NVMe over RDMA on ibext: fio verified at depths 32, 8" deep
step "NVMe over RDMA on ibext: 3 reconnects, data verified after each" reconnect
step "NVMe over RDMA on ibext: rxe1 deleted under fio, re-added, verified again" link_delete
step "NVMe over RDMA on ibext: disconnect and unload, nothing left" unload
ktap_finished
