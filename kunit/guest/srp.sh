#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# SRP on ibext: the ports of ulp/ (ib_srpt, the LIO target, with its CQs
# and, with use_srq, its SRQs from ibext; ib_srp, the initiator, with its
# receive CQs from ibext's pool in ADAPTIVE mode), loaded by modprobe under
# upstream's names; the target on rxe1, the initiator on rxe0 (srp-lib.sh).
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
	note "srp: fio $3, $1 jobs $2 deep, every block of $FIO_MB MiB verified; rxe errors: $(rxe_errors)"
}

verify() { srp_fio 4 16 write; }
relogin() { srp_logout && srp_login && srp_uses_ibext && srp_fio 4 16 verify; }

no_target_cqes() { [ "$(cqes_in_use rxe1)" = 0 ]; }

# rxe0, the initiator's device, deleted under fio: ib_srp's client remove
# removes its target port and disk, and the deletion must finish; the target
# then releases every channel (its CQ entries go back to rxe1's pools). rxe0
# again, a login and a verified pass.
initiator_delete() {
	dev=$(srp_dev) && fio_unplug $dev srp rxe0 || return 1
	wait_for 120 "SRP disk gone with rxe0" no_srp_dev &&
		wait_for 120 "the target's channels released" no_target_cqes ||
		{ cat $D/rxe1/cq_pools; return 1; }
	$RXE_ADD0 && link_gids || return 1
	srp_login && srp_uses_ibext && srp_fio 4 16 write
}

# The initiator's remote port (SCSI transport srp): its state (running,
# blocked, fail-fast or lost), and rport_set <attribute> <value>.
rport_state() { cat /sys/class/srp_remote_ports/port-*/state; }
rport_running() { [ "$(rport_state)" = running ]; }
rport_set() { for p in /sys/class/srp_remote_ports/port-*; do echo $2 > $p/$1 || return 1; done; }

# rxe1, the target's device, deleted under fio: ib_srpt's client remove
# disconnects every channel and waits for their release, and the deletion
# must finish. The initiator's port is blocked, then fails its I/O fast
# (fast_io_fail_tmo, 2 s here), and fio ends. Its reconnect work is off
# until rxe1 is back and the target made anew (its configfs port belonged to
# the removed device): an attempt while nothing answers would wait out
# rdma_cm's REQ retries (about 80 s). Then ib_srp reconnects by itself
# (reconnect_delay 1 s) and the same disk takes a verified pass.
target_delete() {
	rport_set reconnect_delay off && rport_set fast_io_fail_tmo 2 || return 1
	srp_names && dev=$(srp_dev) && fio_unplug $dev srp rxe1 || return 1
	note "srp: the initiator's port is $(rport_state) after rxe1 was deleted"
	srp_target_down && $RXE_ADD1 && srp_target_up && rport_set reconnect_delay 1 || return 1
	wait_for 300 "the initiator reconnected" rport_running || { rport_state; return 1; }
	[ "$(srp_dev)" = "$dev" ] || { echo "the disk changed: $dev, then $(srp_dev)"; return 1; }
	srp_uses_ibext && srp_fio 4 16 write
}

unload() {
	# srpt's configfs directory holds its fabric module.
	srp_logout && unload_initiator ib_srp && srp_target_down && rmdir $T/srpt && rmmod ib_srpt ||
		return 1
	[ "$(cqes_in_use rxe0)" = 0 ] && [ "$(cqes_in_use rxe1)" = 0 ] ||
		{ cat $D/rxe0/cq_pools $D/rxe1/cq_pools; return 1; }
	objects_balanced srq_pool && unload_ibext && rm $IMG
}

ktap_print_header
ktap_set_plan 6
step "SRP on ibext: LIO target with use_srq on rxe1, login from rxe0, CQs and SRQs in ibext's debugfs" login
step "SRP on ibext: fio verified, 4 jobs 16 deep" verify
step "SRP on ibext: logout, login again, data verified" relogin
step "SRP on ibext: rxe0 (initiator) deleted under fio, channels released, re-added, verified" \
	initiator_delete
step "SRP on ibext: rxe1 (target) deleted under fio, re-added, the initiator reconnected, verified" \
	target_delete
step "SRP on ibext: logout and unload, nothing left" unload
ktap_finished
