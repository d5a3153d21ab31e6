#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# An rdma_cm-only ULP (no ib_client, like iSER or NFS/RDMA) runs traffic on
# rxe1 through ibext's pooled CQs (and, every other cycle, an SRQ pool) while
# rxe1 is deleted. rdma_cm was loaded before ibext, so it is removed from the
# device after it: the ULP tears down on DEVICE_REMOVAL, after ibext's
# remove. The deletion must complete, both connections must have been torn
# down, and re-adding the link and reconnecting must work, in every poll
# context. The ULP's insmod returns only once traffic is flowing.
. "$(dirname "$0")/lib.sh"

# Each of the 3 poll contexts without and with an SRQ pool, once.
CYCLES=6
removal_cycles() {
	ip addr add 10.11.0.1/24 dev veth2
	modprobe ibext || return 1
	for i in $(seq 0 $((CYCLES - 1))); do
		args="addr=10.11.0.1 poll_ctx=$((i % 3)) srq=$((i / 3 % 2))"
		insmod "$BDIR/test-ulps/ibext_cm_ulp.ko" $args || { echo "cycle $i ($args): connect"; return 1; }
		link_delete_watched rxe1 || { echo "cycle $i ($args)"; return 1; }
		r=$(cat /sys/module/ibext_cm_ulp/parameters/removals)
		[ "$r" = 2 ] || { echo "cycle $i: $r connections torn down, want 2"; return 1; }
		rmmod ibext_cm_ulp && $RXE_ADD1 || return 1
	done
	objects_balanced pooled_cq && objects_balanced srq_pool && unload_ibext
}

ktap_print_header
ktap_set_plan 1
step "an rdma_cm-only ULP: rxe1 deleted under its traffic $CYCLES times" removal_cycles
ktap_finished
