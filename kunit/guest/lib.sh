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

# rdma link delete under a watchdog: it must finish, however long ibext's
# users take to let go (bounded at 120 s).
link_delete_watched() {
	rdma link delete "$1" &
	pid=$!
	wait_for 120 "rdma link delete $1 finished" gone $pid || { cat $D/objects; return 1; }
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
