/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ibext: shared-resource machinery for RDMA upper-layer protocols.
 *
 * C ULPs include this header and depend on ibext.ko; every function here is
 * exported with EXPORT_SYMBOL_GPL.  See Documentation/ibext.rst.
 */
#ifndef _RDMA_IBEXT_H
#define _RDMA_IBEXT_H

#include <rdma/ib_cache.h>
#include <rdma/ib_verbs.h>

/**
 * enum ibext_moderation - how a pooled CQ's completion events are moderated
 * @IBEXT_MODERATION_NONE: re-arm after every poll pass that ends under budget
 * @IBEXT_MODERATION_DIM: dynamic interrupt moderation with the kernel's
 *	lib/dim (rdma_dim()): the device's modify_cq applies the chosen profile
 *	where it has one; otherwise ibext applies it in software, deferring the
 *	next poll instead of re-arming.  The default of ibext_cq_pool_get() on
 *	devices that set use_cq_dim (as for upstream's ib_cq_pool_get());
 *	elsewhere its default is IBEXT_MODERATION_NONE.
 * @IBEXT_MODERATION_ADAPTIVE: NAPI-like: interrupt mode at low load, polling
 *	without re-arming at high load.  Where the device has no modify_cq,
 *	polling mode waits for the next poll on a timer while the waits find
 *	completions in batches (see Documentation/ibext.rst)
 *
 * CQs of different modes never share.
 */
enum ibext_moderation {
	IBEXT_MODERATION_NONE,
	IBEXT_MODERATION_DIM,
	IBEXT_MODERATION_ADAPTIVE,
};

/**
 * struct ibext_cq_attr - what ibext_cq_pool_get_attr() is asked for
 * @nr_cqe: entries needed, between 1 and the device's max_cqe
 * @comp_vector_hint: as for ibext_cq_pool_get()
 * @poll_ctx: as for ibext_cq_pool_get()
 * @moderation: one of enum ibext_moderation
 */
struct ibext_cq_attr {
	unsigned int nr_cqe;
	int comp_vector_hint;
	enum ib_poll_context poll_ctx;
	enum ibext_moderation moderation;
};

/**
 * ibext_cq_pool_get() - Take entries on a shared CQ from ibext's pool
 * @dev: the RDMA device the CQ is for
 * @nr_cqe: the number of completion entries the caller needs (its QP's
 *	send or receive queue depth), between 1 and the device's max_cqe
 * @comp_vector_hint: completion vector to use; it maps to
 *	hint % min(num_comp_vectors, num_online_cpus()), the CPUs online at the
 *	time of the call.  A negative hint takes the device's next vector
 *	round-robin, over the same count.
 * @poll_ctx: IB_POLL_SOFTIRQ, IB_POLL_WORKQUEUE or IB_POLL_UNBOUND_WORKQUEUE;
 *	each context has its own CQs.  IB_POLL_DIRECT cannot be pooled.
 *
 * A drop-in for ib_cq_pool_get().  Among the CQs on the chosen vector with
 * room for @nr_cqe, the one with the fewest entries in use is taken.  When
 * none has room, the pool grows by one CQ per usable vector, each of
 * min(max_cqe, max(@nr_cqe, 4096)) entries.  A CQ whose entries have all
 * been put back for the module parameter ibext.age_ms (60 s by default) is
 * destroyed, except the oldest CQ of each vector of each pool (poll context
 * and moderation), so that the pool shrinks back to one CQ per vector it has
 * served after a burst of connections.  A CQ with entries in use is never
 * destroyed by aging.  A CQ made on a vector that is beyond the usable count
 * after CPUs went offline keeps working for its holders.
 *
 * Work requests posted to QPs on the CQ must set wr_cqe; ibext's completion
 * engine calls wc->wr_cqe->done(cq, wc) once for every completion, in the
 * poll context asked for (softirq budget 256, workqueue budget 65536).
 * Pooled CQs are destroyed when the device is removed from ibext, after every
 * ULP registered later than ibext has been removed from it.
 *
 * Context: process context; may sleep.
 * Return: the CQ, or an ERR_PTR(): -EINVAL for a NULL @dev, @nr_cqe of 0 or
 * above max_cqe, or a @poll_ctx that cannot be pooled; -ENODEV if ibext is
 * not attached to @dev; -ENOMEM or the driver's error if a CQ cannot be made.
 * Nothing changes on error.
 */
