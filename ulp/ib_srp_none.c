// SPDX-License-Identifier: GPL-2.0
/*
 * make bench only: the SRP initiator port with IBEXT_MODERATION_NONE on its
 * receive CQs instead of ADAPTIVE, to measure ADAPTIVE against.
 */
#define IB_SRP_RECV_MODERATION IBEXT_MODERATION_NONE
#include "ib_srp.c"
