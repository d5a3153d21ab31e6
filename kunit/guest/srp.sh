#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# SRP on ibext: the ports of ulp/ (ib_srpt, the LIO target, with its CQs
# and, with use_srq, its SRQs from ibext; ib_srp, the initiator, with its
# receive CQs from ibext's pool in ADAPTIVE mode), loaded by modprobe under
# upstream's names, in loopback over rxe1 (srp-lib.sh).
. "$(dirname "$0")/srp-lib.sh"

ports() {
	modprobe ib_srpt && modprobe ib_srp || return 1
	for m in ib_srpt ib_srp; do
		modinfo -n $m | grep -q /updates/ || { echo "$m is not the port"; return 1; }
	done
}

login() { modprobe ibext && ports && srp_target_up && srp_login && srp_uses_ibext; }

# srp_fio <jobs> <depth> <write|verify>: nvme-lib.sh's fio pass on the SRP
# disk.
srp_fio() {
	fio_pass s "$(srp_dev)" "$@" || { rxe_errors; return 1; }
	note "srp: fio $3, $1 jobs $2 deep, every block of ${NS_MB} MiB verified; rxe1 errors: $(rxe_errors)"
}

verify() { srp_fio 4 16 write; }
relogin() { srp_logout && srp_login && srp_uses_ibext && srp_fio 4 16 verify; }

# rxe1 deleted under fio: both ports' client remove runs (the initiator's
# removes its target port, the target's waits for its channels), then the
# deletion must finish and fio end. Then rxe1 again, the target made anew
# (its configfs port belonged to the removed device) and a verified pass.
link_delete() {
	srp_names && dev=$(srp_dev) && fio_unplug $dev srp || return 1
	wait_for 120 "SRP disk gone with rxe1" no_srp_dev && srp_target_down && $RXE_ADD1 || return 1
	srp_target_up && srp_login && srp_uses_ibext && srp_fio 4 16 write
}

unload() {
	# srpt's configfs directory holds its fabric module.
	srp_logout && unload_initiator ib_srp && srp_target_down && rmdir $T/srpt && rmmod ib_srpt ||
		return 1
	[ "$(cqes_in_use)" = 0 ] || { cat $D/rxe1/cq_pools; return 1; }
	objects_balanced srq_pool && unload_ibext && rm $IMG
}

ktap_print_header
ktap_set_plan 5
step "SRP on ibext: LIO target with use_srq, login over rxe1, CQs and SRQs in ibext's debugfs" login
step "SRP on ibext: fio verified, 4 jobs 16 deep" verify
step "SRP on ibext: logout, login again, data verified" relogin
step "SRP on ibext: rxe1 deleted under fio, re-added, verified again" link_delete
step "SRP on ibext: logout and unload, nothing left" unload
ktap_finished