struct ib_cq *ibext_cq_pool_get(struct ib_device *dev, unsigned int nr_cqe,
				int comp_vector_hint,
				enum ib_poll_context poll_ctx);

/**
 * ibext_cq_pool_get_attr() - Take entries on a shared CQ, with its moderation
 * @dev: the RDMA device the CQ is for
 * @attr: what is asked for (see struct ibext_cq_attr)
 *
 * ibext_cq_pool_get() is this with @attr->moderation IBEXT_MODERATION_DIM if
 * @dev->use_cq_dim is set, IBEXT_MODERATION_NONE otherwise: upstream's
 * ib_cq_pool_get() behaviour.
 *
 * Context: process context; may sleep.
 * Return: as ibext_cq_pool_get(); also -EINVAL for a NULL @attr or an
 * unknown @attr->moderation.
 */
struct ib_cq *ibext_cq_pool_get_attr(struct ib_device *dev,
				     const struct ibext_cq_attr *attr);

/**
 * ibext_cq_pool_put() - Give back entries taken with ibext_cq_pool_get()
 * @cq: the CQ ibext_cq_pool_get() returned
 * @nr_cqe: the number of entries taken with it
 *
 * A drop-in for ib_cq_pool_put().  Putting back a CQ that is not pooled by
 * ibext, or more entries than are in use on it, is a caller bug: it warns
 * once and changes nothing.
 *
 * Context: process context; may sleep.
 */
void ibext_cq_pool_put(struct ib_cq *cq, unsigned int nr_cqe);

/**
 * ibext_dim_attach() - Attach DIM to a CQ a ULP made with ib_create_cq()
 * @cq: the ULP's own CQ (not one of ibext's pooled CQs)
 *
 * For ULPs that own their CQs and poll them themselves.  After each poll
 * loop the ULP calls ibext_dim_sample() with the completions it handled.
 * Where the device has modify_cq, ibext runs the kernel's rdma_dim() on the
 * samples and applies a new profile with it.  Elsewhere (rxe) the profile is
 * applied in software if the ULP re-arms with ibext_dim_arm() instead of
 * ib_req_notify_cq(), which leaves the CQ unarmed for the profile's period
 * (software moderation), and it is chosen by what those deferrals batch:
 * profile 0, or the highest (32 us or 32 completions) while the runs that
 * ibext's handler calls start find one completion each or more, its period
 * doubled, up to 128 us, while they find fewer than 3 (at the longest period
 * fewer than 1.5 turns it off), tried again after a back-off when they find
 * less than one.  The ULP calls ibext_dim_detach() before it destroys the CQ.
 *
 * Context: process context; may sleep.
 * Return: 0; -EINVAL for a NULL @cq or a pooled one; -EBUSY if @cq already
 * has DIM attached (ibext's or ib_core's); -ENOMEM.
 */
int ibext_dim_attach(struct ib_cq *cq);

/**
 * ibext_dim_sample() - Feed DIM the completions of one poll loop
 * @cq: a CQ with ibext's DIM attached
 * @ncompleted: completions the loop handled
 *
 * Called from the ULP's poll loop, one call at a time per CQ, never
 * concurrently with ibext_dim_detach().  Without DIM attached it warns once
 * and does nothing.
 *
 * Context: any context the ULP polls in; does not sleep.
 */
void ibext_dim_sample(struct ib_cq *cq, unsigned int ncompleted);

