# SPDX-License-Identifier: GPL-2.0
#
# NVMe over RDMA in the guest, for nvme.sh, nvme-bench.sh and demo.sh: a
# target on rxe1 serving a memory-backed null_blk namespace (so that data
# written before a reconnect can be verified after it), and the host
# connecting to it in loopback. Not rxe0: an address whose GID index is above
# 255 cannot be connected to (struct ib_global_route's sgid_index is a u8),
# and rxe0's table is nearly full for the GID tests. The transports are
# whatever "nvme-rdma" and "nvmet-transport-1" resolve to: the ports of ulp/,
# which the module tree of scripts/build-flavour.sh has under those names
# (main.sh links it in); upstream's are loaded by path.
. "$(dirname "$0")/lib.sh"

NVME_ADDR=10.12.0.1
NQN=nqn.2026-12.org.ibext:rxe1
HOSTID=4f2c8a1e-6d3b-4e5f-8a9b-0c1d2e3f4a5b
# KASAN makes each I/O about ten times slower: the debug kernel verifies a
# smaller namespace (its bugs show as reports, not as volume).
NS_MB=16
[ "$FLAVOUR" = debug ] && NS_MB=2
KMOD=/lib/modules/$(uname -r)/kernel/drivers/nvme

# rdma_cm binds to an address only once its GID is in the device's table,
# which roce_gid_mgmt fills from a work item.
gid_of_nvme_addr() { grep -qs "ffff:0a0c:0001" /sys/class/infiniband/rxe1/ports/1/gids/*; }

# The namespace, subsystem and port in configfs; the port not enabled.
nvme_target_config() {
	ip addr add $NVME_ADDR/24 dev veth2 2>/dev/null
	wait_for 300 "rxe1's GID of $NVME_ADDR" gid_of_nvme_addr || return 1
	modprobe null_blk nr_devices=0 && modprobe nvmet && modprobe nvme-fabrics || return 1
	B=$CFS/nullb/nullb0 S=$CFS/nvmet/subsystems/$NQN P=$CFS/nvmet/ports/1
	mkdir $B && echo $NS_MB > $B/size && echo 4096 > $B/blocksize &&
		echo 1 > $B/memory_backed && echo 1 > $B/power || return 1
	mkdir $S && echo 1 > $S/attr_allow_any_host || return 1
	mkdir $S/namespaces/1 && echo /dev/nullb0 > $S/namespaces/1/device_path &&
		echo 1 > $S/namespaces/1/enable || return 1
	mkdir $P && echo rdma > $P/addr_trtype && echo ipv4 > $P/addr_adrfam &&
		echo $NVME_ADDR > $P/addr_traddr && echo 4420 > $P/addr_trsvcid
}

# Linking the subsystem to the port makes nvmet load its rdma transport
# (request_module) and listen.
nvme_port_enable() { ln -s $CFS/nvmet/subsystems/$NQN $CFS/nvmet/ports/1/subsystems/$NQN; }
nvme_port_disable() { rm $CFS/nvmet/ports/1/subsystems/$NQN; }

nvme_target_down() {
	nvme_port_disable && rmdir $CFS/nvmet/ports/1 $CFS/nvmet/subsystems/$NQN/namespaces/1 \
		$CFS/nvmet/subsystems/$NQN && rmmod nvmet_rdma && rmdir $CFS/nullb/nullb0 &&
		rmmod nvmet null_blk
}

nvme_dev() {
	for b in /sys/block/nvme*n${1:-1}; do
		[ -e "$b" ] && echo /dev/${b##*/} && return 0
	done
	return 1
}
no_nvme_dev() { ! nvme_dev "$@" >/dev/null; }

# nvme_connect <I/O queues>. A 60 s keep-alive: keep-alive timeouts must not
# depend on the guest's speed.
nvme_connect() {
	nvme connect -t rdma -a $NVME_ADDR -s 4420 -n $NQN --hostid=$HOSTID \
		--hostnqn=nqn.2014-08.org.nvmexpress:uuid:$HOSTID -i $1 -k 60 || return 1
	wait_for 120 "namespace of $NQN" nvme_dev >/dev/null
}
nvme_down() {
	nvme disconnect -n $NQN >/dev/null && wait_for 120 "controller of $NQN gone" no_nvme_dev
}

