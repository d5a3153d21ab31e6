#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# make bench: SRP through upstream's ib_srp and ib_srpt against the ports of
# ulp/, the initiator's receive CQs in ADAPTIVE mode (the port), NONE and DIM
# (the same source built with another mode, ulp/ib_srp_{none,dim}.c), side by
# side in this boot (kunit/bench.py reads the "ibext-bench:" lines).
#
# Each of REPS repetitions runs the four setups, their order rotated by one
# per repetition; a setup loads its target and initiator, logs in, runs every
# fio point, logs out and unloads. A point is 4 KiB random reads at one depth
# (1, 8, 32, 128) and job count (1, one per vCPU) for SECS seconds after a
# 1 s ramp. use_srq stays 0, upstream's default: with it, upstream's srpt
# warns at every channel release (srpt_cache_put(NULL); see
# ulp/ib_srpt.patch). Completion events are counted as in nvme-bench.sh;
# upstream's CQs are ib_core's, so only the ports' split them by side.
. "$(dirname "$0")/srp-lib.sh"

REPS=3 SECS=3
KSRP=/lib/modules/$(uname -r)/kernel/drivers/infiniband/ulp
SRP_USE_SRQ=0

# load <setup>: the target and initiator of one setup; upstream's by path
# (the ports have their names), after the modules they need; SRP_ACL, the
# name its ib_srpt gives the initiator.
load() {
	case $1 in
	upstream) SRP_ACL=$LINK_B
		modprobe -a target_core_mod scsi_transport_srp &&
		insmod $KSRP/srpt/ib_srpt.ko && insmod $KSRP/srp/ib_srp.ko ;;
	adaptive) SRP_ACL=$LINK_A && modprobe ib_srpt && modprobe ib_srp ;;
	*) SRP_ACL=$LINK_A && modprobe ib_srpt && modprobe ib_srp_$1 ;;
	esac
}
initiator() { case $1 in upstream | adaptive) echo ib_srp ;; *) echo ib_srp_$1 ;; esac; }

# point <setup> <rep> <order> <jobs> <depth>: one fio run, one bench line;
# the ports' lines also split their events between initiator (ibext's CQs on
# rxe0) and target (rxe1).
point() {
	dev=$(srp_dev) || return 1
	ev0=$(events) io0=$(io_done ${dev##*/}) evi0=$(pool_events rxe0) evt0=$(pool_events rxe1)
	out=$(fio --name=sb --filename=$dev --direct=1 --ioengine=libaio --bs=4k --rw=randread \
		--numjobs=$4 --iodepth=$5 --size=${NS_MB}M --time_based --ramp_time=1 \
		--runtime=$SECS --percentile_list=99 --group_reporting --minimal) || { echo "$out"; return 1; }
	ev=$(($(events) - ev0)) ios=$(($(io_done ${dev##*/}) - io0))
	evi=$(($(pool_events rxe0) - evi0)) evt=$(($(pool_events rxe1) - evt0))
	# --minimal: field 8 is read IOPS; the "99.000000%=" field the p99
	# completion latency in microseconds.
	line=$(echo "$out" | awk -F';' -v s=$1 -v r=$2 -v o=$3 -v j=$4 -v d=$5 -v ev=$ev \
		-v ios=$ios -v evi=$evi -v evt=$evt '$1 != 3 { next } $5 != 0 { exit 1 }
		{ for (i = 18; i <= NF; i++) if ($i ~ /^99\.0+%=/) { split($i, p, "="); break }
		  split_ev = s == "upstream" ? "" : sprintf(",\"initiator_events_per_io\":%.4f,\"target_events_per_io\":%.4f",
			(ios ? evi / ios : 0), (ios ? evt / ios : 0))
		  printf "{\"bench\":\"srp\",\"setup\":\"%s\",\"jobs\":%d,\"depth\":%d,\"rep\":%d,\"order\":%d,\"iops\":%d,\"clat_p99_us\":%d,\"events_per_io\":%.4f,\"ios\":%d%s}",
			s, j, d, r, o, $8, p[2], (ios ? ev / ios : 0), ios, split_ev }') ||
		{ echo "fio: $out"; return 1; }
	bench "$line"
}

# One channel per vCPU, and room for 128 commands in flight on the disk.
run_setup() {
	load $1 && srp_target_up && srp_login queue_size=128,max_cmd_per_lun=128 || return 1
	for p in "1 1" "1 8" "1 32" "1 128" "$SMP 1" "$SMP 8" "$SMP 32" "$SMP 128"; do
		point $1 $2 $3 $p || return 1
	done
	srp_logout && unload_initiator $(initiator $1) && srp_target_down && rmdir $T/srpt && rmmod ib_srpt
}

bench_all() {
	# nvme-bench.sh, when it ran first in this boot, set the same trigger.
	grep -q '^hist:keys=cq_id' $TR/events/rdma_core/cq_schedule/trigger ||
		echo "hist:keys=cq_id" > $TR/events/rdma_core/cq_schedule/trigger || return 1
	set -- upstream adaptive none dim
	for rep in $(seq 0 $((REPS - 1))); do
		for order in 0 1 2 3; do run_setup $1 $rep $order || return 1; set -- "${@:2}" $1; done
		set -- "${@:2}" $1
	done
	rm $IMG
	note "srp bench: $REPS repetitions of the four setups"
}

ktap_print_header
ktap_set_plan 1
modprobe ibext || ktap_exit_fail_msg "modprobe ibext failed"
step "SRP benchmark: upstream's modules and the ports (adaptive, none, dim)" bench_all
ktap_finished