/**
 * ibext_dim_detach() - Detach and free DIM from a CQ
 * @cq: a CQ with ibext's DIM attached
 *
 * Frees everything ibext_dim_attach() made.  Without DIM attached it warns
 * once and does nothing.
 *
 * Context: process context; may sleep.
 */
void ibext_dim_detach(struct ib_cq *cq);

/**
 * ibext_dim_profile() - Read the DIM profile now in force
 * @cq: a CQ with ibext's DIM attached
 * @usec: the profile's period in microseconds
 * @comps: the profile's completion count
 *
 * Context: any context; does not sleep.
 * Return: 0; -EINVAL for a NULL argument or a CQ without ibext's DIM.
 */
int ibext_dim_profile(struct ib_cq *cq, unsigned int *usec, unsigned int *comps);

/**
 * ibext_dim_arm() - Re-arm a CQ as its DIM profile asks
 * @cq: a CQ with ibext's DIM attached, made with a comp_handler
 * @flags: as for ib_req_notify_cq(): IB_CQ_NEXT_COMP or IB_CQ_SOLICITED,
 *	optionally with IB_CQ_REPORT_MISSED_EVENTS
 *
 * Called by the ULP instead of ib_req_notify_cq() after a poll loop, and
 * after the ibext_dim_sample() of that loop: poll, sample, arm, and poll
 * again if the arm, asked with IB_CQ_REPORT_MISSED_EVENTS, returns > 0.
 * Where the device moderates the CQ itself (it took the profile with
 * modify_cq), or at profile 0, it is ib_req_notify_cq().  Otherwise (rxe,
 * and every device without modify_cq) ibext moderates in software, by the
 * rule its own CQs follow: if the loop just sampled found at least the
 * profile's completions (a device would raise the next event at once), or
 * if it was started by ibext (below) and found nothing (the CQ went quiet),
 * @cq is armed at once.  Else @cq stays unarmed, so the device raises no
 * event for what arrives, and after the profile's period ibext calls the
 * CQ's comp_handler itself, once, with interrupts off, as a driver would (in
 * softirq context), without arming: the ULP polls the batch and calls
 * ibext_dim_arm() again.  That call is the CQ's only notification until the
 * ULP arms it again, and may come before ibext_dim_arm() returns: the
 * handler must treat it as any event (a ULP that counts events must count
 * from before the arm).  Nothing is lost: the handler is called whether or
 * not completions arrived.  Arms made while one is deferred join it.
 * ibext_dim_detach() ends a deferred arm at once by arming @cq with the
 * flags asked (IB_CQ_NEXT_COMP if any asked for it) and
 * IB_CQ_REPORT_MISSED_EVENTS, calling comp_handler if completions are
 * waiting, so comp_handler may run before it returns.  The ULP may keep
 * polling after the call, as after ib_req_notify_cq().  Without DIM attached
 * it warns once and calls ib_req_notify_cq().
 *
 * Context: any context the ULP polls in; does not sleep.  Never concurrently
 * with ibext_dim_detach() on @cq.
 * Return: what ib_req_notify_cq() returned if the CQ was armed at once
 * (with IB_CQ_REPORT_MISSED_EVENTS, positive if completions may be waiting);
 * 0 if the re-arm was deferred; -EINVAL for a NULL @cq, invalid @flags or a
 * CQ without a comp_handler.
 */
int ibext_dim_arm(struct ib_cq *cq, unsigned int flags);

/**
 * ibext_dim_poll_done() - Sample a poll loop and re-arm, in one call
 * @cq: a CQ with ibext's DIM attached, made with a comp_handler
 * @ncompleted: completions the loop handled
 * @flags: as for ibext_dim_arm()
 *
 * ibext_dim_sample(@cq, @ncompleted) followed by ibext_dim_arm(@cq, @flags),
 * for the ULP that does both after every poll loop, as RDS's tasklets do:
 * poll, ibext_dim_poll_done(), and poll again if it returns > 0.  One call
 * instead of two on a path that runs for every event.  Bad @flags or a CQ
 * without a comp_handler change nothing: no sample is taken.  Without DIM
 * attached it warns once and calls ib_req_notify_cq().
 *
 * Context: any context the ULP polls in; does not sleep.  Never concurrently
 * with ibext_dim_detach() on @cq.
 * Return: as ibext_dim_arm().
 */
