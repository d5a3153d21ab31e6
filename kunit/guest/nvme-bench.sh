#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# make bench: NVMe over RDMA through upstream's nvme-rdma and nvmet-rdma
# against the ports of ulp/, side by side in this boot (kunit/bench.py reads
# the "ibext-bench:" lines). SUITE=ibext_nvme_mem: the target memory only.
#
# Each of REPS repetitions loads one pair, connects ($SMP I/O queues), runs
# every fio point, disconnects and unloads, then does the same with the other
# pair, the order alternating. A point is 4 KiB random reads at one depth and
# job count for SECS seconds after a 1 s ramp. Completion events are counted
# the same way for both pairs, as calls of a CQ's completion handler:
# ib_core's cq_schedule tracepoint for ib_core's CQs (upstream's pool, and
# the MAD CQs of both), plus the "events" of ibext's pooled CQs.
. "$(dirname "$0")/nvme-lib.sh"

REPS=5 SECS=3 MEM_REPS=3
# target|host <setup>: load one side; upstream's modules by path (the ports
# have their names).
target() {
	case $1 in
	upstream) insmod $KMOD/target/nvmet-rdma.ko ;;
	upstream_srq) insmod $KMOD/target/nvmet-rdma.ko use_srq=1 ;;
	ibext) modprobe nvmet-rdma ;;
	esac
}
host() { if [ $1 = ibext ]; then modprobe nvme-rdma; else insmod $KMOD/host/nvme-rdma.ko; fi; }
# point <setup> <rep> <order> <jobs> <depth>: one fio run, one bench line,
# with the SRQ limit events and limit arms (ib_modify_srq) in its window and
# the arms since the pools were made (one per SRQ at creation).
point() {
	dev=$(nvme_dev) || return 1
	le0=$(srq_stat sum limit_events) la0=$(srq_stat sum limit_arms) rnr0=$(rnr_naks)
	ev0=$(events) io0=$(io_done ${dev##*/})
	out=$(fio --name=nb --filename=$dev --direct=1 --ioengine=libaio --bs=4k --rw=randread \
		--numjobs=$4 --iodepth=$5 --size=${NS_MB}M --time_based --ramp_time=1 \
		--runtime=$SECS --percentile_list=99 --group_reporting --minimal) || { echo "$out"; return 1; }
	ev=$(($(events) - ev0)) ios=$(($(io_done ${dev##*/}) - io0))
	le=$(($(srq_stat sum limit_events) - le0)) lt=$(srq_stat sum limit_arms) rnr=$(($(rnr_naks) - rnr0))
	# --minimal: field 8 is read IOPS; the "99.000000%=" field the p99 completion
	# latency in microseconds.
	line=$(echo "$out" | awk -F';' -v s=$1 -v r=$2 -v o=$3 -v j=$4 -v d=$5 -v ev=$ev -v ios=$ios \
		-v le=$le -v la=$((lt - la0)) -v lt=$lt -v rnr=$rnr '$1 != 3 { next } $5 != 0 { exit 1 }
		{ for (i = 18; i <= NF; i++) if ($i ~ /^99\.0+%=/) { split($i, p, "="); break }
		  printf "{\"bench\":\"nvme\",\"setup\":\"%s\",\"jobs\":%d,\"depth\":%d,\"rep\":%d,\"order\":%d,\"iops\":%d,\"clat_p99_us\":%d,\"events_per_io\":%.4f,\"srq_limit_events\":%d,\"srq_limit_arms\":%d,\"srq_limit_arms_total\":%d,\"ios\":%d,\"rnr_naks\":%d,\"rnr_naks_per_io\":%.5f}",
			s, j, d, r, o, $8, p[2], (ios ? ev / ios : 0), le, la, lt, ios, rnr, (ios ? rnr / ios : 0) }') ||
		{ echo "fio: $out"; return 1; }
	bench "$line"
}
run_setup() {
	target $1 && host $1 && nvme_port_enable && nvme_connect $SMP || return 1
	for p in "1 1" "1 32" "$SMP 1" "$SMP 32"; do point $1 $2 $3 $p || return 1; done
	nvme_down && nvme_port_disable && rmmod nvme_rdma nvmet_rdma
}

# The target's receive buffers (commands, their nvme_command, inline-data
# pages) when <controllers> hosts connect with <queues> I/O queues each: the
# bytes allocated under nvmet_rdma_alloc_cmd*() and
# nvmet_rdma_alloc_inline_pages() meanwhile, from kmem histograms keyed by
# stack trace. The host is upstream's nvme-rdma for the three targets.
hist_bytes() {
	awk -v per=$2 '/^\{/ { mine = 0 } /nvmet_rdma_alloc_cmd|nvmet_rdma_alloc_inline_pages/ { mine = 1 }
		/^\}/ && mine { for (i = 1; i < NF; i++) { if ($i == "hitcount:") h = $(i + 1)
			if ($i == "bytes_alloc:") b = $(i + 1) }; n += per ? h * per : b }
		END { print n + 0 }' $TR/events/kmem/$1/hist
}
HOSTS=0
mem() {
	setup=$1 nctrl=$2 nq=$3
	target $setup && nvme_port_enable || return 1
	K="hist:keys=common_stacktrace:vals=bytes_alloc" P="hist:keys=common_stacktrace"
	echo $K > $TR/events/kmem/kmalloc/trigger && echo $P > $TR/events/kmem/mm_page_alloc/trigger || return 1
	for c in $(seq $nctrl); do
		# A host ID of its own per connect, through the kernel's interface:
		# nvme-cli refuses a second controller to the same subsystem.
		HOSTS=$((HOSTS + 1)) id=${HOSTID%??}$(printf %02x $((HOSTS % 256)))
		echo "transport=rdma,traddr=$NVME_ADDR,trsvcid=4420,nqn=$NQN,keep_alive_tmo=60,nr_io_queues=$nq,hostnqn=nqn.2014-08.org.nvmexpress:uuid:$id,hostid=$id" \
			> /dev/nvme-fabrics || return 1
	done
	# Inline-data pages are order 0 (one page of inline data, the default).
	bytes=$(($(hist_bytes kmalloc) + $(hist_bytes mm_page_alloc 4096)))
	echo "!$K" > $TR/events/kmem/kmalloc/trigger && echo "!$P" > $TR/events/kmem/mm_page_alloc/trigger
	bench "{\"bench\":\"nvme_mem\",\"setup\":\"$setup\",\"host_queues\":$((nctrl * nq)),\"controllers\":$nctrl,\"rep\":$4,\"order\":$5,\"target_recv_bytes\":$bytes}"
	nvme disconnect -n $NQN >/dev/null && wait_for 120 "controllers gone" no_nvme_ctrl &&
		nvme_port_disable && rmmod nvmet_rdma
}
no_nvme_ctrl() { ! ls -d /sys/class/nvme/nvme* >/dev/null 2>&1; }
# MEM_REPS repetitions of the three targets, their order rotated.
bench_mem() {
	host upstream || return 1
	for rep in $(seq 0 $((MEM_REPS - 1))); do
		set -- upstream upstream_srq ibext upstream upstream_srq
		shift $((rep % 3))
		for order in 0 1 2; do
			mem $1 1 1 $rep $order && mem $1 2 2 $rep $order && mem $1 8 2 $rep $order || return 1
			shift
		done
	done
	rmmod nvme_rdma
}

bench_all() {
	echo "hist:keys=cq_id" > $TR/events/rdma_core/cq_schedule/trigger || return 1
	for rep in $(seq 0 $((REPS - 1))); do
		if [ $((rep % 2)) = 0 ]; then set -- upstream ibext; else set -- ibext upstream; fi
		run_setup $1 $rep 0 && run_setup $2 $rep 1 || return 1
	done
	note "nvme bench: $REPS repetitions of both pairs"
	bench_mem
}

ktap_print_header
ktap_set_plan 1
modprobe ibext && nvme_target_config || ktap_exit_fail_msg "NVMe target setup failed"
if [ "$SUITE" = ibext_nvme_mem ]; then
	step "NVMe over RDMA target receive memory" bench_mem
else
	step "NVMe over RDMA benchmark: upstream's modules and the ports" bench_all
fi
ktap_finished
