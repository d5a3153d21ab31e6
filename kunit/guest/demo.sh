#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# make run: what ibext sees and does, shown on the console; one KTAP result.
. "$(dirname "$0")/nvme-lib.sh"

show() { for f in "$@"; do echo "-- $f"; cat "$f"; done; }
# kunit_case <glob>: one case of the KUnit flavour, and its result line.
kunit_case() {
	printf %s "$1" > /sys/module/kunit/parameters/filter_glob
	insmod "$BDIR/kunit/ibext.ko" || return 1
	dmesg | sed 's/^\[[^]]*\] *//' | grep -E "^ *(not )?ok [0-9]+ ${1#*.}\$" | tail -n 1 | tee /tmp/case
	grep -q "^ *ok" /tmp/case
}

demo() {
	echo "== RDMA devices"
	rdma link show
	echo "== modprobe ibext"
	modprobe ibext || return 1
	show $D/*/state $D/objects
	echo "== cached GID index (rxe0's table holds veth0's 993 IPv6 addresses)"
	show $D/*/gid_index
	echo "== rdma link delete rxe1 (ibext detaches), then add (ibext attaches)"
	rdma link delete rxe1 && ls $D && $RXE_ADD1 && ls $D && show $D/objects || return 1
	unload_ibext || return 1
	echo "== ping-pong over pooled CQs: 8 loopback RC QPs on rxe0 share the pool (KUnit flavour)"
	kunit_case ibext_cq_pool.traffic_softirq && show $D/rxe0/cq_pools $D/objects && rmmod ibext || return 1
	echo "== 16 loopback QPs receiving through an SRQ pool (one SRQ per vector)"
	kunit_case ibext_srq.traffic_exactly_once && rmmod ibext || return 1
	echo "== NVMe over RDMA on ibext: the ports of ulp/ serve and connect to a null_blk"
	echo "   namespace on $NVME_ADDR (rxe1), loaded by the kernel as nvmet-rdma and nvme-rdma"
	modprobe ibext && nvme_target_config && nvme_port_enable && nvme_connect 4 || return 1
	nvme list
	echo "-- fio: 4 jobs of 4 KiB random writes at depth 32, every block read back and verified"
	fio_verify 4 32 write || return 1
	show $D/rxe1/cq_pools $D/rxe1/srq_pool.*/stats
	nvme_down && rmmod nvme_rdma && nvme_target_down && unload_ibext
}

ktap_print_header
ktap_set_plan 1
# The demo's own output on the console as it goes, the result in KTAP.
if demo > /dev/console 2>&1; then ktap_test_pass demo; else ktap_test_fail demo; fi
ktap_finished