int ibext_dim_poll_done(struct ib_cq *cq, unsigned int ncompleted,
			unsigned int flags);

/**
 * ibext_find_gid() - Find a GID in a device's GID tables, in O(1)
 * @dev: the device to search
 * @gid: the GID to find
 * @gid_type: the GID type to find
 * @ndev: the net device the entry must have; NULL matches any
 *
 * A drop-in for rdma_find_gid(): the same result, found through ibext's
 * hashed mirror of each port's table instead of a linear scan.  Every entry
 * the mirror names is confirmed with rdma_get_gid_attr() and compared before
 * it is returned; when the mirror is stale (a GID change is being rescanned,
 * or a named entry did not confirm) a miss falls back to the core's own
 * lookup, so a wrong entry is never returned.  Ports are searched in order
 * and, within a port, the lowest matching index wins, as upstream.
 *
 * Context: any context, including atomic; takes no sleeping lock.
 * Return: a referenced attribute, released with rdma_put_gid_attr();
 * ERR_PTR(-ENOENT) if there is no match; ERR_PTR(-EINVAL) for a NULL @dev or
 * @gid or an unknown @gid_type.
 */
const struct ib_gid_attr *ibext_find_gid(struct ib_device *dev,
					 const union ib_gid *gid,
					 enum ib_gid_type gid_type,
					 struct net_device *ndev);

/**
 * ibext_find_gid_by_port() - Find a GID in one port's GID table, in O(1)
 * @dev: the device to search
 * @gid: the GID to find
 * @gid_type: the GID type to find
 * @port: the port whose table is searched
 * @ndev: the net device the entry must have; NULL matches any
 *
 * A drop-in for rdma_find_gid_by_port(), as ibext_find_gid() is for
 * rdma_find_gid().  Unlike upstream, a port out of range is -EINVAL, not
 * -ENOENT.
 *
 * Context: any context, including atomic; takes no sleeping lock.
 * Return: a referenced attribute, released with rdma_put_gid_attr();
 * ERR_PTR(-ENOENT) if there is no match; ERR_PTR(-EINVAL) for a NULL @dev or
 * @gid, an unknown @gid_type, or a @port the device does not have.
 */
const struct ib_gid_attr *ibext_find_gid_by_port(struct ib_device *dev,
						 const union ib_gid *gid,
						 enum ib_gid_type gid_type,
						 u32 port,
						 struct net_device *ndev);

/**
 * enum ibext_recv_action - what becomes of a managed buffer after recv_done
 * @IBEXT_RECV_REPOST: ibext posts it again when recv_done returns
 * @IBEXT_RECV_KEEP: the ULP keeps it, with its contents, and gives it back
 *	later with ibext_srq_pool_repost(pool, wc->wr_cqe) (after it has sent
 *	its response, say)
 */
enum ibext_recv_action {
	IBEXT_RECV_REPOST,
	IBEXT_RECV_KEEP,
};

/**
 * enum ibext_srq_pressure - what ibext tells a ULP about an SRQ's receives
 * @IBEXT_SRQ_LOW: the SRQ's limit was reached and the ULP posts its own
 *	receives: it may post more, up to @posted (the SRQ's max_srq_size)
 * @IBEXT_SRQ_GROWN: ibext posted a step of managed buffers more; @posted is
 *	the number it now keeps posted
 * @IBEXT_SRQ_SHRUNK: no limit event for ibext.age_ms (60 s by default):
 *	ibext gives a step of managed buffers back as they return; @posted is
 *	the number it now keeps posted
 * @IBEXT_SRQ_QUIET: no limit event for ibext.age_ms on an SRQ whose
 *	receives the ULP posts and on which it said
 *	(ibext_srq_pool_set_posted()) it keeps more posted than @srq_size: it
 *	may give some back, as they return, and say so again; @posted is the
 *	number it last said.  Once per quiet period.
 */
