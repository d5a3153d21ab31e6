/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The C headers ibext's private bindgen pass reads.  The kernel's own
 * kernel::bindings on 6.12 has no RDMA types; the allowlists in Kbuild keep
 * this to what ibext uses.
 */
#include <linux/debugfs.h>
#include <linux/dim.h>
#include <linux/irq_poll.h>
#include <linux/seq_file.h>
#include <linux/sort.h>
#include <linux/umh.h>
#include <rdma/ib_cache.h>
#include <rdma/ib_verbs.h>
#include <rdma/ibext.h>

#include "ibext_shim.h"
