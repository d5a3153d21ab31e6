# SPDX-License-Identifier: GPL-2.0
#
# SRP in the guest, for srp.sh and srp-bench.sh, as blktests' srp group
# drives it: an LIO target (ib_srpt) configured through configfs, and an
# initiator (ib_srp) logging in through
# /sys/class/infiniband_srp/.../add_target over RDMA/CM. The target is on
# rxe1 (lib.sh's LINK_B), the initiator on rxe0 (LINK_A): two devices with a
# wire between them (link_devices). The callers load the modules: the ports
# of ulp/ or upstream's.
. "$(dirname "$0")/nvme-lib.sh"

SRP_PORT=5555
# The ACL's name: the initiator's address, which is what the port of ulp/
# names an RDMA/CM login by. Upstream's ib_srpt names it by the target's own
# address (see ulp/ib_srpt.patch): srp-bench.sh sets LINK_B for it.
SRP_ACL=$LINK_A
# The backstore: a file on the guest's tmpfs, as big as the NVMe namespace.
IMG=/tmp/srp.img
T=$CFS/target

# The target port's configfs directory (W) and its TPG: srpt names the port
# after the GID 0 of rxe1's port 1, which follows veth2's MAC (so the name
# stays when rxe1 is deleted and added again).
srp_names() {
	[ -z "$TPG" ] || return 0
	local gid port
	gid=$(cat /sys/class/infiniband/rxe1/ports/1/gids/0) || return 1
	port=${gid#fe80:0000:0000:0000:}
	W=$T/srpt/$port TPG=$T/srpt/$port/$port
}

# LIO: a fileio backstore, and an srpt target port named after rxe1's port
# GUID (srpt's guid_name) with one LUN and an ACL for the initiator
# (SRP_ACL); use_srq (SRP_USE_SRQ, default 1) before enabling. srpt listens
# on every address, LINK_B among them. ib_srpt must be loaded.
srp_target_up() {
	link_devices || return 1
	modprobe -a target_core_mod target_core_file || return 1
	# srpt's RDMA/CM listener (6.12: a configfs attribute, not a parameter).
	mkdir -p $T/srpt && echo $SRP_PORT > $T/srpt/discovery_auth/rdma_cm_port || return 1
	truncate -s ${NS_MB}M $IMG || return 1
	mkdir -p $T/core/fileio_0/d0 &&
		echo "fd_dev_name=$IMG,fd_dev_size=$((NS_MB << 20))" > $T/core/fileio_0/d0/control &&
		echo 1 > $T/core/fileio_0/d0/enable || return 1
	srp_names && mkdir -p $TPG/lun/lun_0 && ln -s $T/core/fileio_0/d0 $TPG/lun/lun_0/d0 &&
		mkdir -p $TPG/acls/$SRP_ACL/lun_0 && ln -s $TPG/lun/lun_0 $TPG/acls/$SRP_ACL/lun_0/lun_0 &&
		echo ${SRP_USE_SRQ:-1} > $TPG/attrib/use_srq && echo 1 > $TPG/enable
}

srp_target_down() {
	srp_names && echo 0 > $TPG/enable && rm $TPG/acls/$SRP_ACL/lun_0/lun_0 &&
		rmdir $TPG/acls/$SRP_ACL/lun_0 $TPG/acls/$SRP_ACL && rm $TPG/lun/lun_0/d0 &&
		rmdir $TPG/lun/lun_0 $TPG $W && rmdir $T/core/fileio_0/d0 $T/core/fileio_0 || return 1
}

# The SCSI disk of the LIO target.
srp_dev() {
	for d in /sys/block/sd*; do
		grep -qs '^LIO-ORG' $d/device/vendor && echo /dev/${d##*/} && return 0
	done
	return 1
}
no_srp_dev() { ! srp_dev >/dev/null; }

# srp_login [options]: a login over RDMA/CM from rxe0 to the target on
# rxe1, with add_target's options; ib_srp makes one channel per completion
# vector it uses. ib_srp must be loaded.
srp_login() {
	# The target port ID srpt accepts: its service GUID, twice.
	guid=$(cat /sys/module/ib_srpt/parameters/srpt_service_guid) || return 1
	# A target port being removed stays on ib_srp's list (and a login to it
	# gives EEXIST) until its remove work has freed its channels, after its
	# disk is gone: retried, within the bound.
	wait_for 120 "add_target" eval "echo id_ext=$guid,ioc_guid=$guid,dest=$LINK_B:$SRP_PORT,src=$LINK_A${1:+,$1} \
		> /sys/class/infiniband_srp/srp-rxe0-1/add_target 2>/dev/null" || return 1
	wait_for 120 "the SRP disk" srp_dev >/dev/null
}
# The rxe error counters that are not 0: why a QP went to the error state.
rxe_errors() (
	cd /sys/class/infiniband && grep -H -v '^0$' rxe*/ports/1/hw_counters/*_err 2>/dev/null |
		sed 's,/ports/1/hw_counters/,/,' | tr '\n' ' '
)
# unload_initiator <module>: ib_srp's remove work holds the module (through
# the SCSI host) until it has freed the target port, after the disk is gone.
module_unused() { [ "$(cat /sys/module/$1/refcnt)" = 0 ]; }
unload_initiator() { wait_for 120 "$1 unused" module_unused $1 && rmmod $1; }
srp_logout() {
	for p in /sys/class/srp_remote_ports/port-*; do echo 1 > $p/delete || return 1; done
	wait_for 120 "the SRP disk gone" no_srp_dev
}

# The initiator's receive CQs (softirq, ADAPTIVE) hold entries in rxe0's
# pools, the target's CQs (workqueue) in rxe1's; the target's SRQ pool
# exists.
srp_uses_ibext() {
	awk '$1 == "softirq" && $9 == "adaptive" && $7 > 0 { a = 1 } END { exit !a }' \
		$D/rxe0/cq_pools || { echo "no ADAPTIVE softirq CQ in use on rxe0"; cat $D/rxe0/cq_pools; return 1; }
	awk '$1 == "workqueue" && $7 > 0 { w = 1 } END { exit !w }' $D/rxe1/cq_pools ||
		{ echo "no workqueue CQ in use on rxe1"; cat $D/rxe1/cq_pools; return 1; }
	ls $D/rxe1/srq_pool.* >/dev/null 2>&1 || { echo "no SRQ pool on rxe1"; ls $D/rxe1; return 1; }
}