# fio_verify <jobs> <depth> <write|verify>: 4 KiB random writes, each job on
# its own slice of the namespace, every block read back and verified
# (crc32c); "verify" only reads what a "write" pass of the same shape wrote.
# At depth 1, where each I/O is a round trip of its own, the first quarter of
# the namespace, at least 2 MiB (512 writes; the SRQ step's read pass must
# consume what an SRQ grown to twice srq_start holds).
fio_verify() {
	fio_pass v "$(nvme_dev)" "$@" || return 1
	note "nvme: fio $3, $2 deep, every block of $FIO_MB MiB verified"
}
# fio_pass <name prefix> <disk> <jobs> <depth> <write|verify>: the pass of
# fio_verify on any disk (the SRP steps' too); FIO_MB, the MiB it covers.
fio_pass() {
	FIO_MB=$NS_MB
	[ $4 != 1 ] || FIO_MB=$((NS_MB / 4 > 2 ? NS_MB / 4 : 2))
	slice=$((FIO_MB * 1024 / $3))
	set -- --name=$1$3.$4 --filename="$2" --direct=1 --ioengine=libaio --bs=4k \
		--rw=randwrite --numjobs=$3 --iodepth=$4 --size=${slice}k --offset_increment=${slice}k \
		--verify=crc32c --verify_fatal=1 --randseed=$(($3 * 100 + $4)) --group_reporting \
		--minimal $([ "$5" = verify ] && echo --verify_only)
	fio_ok "$@"
}
# fio_unplug <disk> <who> [device]: fio (2 jobs, depth 16, random reads and
# writes, time-based) on <disk> while rdma link delete deletes <device>
# (rxe1), once 512 I/Os have completed; the deletion must finish within its
# watchdog and fio end.
fio_unplug() {
	rxe=${3:-rxe1}
	fio --name=unplug --filename=$1 --direct=1 --ioengine=libaio --bs=4k --rw=randrw \
		--numjobs=2 --iodepth=16 --time_based --runtime=3600 --minimal > /tmp/fio-unplug 2>&1 &
	fpid=$!
	wait_for 300 "fio doing I/O" fio_going $fpid ${1##*/} "$(io_done ${1##*/})" &&
		! gone $fpid || { kill $fpid; echo "fio ended early"; cat /tmp/fio-unplug; return 1; }
	link_delete_watched $rxe || return 1
	wait_for 300 "fio ending after $rxe was deleted" gone $fpid || { kill -9 $fpid; return 1; }
	wait $fpid
	note "$2: fio under the link deletion exited with $?"
}
# fio_ok <fio args>: fio exits non-zero on a failed verify; field 5 of
# --minimal's result line (version 3) is the error number.
fio_ok() {
	out=$(fio "$@") && echo "$out" | awk -F';' '$1 == 3 { n++; if ($5 != 0) bad = 1 }
		END { exit bad || !n }' || { echo "$out" | cut -c1-300; return 1; }
}

# RNR NAKs sent by every rxe responder: a receive arrived with nothing posted.
rnr_naks() { cat /sys/class/infiniband/rxe*/ports/*/hw_counters/send_rnr_err | awk '{ n += $1 } END { print n + 0 }'; }
# I/Os completed on block device $1 (reads plus writes).
io_done() { awk '{ print $1 + $5 }' /sys/block/$1/stat; }
# fio_going <pid> <disk> <I/Os before>: fio ended, or did 512 I/Os more.
fio_going() { gone $1 || [ "$(io_done $2)" -ge $(($3 + 512)) ]; }

# srq_stat <sum|max|min> <counter>: one counter of ibext's SRQs, over every
# SRQ of every pool (the port's target; upstream's nvmet-rdma has none).
srq_stat() {
	cat $D/*/srq_pool.*/stats 2>/dev/null | awk -v w=$1 -v k=$2 '/^srq / {
		for (i = 1; i < NF; i++) if ($i == k) { v = $(i + 1); s += v
			if (n++ == 0 || (w == "max" ? v > m : v < m)) m = v } }
		END { print (w == "sum" ? s : m) + 0 }'
}

# The ports' queues hold entries on the pooled CQs and the target's SRQ pool.
# cqes_in_use [device]: on rxe1, or on the one named.
cqes_in_use() { awk '$6 == "used" { n += $7 } END { print n + 0 }' $D/${1:-rxe1}/cq_pools; }
nvme_uses_ibext() {
	ls $D/rxe1/srq_pool.* >/dev/null 2>&1 || { echo "no SRQ pool on rxe1"; ls $D/rxe1; return 1; }
	[ "$(cqes_in_use)" -gt 0 ] || { echo "no pooled CQ in use"; cat $D/rxe1/cq_pools; return 1; }
}

# For the benchmarks (nvme-bench.sh, srp-bench.sh): one result line for
# kunit/bench.py, and the completion events so far, as calls of a CQ's
# completion handler: ib_core's cq_schedule tracepoint (a hist trigger the
# bench sets) for ib_core's CQs, plus the "events" of ibext's pooled CQs
# (pool_events: on every device, or on the one named).
bench() { echo "ibext-bench: $*" > /dev/kmsg; }
pool_events() {
	cat $D/${1:-*}/cq_pools | awk '{ for (i = 1; i < NF; i++)
		if ($i == "events") n += $(i + 1) } END { print n + 0 }'
}
events() {
	core=$(awk '/^ *Hits:/ { print $2; exit }' $TR/events/rdma_core/cq_schedule/hist)
	echo $((${core:-0} + $(pool_events)))
}
