#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# make blktests, in the guest: the public blktests suite over soft-RoCE,
# against upstream's modules or against the ports of ulp/ installed under
# upstream's names (modules_tree). blktests sets up rxe itself on every
# Ethernet interface with a carrier and uses the IPv4 address it finds there.
# Usage: blktests.sh <upstream|ports> <ibext build dir> <kernel dir> <blktests checkout> <group...>
which=$1 BDIR=$2 KDIR=$3 dir=$4
shift 4
KSRC=$(readlink -f "$KDIR/source")
. "$(dirname "$0")/lib.sh"
grep -q " $CFS " /proc/mounts || mount -t configfs configfs $CFS
[ "$which" = upstream ] || modules_tree || exit 1
# The RDMA core and its ULP-facing modules first, as a real system loads them.
modprobe -a ib_core rdma_cm ib_uverbs crc32_generic || exit 1
# loop for the whole run: loaded by a test that needs it and unloaded after,
# it raced losetup in nvme/051 ("cannot find an unused loop device").
modprobe loop || exit 1
ip link add veth0 type veth peer name veth1 && ip link set veth0 up && ip link set veth1 up &&
	ip addr add 10.13.0.1/24 dev veth0 || exit 1
cd "$dir" && NVMET_TRTYPES=rdma USE_RXE=1 ./check -o /tmp/blktests-results "$@"
echo "ibext-blktests: done ($which)"
