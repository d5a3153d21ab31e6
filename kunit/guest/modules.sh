#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Loading and unloading ibext with devices present, leaving and arriving in
# between (its exit warns, and the host fails, on any leak), and a C ULP that
# pins it while devices come and go.
. "$(dirname "$0")/lib.sh"

cpus_match() { [ "$(nproc)" = "$SMP" ] || { echo "$(nproc) CPUs, want $SMP"; return 1; }; }

cycle() {
	modprobe ibext || return 1
	[ -e $D/rxe0/state ] && [ -e $D/rxe1/state ] || { echo "no state"; return 1; }
	if [ "$1" = churn ]; then
		rdma link delete rxe1 || return 1
		[ ! -e $D/rxe1 ] || { echo "rxe1 state left"; return 1; }
		$RXE_ADD1 || return 1
		[ -e $D/rxe1/state ] || { echo "rxe1 state missing"; return 1; }
		grep -q "device_state made 3 freed 1 live 2" $D/objects || { cat $D/objects; return 1; }
	fi
	unload_ibext || return 1
	# A device registered while ibext is not loaded is picked up at load.
	[ "$1" != absent ] || { rdma link delete rxe1 && $RXE_ADD1; }
}

# The C ULP holds pooled CQ entries and an SRQ: rmmod ibext is refused, and a
# device is removed and re-added under it (the ULP's remove runs first).
ulp_pins_ibext() {
	modprobe ibext && insmod "$BDIR/test-ulps/ibext_test_ulp.ko" || return 1
	grep -q " used 64 " $D/rxe0/cq_pools || { cat $D/rxe0/cq_pools; return 1; }
	grep -q "^srqs [0-9]* srq_size 32 max_srq_size 64 step 32 " $D/rxe0/srq_pool.*/stats &&
		grep -q "^srq 0 refs 1 bufs 32 posted 32 " $D/rxe0/srq_pool.*/stats ||
		{ cat $D/rxe0/srq_pool.*/stats; return 1; }
	! rmmod ibext 2>/dev/null || { echo "rmmod ibext succeeded while a ULP used it"; return 1; }
	rdma link delete rxe1 && $RXE_ADD1 || return 1
	grep -q " used 64 " $D/rxe1/cq_pools && grep -q "^srq 0 refs 1 " $D/rxe1/srq_pool.*/stats ||
		{ cat $D/rxe1/cq_pools $D/rxe1/srq_pool.*/stats; return 1; }
	rmmod ibext_test_ulp && objects_balanced srq_pool && unload_ibext
}

ktap_print_header
ktap_set_plan 6
step "guest sees $SMP CPUs (ACPI)" cpus_match
step "load/unload cycle 1" cycle
step "load/unload cycle 2, rxe1 removed and re-added while loaded" cycle churn
step "load/unload cycle 3, rxe1 re-added while unloaded" cycle absent
step "load/unload cycle 4" cycle
step "a C ULP pins ibext; rxe1 removed and re-added under it" ulp_pins_ibext
ktap_finished
