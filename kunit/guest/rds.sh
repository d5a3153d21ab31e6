#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# RDS on ibext: the port of ulp/ (rds_rdma, RDS's IB transport, its send and
# receive CQs moderated by ibext's DIM for legacy ULPs and re-armed through
# ibext_dim_arm), loaded by modprobe under upstream's name, carrying RDS
# sockets between the address of rxe0 (veth0) and that of rxe1 (veth2):
# two devices, a wire between them (lib.sh, link_devices). rds.py sends and
# checks the messages.
. "$(dirname "$0")/lib.sh"

RDS="python3 $(dirname "$0")/rds.py"
# Messages per flow: the debug kernel (KASAN, about ten times slower per
# message) runs the same steps with fewer.
# Every 8th message (4th on debug) is one of rds.py's edge sizes: each of
# them, up to 1 MiB, is sent by some flow.
MSGS=200 RUN=1500 AT=500 LARGE=8
[ "$FLAVOUR" = debug ] && MSGS=60 RUN=400 AT=150 LARGE=4

load() {
	link_devices && modprobe ibext && modprobe rds_rdma || return 1
	modinfo -n rds_rdma | grep -q /updates/ || { echo "rds_rdma is not the port"; return 1; }
}

# legacy_dim_live <at least>: ibext's DIM objects for the legacy API, one per
# CQ of an RDS connection (a send and a receive CQ on each side).
legacy_dim_live() {
	live=$(sed -n 's/^legacy_dim made [0-9]* freed [0-9]* live \([0-9]*\)$/\1/p' $D/objects)
	[ "${live:-0}" -ge "$1" ] || { grep legacy_dim $D/objects; return 1; }
}

# Both directions of 8 socket pairs, 1 B to 1 MiB, every message verified;
# the two connections (A to B and B to A) are then up, each with its two CQs
# under ibext.
traffic() {
	$RDS traffic --links 8 --messages $MSGS --large-every $LARGE && legacy_dim_live 4 || return 1
	note "rds: $(grep legacy_dim $D/objects)"
}

# One round with 1% of veth0's packets lost (netem): rxe's RC transport
# retransmits, RDS sees nothing. netem must have dropped some.
loss() {
	tc qdisc add dev veth0 root netem loss 1% || return 1
	$RDS traffic --links 4 --messages $MSGS --large-every $LARGE --seed 2
	rc=$?
	dropped=$(tc -s qdisc show dev veth0 | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1)
	tc qdisc del dev veth0 root || return 1
	[ $rc = 0 ] || return 1
	[ "${dropped:-0}" -gt 0 ] || { echo "netem dropped nothing"; return 1; }
	note "rds: netem dropped $dropped packets of veth0; every message still once and in order"
}

# No RDS connection between A and B is up.
conns_down() { ! $RDS conns | grep -q "$LINK_A.*connected\|$LINK_B.*connected"; }
received() { [ "$(cat /tmp/rds.progress 2>/dev/null || echo 0)" -ge "$1" ]; }

# rxe1 deleted while RDS carries messages both ways: its connections drop
# (rxe1's ULPs, rds_rdma then ibext, let go of it), the deletion finishes;
# rxe1 again, RDS connects again and resends what was not acknowledged: the
# same run ends with every message once and in order.
link_delete() {
	rm -f /tmp/rds.progress
	$RDS traffic --links 4 --messages $RUN --large-every 64 --seed 3 --progress /tmp/rds.progress \
		--stall 300 > /tmp/rds.out 2>&1 &
	# Not "pid": link_delete_watched sets that one.
	run=$!
	wait_for 300 "$AT RDS messages received" received $AT || { kill $run; cat /tmp/rds.out; return 1; }
	link_delete_watched rxe1 || { kill $run; return 1; }
	[ ! -e $D/rxe1 ] || { echo "ibext's rxe1 state left"; kill $run; return 1; }
	wait_for 300 "RDS connections down without rxe1" conns_down || { $RDS conns; kill $run; return 1; }
	at=$(cat /tmp/rds.progress)
	$RXE_ADD1 || { kill $run; return 1; }
	wait_for 600 "the RDS run finished after rxe1 came back" gone $run
	wait $run
	rc=$?
	cat /tmp/rds.out
	[ $rc = 0 ] || return 1
	note "rds: rxe1 deleted after $at of $((8 * RUN)) messages, added again, the run completed"
}

unload() {
	rmmod rds_rdma rds || return 1
	objects_balanced legacy_dim && unload_ibext
}

ktap_print_header
ktap_set_plan 5
step "RDS on ibext: rds_rdma is the port, over rxe0 and rxe1" load
step "RDS on ibext: 8 socket pairs, 1 B to 1 MiB, every message once, CQs under ibext's DIM" traffic
step "RDS on ibext: 1% of packets lost on veth0, every message once" loss
step "RDS on ibext: rxe1 deleted under traffic, added again, every message once" link_delete
step "RDS on ibext: rmmod rds_rdma, every DIM object freed, ibext unloads" unload
ktap_finished
