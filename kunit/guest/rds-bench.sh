#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# make bench: RDS through upstream's rds_rdma against the port of ulp/ (its
# CQs under ibext's DIM, re-armed through ibext_dim_arm), side by side in
# this boot (kunit/bench.py reads the "ibext-bench:" lines), between the
# addresses of rxe0 and rxe1 (lib.sh, link_devices).
#
# Each of REPS repetitions runs both setups, their order swapped from one
# repetition to the next; a setup loads its rds_rdma and runs every point:
# ping-pong (rds.py bench) of 64-byte messages at depth 1 and 16 per socket
# pair, and a one-way stream as fast as RDS takes messages, with one and 8
# pairs, for SECS seconds after a 1 s warm-up, on one online CPU (below).
# Completion events are RDS's own count of its CQ handlers' calls
# (ib_evt_handler_call), the same code in both modules. The port's lines also
# carry ibext's deferrals over the point: how many, how long they were asked
# to wait and did wait, summed, and the completions the runs they ended found
# (debugfs legacy_dim). Every line has the CPU's idle share (idle_pct).
. "$(dirname "$0")/lib.sh"

REPS=3 SECS=3
RDS="python3 $(dirname "$0")/rds.py"

# load <setup>: upstream's by path (the port has its name).
load() {
	case $1 in
	upstream) modprobe rds && insmod /lib/modules/$(uname -r)/kernel/net/rds/rds_rdma.ko ;;
	port) modprobe rds_rdma && modinfo -n rds_rdma | grep -q /updates/ ;;
	esac
}

# deferrals: ibext's legacy software-moderation totals ("deferrals N asked_us
# N waited_us N found N"), as four numbers.
deferrals() { awk '{ print $2, $4, $6, $8 }' $D/legacy_dim; }

run_setup() {
	load $1 || return 1
	for p in "1 --depth=1" "1 --depth=16" "1 --stream" "8 --depth=1" "8 --depth=16" "8 --stream"; do
		set -- $1 $2 $3 $p
		d0=$(deferrals)
		line=$($RDS bench --links $4 $5 --seconds $SECS --setup $1 --rep $2 --order $3) ||
			{ echo "$line"; return 1; }
		# The port's lines: its deferrals over the point, asked and actual
		# wait, and what they found.
		[ $1 = upstream ] || line=$(echo "$d0 $(deferrals)" | awk -v l="$line" '{
			sub(/}$/, sprintf(", \"deferrals\": %d, \"defer_asked_us\": %d, \"defer_waited_us\": %d, \"defer_found\": %d}",
				$5 - $1, $6 - $2, $7 - $3, $8 - $4), l); print l }')
		echo "$line" > /dev/kmsg
	done
	rmmod rds_rdma
}

# cpus <0|1>: every CPU but the first offline (0) or back online (1).
cpus() {
	for c in /sys/devices/system/cpu/cpu[1-9]*/online; do
		[ ! -e $c ] || echo $1 > $c || return 1
	done
}

bench_all() {
	link_devices && modprobe ibext || return 1
	set -- upstream port
	for rep in $(seq 0 $((REPS - 1))); do
		run_setup $1 $rep 0 && run_setup $2 $rep 1 || return 1
		set -- $2 $1
	done
	rmmod rds_rdma rds 2>/dev/null
	objects_balanced legacy_dim && unload_ibext
}

# One CPU online. Under the icount clock QEMU runs the vCPUs in turn, and a
# vCPU's timer interrupt waits for the other's turn: with two online, the
# port's deferrals (1 to 32 us asked) lasted 55 to 166 us on average
# (debugfs legacy_dim), and the sender waited with them. With one, most end
# within 5 us of being started. Both setups run alike.
ktap_print_header
ktap_set_plan 1
cpus 0 || ktap_exit_fail_msg "cannot take the other CPUs offline"
step "RDS bench: upstream's rds_rdma and the port, $REPS repetitions, one CPU" bench_all
cpus 1
ktap_finished