enum ibext_srq_pressure {
	IBEXT_SRQ_LOW,
	IBEXT_SRQ_GROWN,
	IBEXT_SRQ_SHRUNK,
	IBEXT_SRQ_QUIET,
};

/**
 * struct ibext_srq_pool_attr - what ibext_srq_pool_create() is asked for
 * @nr_srqs: SRQs in the pool; 0: one per completion vector in use
 *	(min(num_comp_vectors, num_online_cpus())), capped by max_srq
 * @srq_size: receive WRs per SRQ, at least 1; clamped to max_srq_wr
 * @max_sge: scatter entries per receive, 1 to max_srq_sge
 * @buf_size: 0: the ULP posts its own receives with ib_post_srq_recv();
 *	otherwise ibext allocates, DMA-maps and posts @srq_size buffers of this
 *	many bytes (at most 64 KiB) per SRQ and reposts each after @recv_done
 * @recv_done: with managed buffers, called for every successful receive
 *	completion, in the poll context of the QP's receive CQ, with the SRQ,
 *	the work completion and the buffer; returns IBEXT_RECV_REPOST (the
 *	buffer is valid only during the call) or IBEXT_RECV_KEEP (it stays the
 *	ULP's until ibext_srq_pool_repost()); must be NULL without managed
 *	buffers. A receive that completes in error is not handed to the ULP:
 *	its buffer is posted again, also when a QP's move to the error state
 *	flushed it (IB_WC_WR_FLUSH_ERR), so that no buffer is lost to the pool
 * @ctx: handed to @recv_done and @pressure unchanged
 * @max_srq_size: the most receives each SRQ may hold; each SRQ is made with
 *	room for this many.  0: with managed buffers, 4 * @srq_size (clamped to
 *	max_srq_wr, and cut so that the pool's buffers stay within 256 MiB);
 *	without, @srq_size.  Below @srq_size (and not 0): -EINVAL; above
 *	max_srq_wr: clamped; with managed buffers, over 256 MiB in all: -EINVAL
 * @pressure: optional; called in process context (never from @recv_done's
 *	context), with the SRQ, what changed (enum ibext_srq_pressure), a count
 *	and @ctx.  Must not destroy the pool.
 */
struct ibext_srq_pool_attr {
	unsigned int nr_srqs;
	unsigned int srq_size;
	unsigned int max_sge;
	unsigned int buf_size;
	enum ibext_recv_action (*recv_done)(struct ib_srq *srq,
					    struct ib_wc *wc, void *buf,
					    void *ctx);
	void *ctx;
	unsigned int max_srq_size;
	void (*pressure)(struct ib_srq *srq, enum ibext_srq_pressure what,
			 unsigned int posted, void *ctx);
};

struct ibext_srq_pool;

/**
 * ibext_srq_pool_create() - Make a pool of shared receive queues on a PD
 * @pd: the protection domain the SRQs (and the QPs using them) belong to
 * @attr: what is asked for (see struct ibext_srq_pool_attr)
 *
 * Each SRQ's limit is armed at a quarter of @attr->srq_size (none below 4
 * entries) and IB_EVENT_SRQ_LIMIT_REACHED is counted and re-armed, so that
 * the risk of running out of receives shows in debugfs.  With managed
 * buffers, each limit event also grows that SRQ by a step of buffers (at
 * least @attr->srq_size, at most 8 steps to the cap), up to
 * @attr->max_srq_size, and re-arms the limit at a quarter of what is posted
 * then; after ibext.age_ms (60 s by default) without a limit event the
 * newest step is retired, its buffers freed as they come back (a buffer
 * still posted comes back only when a message consumes it).  Without
 * managed buffers, a limit event calls @attr->pressure with IBEXT_SRQ_LOW
 * and the ULP decides.  With managed buffers, receive completions arrive
 * through the receive CQ of each QP using the pool (a CQ from
 * ibext_cq_pool_get() composes), whose poller calls ibext's handler, which
 * calls @attr->recv_done and reposts.
 *
 * Context: process context; may sleep.
 * Return: the pool, or an ERR_PTR(): -EINVAL for a NULL argument or
 * nonsense attributes; -EOPNOTSUPP if the device has no SRQs; -ENODEV if
 * ibext is not attached to the device; -ENOMEM or the driver's error if
 * something cannot be made, after everything made so far is undone.
 */
