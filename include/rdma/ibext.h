/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ibext: shared-resource machinery for RDMA upper-layer protocols.
 *
 * C ULPs include this header and depend on ibext.ko; every function here is
 * exported with EXPORT_SYMBOL_GPL.  See Documentation/ibext.rst.
 */
#ifndef _RDMA_IBEXT_H
#define _RDMA_IBEXT_H

#include <rdma/ib_verbs.h>

#endif /* _RDMA_IBEXT_H */
