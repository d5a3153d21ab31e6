# SPDX-License-Identifier: GPL-2.0
#
# Sourced by every guest script (kunit/guest/*.sh). The guest is a virtme-ng
# boot of a test kernel with the host's userspace (kunit/run.py); each script
# prints KTAP with kselftest's ktap_helpers.sh, and main.sh sends it to the
# kernel log between "ibext-guest: begin|end ktap <name>" markers, where the
# host finds it beside KUnit's own KTAP and the kernel's reports.
# Environment from main.sh: KSRC (the kernel source), BDIR (this kernel's
# build of ibext), KDIR (the kernel's build), FLAVOUR, SMP.

. "$KSRC/tools/testing/selftests/kselftest/ktap_helpers.sh"

D=/sys/kernel/debug/ibext
CFS=/sys/kernel/config
TR=/sys/kernel/tracing
RXE_ADD0="rdma link add rxe0 type rxe netdev veth0"
RXE_ADD1="rdma link add rxe1 type rxe netdev veth2"

# note <text>: a KTAP diagnostic line, in order with the results.
note() { echo "# $*"; }

# step <description> <command...>: one test; the command's output becomes
# diagnostic lines when it fails, its notes when it passes.
step() {
	desc=$1
	shift
	if out=$("$@" 2>&1); then
		printf '%s\n' "$out" | grep '^# '
		ktap_test_pass "$desc"
	else
		printf '%s\n' "$out" | sed 's/^/# /'
		ktap_test_fail "$desc"
	fi
}

# wait_for <seconds> <what> <command...>: poll until the command succeeds,
# first at short intervals, then once a second; fail with <what> after
# <seconds>. Every wait of the tests is bounded this way, never by a sleep
# that assumes the guest's speed. The pause is a read that times out on a
# pipe nobody writes: no sleep(1) process, which costs the debug kernel a
# third of a second over 9p.
exec {NAP_FD}<> <(:)
wait_for() {
	limit=$1 what=$2
	shift 2
	end=$((SECONDS + limit)) nap=0.1
	until "$@"; do
		[ $SECONDS -lt $end ] || { echo "$what: not after ${limit}s"; return 1; }
		read -r -t $nap -u $NAP_FD || :
		case $nap in 0.1) nap=0.2 ;; 0.2) nap=0.5 ;; *) nap=1 ;; esac
	done
}

gone() { ! kill -0 "$1" 2>/dev/null; }

# The kernel stacks of <pid> and of every task in uninterruptible sleep:
# where a watchdog found them.
stacks() {
	for t in $1 $(awk '$3 == "D" { print $1 }' /proc/[0-9]*/stat 2>/dev/null); do
		echo "stack of $t ($(cat /proc/$t/comm)):" && cat /proc/$t/stack
	done 2>/dev/null
}

# rdma link delete under a watchdog: it must finish, however long ibext's
# users take to let go (bounded at 120 s).
link_delete_watched() {
	rdma link delete "$1" &
	pid=$!
	wait_for 120 "rdma link delete $1 finished" gone $pid || { cat $D/objects; stacks $pid; return 1; }
	wait $pid
}

objects_balanced() {
	grep -q "$1 made \([0-9]*\) freed \1 live 0" $D/objects || { cat $D/objects; return 1; }
}

unload_ibext() {
	rmmod ibext || return 1
	[ ! -e $D ] || { echo "debugfs left behind"; return 1; }
}

# ibext and the NVMe ports under the kernel's own module names: the tree
# scripts/build-flavour.sh made (updates/ beside upstream's kernel/) becomes
# /lib/modules/<release>, which virtme-ng put on a tmpfs.
modules_tree() {
	m=/lib/modules/$(uname -r)
	ln -sfn "$BDIR/modroot$m" $m &&
		modinfo -n nvmet-rdma | grep -q /updates/
}

# Traffic between rxe0 and rxe1. Both addresses are the guest's own, so the
# kernel would route one's packets to the other through lo, where no rxe is.
# Instead: a bridge joins veth1 and veth3, the far ends of veth0 and veth2;
# policy rules, ahead of the local table, send what A (veth0) sends to B
# (veth2) out of veth0 and the reverse out of veth2; and each side accepts
# packets whose source is a local address (accept_local, no rp_filter).
# IPv4 only.
LINK_A=10.14.0.1 LINK_B=10.14.0.2
# gid_low <device> <last 32 bits>: the IPv4 address's GID is in the device's
# table at an index below 256.
gid_low() {
	f=$(grep -l "ffff:$2\$" /sys/class/infiniband/$1/ports/1/gids/* 2>/dev/null | head -1)
	[ -n "$f" ] && [ "${f##*/}" -lt 256 ]
}
# link_gids: both addresses' GIDs in their devices' tables, below index 256
# (also after a device was deleted and added again).
link_gids() {
	wait_for 300 "rxe0's GID of $LINK_A" gid_low rxe0 0a0e:0001 &&
		wait_for 300 "rxe1's GID of $LINK_B" gid_low rxe1 0a0e:0002
}
link_devices() {
	ip link show br0 >/dev/null 2>&1 && { link_gids; return; }
	# The bridge itself takes no part in IPv4: were it to answer ARP for B,
	# A's packets would go to br0, where no rxe is (nor does it answer for
	# an address that is not its own: arp_ignore).
	modprobe bridge && ip link add br0 type bridge && ip link set br0 arp off up || return 1
	ip link set veth1 master br0 && ip link set veth3 master br0 || return 1
	for k in all/rp_filter=0 veth0/rp_filter=0 veth2/rp_filter=0 all/arp_ignore=1 \
		all/accept_local=1; do
		echo ${k#*=} > /proc/sys/net/ipv4/conf/${k%=*} || return 1
	done
	# main.sh nearly fills rxe0's GID table with veth0's IPv6 addresses, so
	# A's GID would come at an index above 255, and on 6.12 a connection
	# cannot use one: ib_global_route.sgid_index is a u8 (rdma_connect()
	# gives EINVAL). They go first: A's GID takes a low free slot.
	ip -6 addr flush dev veth0 scope global || return 1
	ip addr add $LINK_A/24 dev veth0 && ip addr add $LINK_B/24 dev veth2 && link_gids || return 1
	ip route add $LINK_B dev veth0 src $LINK_A table 14 &&
		ip route add $LINK_A dev veth2 src $LINK_B table 15 &&
		ip rule add pref 10 iif lo from $LINK_A to $LINK_B lookup 14 &&
		ip rule add pref 11 iif lo from $LINK_B to $LINK_A lookup 15 &&
		ip rule add pref 100 lookup local && ip rule del pref 0
}