struct ibext_srq_pool *ibext_srq_pool_create(struct ib_pd *pd,
					     const struct ibext_srq_pool_attr *attr);

/**
 * ibext_srq_pool_get() - Take a reference to one of the pool's SRQs
 * @pool: the pool
 * @comp_vector_hint: the completion vector of the QP that will use the SRQ
 *
 * With one SRQ per vector, the SRQ of the hint's vector; with fewer SRQs
 * than vectors, or a negative hint, the least-referenced SRQ.
 *
 * Context: process context; may sleep.
 * Return: the SRQ for ib_qp_init_attr.srq, or ERR_PTR(-EINVAL) for a NULL
 * @pool, or ERR_PTR(-ENODEV) for a pool being destroyed.
 */
struct ib_srq *ibext_srq_pool_get(struct ibext_srq_pool *pool,
				  int comp_vector_hint);

/**
 * ibext_srq_pool_put() - Drop a reference taken with ibext_srq_pool_get()
 * @pool: the pool
 * @srq: the SRQ ibext_srq_pool_get() returned
 *
 * Called after the QP that used @srq is destroyed and its receive
 * completions have been handled (the QP moved to the error state and
 * IB_EVENT_QP_LAST_WQE_REACHED seen, or every expected message received).
 * Putting back an SRQ of another pool, or more references than were taken,
 * is a caller bug: it warns once and changes nothing.
 *
 * Context: process context; may sleep.
 */
void ibext_srq_pool_put(struct ibext_srq_pool *pool, struct ib_srq *srq);

/**
 * ibext_srq_pool_nr_srqs() - The number of SRQs in a pool
 * @pool: the pool
 *
 * For a ULP that posts its own receives (@buf_size 0): it sets up each SRQ,
 * 0 to this count - 1, with ibext_srq_pool_srq() before any QP uses it.
 *
 * Context: any.
 * Return: the number of SRQs, fixed for the pool's life; 0 for a NULL @pool.
 */
unsigned int ibext_srq_pool_nr_srqs(struct ibext_srq_pool *pool);

/**
 * ibext_srq_pool_srq() - SRQ @index of a pool
 * @pool: the pool
 * @index: 0 to ibext_srq_pool_nr_srqs() - 1
 *
 * Gives access to the SRQ without taking a reference: to post its initial
 * receives and reposts (ib_post_srq_recv()), and to give it a context with
 * ibext_srq_pool_set_srq_ctx().  QPs still take theirs with
 * ibext_srq_pool_get().  The SRQ lives until ibext_srq_pool_destroy(); a
 * ULP's receive buffers posted on it must outlive that call.
 *
 * Context: any.
 * Return: the SRQ, or ERR_PTR(-EINVAL) for a NULL @pool or an @index out of
 * range.
 */
struct ib_srq *ibext_srq_pool_srq(struct ibext_srq_pool *pool,
				  unsigned int index);

/**
 * ibext_srq_pool_set_srq_ctx() - Give SRQ @index of a pool a ULP context
 * @pool: the pool
 * @index: 0 to ibext_srq_pool_nr_srqs() - 1
 * @ctx: the ULP's per-SRQ context (its receive commands, say); ibext never
 *	dereferences it
 *
 * Context: any.
 * Return: 0, or -EINVAL for a NULL @pool or an @index out of range.
 */
int ibext_srq_pool_set_srq_ctx(struct ibext_srq_pool *pool,
			       unsigned int index, void *ctx);

/**
 * ibext_srq_pool_srq_ctx() - The ULP context of one of a pool's SRQs
 * @pool: the pool
 * @srq: an SRQ of @pool (from ibext_srq_pool_get() or ibext_srq_pool_srq())
 *
 * Lets a ULP find its per-SRQ state from the SRQ a QP was given.  An @srq of
 * another pool is a caller bug: it warns once.
 *
 * Context: any.
 * Return: the context last set for @srq (NULL if none was); NULL for a NULL
 * @pool or an @srq not of @pool.
 */
void *ibext_srq_pool_srq_ctx(struct ibext_srq_pool *pool, struct ib_srq *srq);

/**
 * ibext_srq_pool_repost() - Give back a managed buffer recv_done kept
 * @pool: the pool
 * @cqe: the wc->wr_cqe of the completion whose recv_done returned
 *	IBEXT_RECV_KEEP
 *
 * Posts the buffer on its SRQ again.  A @cqe that is not a kept buffer of
 * @pool (never kept, or given back already) is a caller bug: it warns once
 * and changes nothing.  Only the address of @cqe is used to find it.
 *
 * Context: any (ib_post_srq_recv() does not sleep).
 * Return: 0; -EINVAL for a NULL @pool or a @cqe that is not a kept buffer
 * of @pool; the errno of ib_post_srq_recv() if the post failed (the buffer
 * is then counted as lost).
 */
int ibext_srq_pool_repost(struct ibext_srq_pool *pool, struct ib_cqe *cqe);

/**
 * ibext_srq_pool_set_posted() - Say how many receives a ULP keeps posted
 * @pool: a pool whose ULP posts its own receives (@buf_size 0)
 * @srq: one of its SRQs
 * @posted: the receives the ULP now keeps posted on @srq, 1 to the pool's
 *	max_srq_size
 *
 * The pool is made assuming @srq_size receives posted on each SRQ.  A ULP
 * that posts more when it hears IBEXT_SRQ_LOW, or gives some back when it
 * hears IBEXT_SRQ_QUIET, says so here: ibext re-arms the SRQ's limit at a
 * quarter of @posted (from its maintenance work: at once, or when the
 * @pressure call it is made from returns), and while @posted is above
 * @srq_size, a quiet period tells the ULP IBEXT_SRQ_QUIET.  Receives given
 * back that are still posted come back only as messages consume them.
 *
 * Context: any, including the pool's @pressure callback.
 * Return: 0; -EINVAL for a NULL @pool, a pool with managed buffers, @posted
 * 0 or above max_srq_size, or an @srq not of @pool (a caller bug: warned
 * once).
 */
int ibext_srq_pool_set_posted(struct ibext_srq_pool *pool, struct ib_srq *srq,
			      unsigned int posted);

/**
 * ibext_srq_pool_destroy() - Destroy a pool whose SRQs are no longer used
 * @pool: the pool
 *
 * Closes the SRQs (handlers that start from then on neither call
 * @recv_done nor post), waits for the handlers ibext's completion engine is
 * running, destroys the SRQs, unmaps and frees the managed buffers, and
 * frees the pool.  Must be called before the PD is deallocated and before
 * the ULP's client remove for the device returns, and not from the pool's
 * own @pressure callback (which teardown would wait for).
 *
 * Context: process context; may sleep.
 * Return: 0; -EBUSY if any SRQ still has references or a QP attached, or
 * a managed buffer is still kept (nothing is freed); -EDEADLK, with a
 * warning, when called from the pool's own @pressure callback (nothing
 * changes); -EINVAL for a NULL @pool.
 */
int ibext_srq_pool_destroy(struct ibext_srq_pool *pool);

#endif /* _RDMA_IBEXT_H */
