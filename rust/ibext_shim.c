// SPDX-License-Identifier: GPL-2.0
/*
 * The C half of ibext.ko.
 *
 * C is used only where Rust on 6.12 cannot do the job:
 *  - static inline helpers of ib_core, wrapped so that bindgen sees symbols;
 *  - WARN(), which has no Rust binding on 6.12;
 *  - file_operations built by DEFINE_SHOW_ATTRIBUTE;
 *  - module parameters, which the module! macro of 6.12 cannot declare;
 *  - EXPORT_SYMBOL_GPL of the C API, whose bodies are #[no_mangle] Rust
 *    functions in the same module.
 */
#include <linux/bug.h>
#include <linux/cpumask.h>
#include <linux/module.h>
#include <linux/percpu.h>
#include <linux/rcupdate.h>
#include <linux/srcu.h>
#include <linux/workqueue.h>
#include <rdma/ibext.h>

#include "ibext_shim.h"

static int ibext_show_show(struct seq_file *m, void *unused)
{
	struct ibext_show *show = m->private;

	return show->show(m, show->data);
}
DEFINE_SHOW_ATTRIBUTE(ibext_show);

struct dentry *ibext_shim_debugfs_create_show(const char *name,
					      struct dentry *parent,
					      struct ibext_show *show)
{
	return debugfs_create_file(name, 0444, parent, show, &ibext_show_fops);
}

/*
 * ibext.age_ms: how long a pooled CQ stays idle, and an SRQ stays grown
 * without a limit event, before ibext gives it (or a step of it) back.  Read
 * at each aging decision; a pass already scheduled keeps its time.  1 s to
 * 1 h, else -EINVAL and the value is unchanged.
 */
static unsigned int ibext_age_ms = IBEXT_AGE_MS_DEFAULT;

static int ibext_age_ms_set(const char *val, const struct kernel_param *kp)
{
	unsigned int ms;
	int ret = kstrtouint(val, 0, &ms);

	if (ret)
		return ret;
	if (ms < 1000 || ms > 3600 * 1000)
		return -EINVAL;
	WRITE_ONCE(ibext_age_ms, ms);
	return 0;
}

static const struct kernel_param_ops ibext_age_ms_ops = {
	.set = ibext_age_ms_set,
	.get = param_get_uint,
};
module_param_cb(age_ms, &ibext_age_ms_ops, &ibext_age_ms, 0644);
MODULE_PARM_DESC(age_ms,
	"milliseconds a pooled CQ stays idle, or a grown SRQ quiet, before it is given back (1000 to 3600000, default 60000)");

unsigned int ibext_shim_age_ms(void)
{
	return READ_ONCE(ibext_age_ms);
}

#ifdef IBEXT_KUNIT
int ibext_test_set_age_ms(const char *val)
{
	return ibext_age_ms_set(val, NULL);
}
#endif

void *ibext_shim_get_client_data(struct ib_device *dev,
				 struct ib_client *client)
{
	return ib_get_client_data(dev, client);
}

unsigned int ibext_shim_num_online_cpus(void)
{
	return num_online_cpus();
}

void ibext_shim_warn(const char *file, int line, const char *msg)
{
	WARN(1, "ibext: %s at %s:%d\n", msg, file, line);
}

/*
 * A pooled CQ is marked shared, as ib_core marks its own pooled CQs: 6.12's
 * ib_destroy_cq_user() then warns and refuses (-EOPNOTSUPP).  ibext clears
 * the mark before it destroys the CQ itself.
 */
void ibext_shim_cq_set_pooled(struct ib_cq *cq, bool pooled)
{
	cq->shared = pooled;
}

/*
 * 6.12's ib_free_cq() does not look at ->shared; it warns and refuses only
 * while ->usecnt or ->cqe_used is nonzero.  ibext keeps ->cqe_used equal to
 * the entries ULPs hold on the CQ, under the pool's lock, as ib_core's own
 * pool does in ib_cq_pool_get()/ib_cq_pool_put().
 */
void ibext_shim_cq_set_used(struct ib_cq *cq, unsigned int used)
{
	WRITE_ONCE(cq->cqe_used, used);
}

/*
 * The device's own modify_cq.  6.12's rdma_set_cq_moderation() (verbs.c)
 * refuses CQs marked shared before it reaches the driver, to keep ULPs off
 * ib_core's pooled CQs; ibext owns its pooled CQs and applies their DIM
 * profiles itself, so it calls the op rdma_set_cq_moderation() would call.
 */
int ibext_shim_modify_cq(struct ib_cq *cq, u16 cq_count, u16 cq_period)
{
	if (!cq->device->ops.modify_cq)
		return -EOPNOTSUPP;
	return cq->device->ops.modify_cq(cq, cq_count, cq_period);
}

/* Returns the completion handler the CQ was made with, to recognise ibext's. */
void *ibext_shim_cq_comp_handler(struct ib_cq *cq)
{
	return cq->comp_handler;
}

/* ib_device_try_get() is a static inline: a reference that holds off unregistration. */
bool ibext_shim_device_try_get(struct ib_device *dev)
{
	return ib_device_try_get(dev);
}

/* Whether @srq still has QPs attached (ib_destroy_srq_user() would fail). */
bool ibext_shim_srq_in_use(struct ib_srq *srq)
{
	return atomic_read(&srq->usecnt) != 0;
}

/* Whether ib_core polls @cq itself (ib_alloc_cq() gives every such CQ a ->wc). */
bool ibext_shim_cq_polled_by_core(struct ib_cq *cq)
{
	return cq->wc != NULL;
}

/* ib_req_notify_cq() is a static inline. */
int ibext_shim_req_notify_cq(struct ib_cq *cq, enum ib_cq_notify_flags flags)
{
	return ib_req_notify_cq(cq, flags);
}

/*
 * The end of a legacy ULP's deferral (ibext_dim_arm()): calls @cq's
 * comp_handler without arming the CQ, with interrupts off, as drivers call it
 * (6.12's rxe_cq_post() calls it under cq->cq_lock taken with
 * spin_lock_irqsave()); the ULP polls and re-arms through ibext again.
 */
void ibext_shim_cq_raise(struct ib_cq *cq)
{
	unsigned long irqflags;

	local_irq_save(irqflags);
	cq->comp_handler(cq, cq->cq_context);
	local_irq_restore(irqflags);
}

/*
 * The end of a legacy ULP's deferral at ibext_dim_detach(): arms @cq with
 * @flags, which include IB_CQ_REPORT_MISSED_EVENTS, and if the driver says
 * completions may have arrived while the CQ was not armed, raises the event
 * the arm would have raised (ibext_shim_cq_raise()).  A completion that
 * arrives after the arm raises its own event; so none is lost, and a
 * spurious call only finds the CQ empty, as ib_req_notify_cq() documents for
 * IB_CQ_REPORT_MISSED_EVENTS.
 */
void ibext_shim_cq_arm_or_raise(struct ib_cq *cq, enum ib_cq_notify_flags flags)
{
	if (ib_req_notify_cq(cq, flags) > 0)
		ibext_shim_cq_raise(cq);
}

/* Soft expiry: the timer runs in softirq context, like the poll it schedules. */
void ibext_shim_hrtimer_init(struct hrtimer *timer,
			     enum hrtimer_restart (*fn)(struct hrtimer *))
{
	hrtimer_init(timer, CLOCK_MONOTONIC, HRTIMER_MODE_REL_SOFT);
	timer->function = fn;
}

void ibext_shim_hrtimer_start_us(struct hrtimer *timer, unsigned int usec)
{
	hrtimer_start(timer, ns_to_ktime((u64)usec * NSEC_PER_USEC),
		      HRTIMER_MODE_REL_SOFT);
}

/*
 * A pool whose handlers ibext's completion engine may be running waits for
 * them before it frees what they use.  Handlers polled from a work item may
 * sleep, so they run inside a read-side section of this SRCU; handlers polled
 * by irq_poll run in softirq context, with bottom halves disabled, which since
 * the RCU flavour consolidation (4.20) synchronize_rcu() waits for, so they
 * need no section of their own (it would cost two full barriers per pass).
 * ibext_shim_handlers_wait() waits for both.
 */
DEFINE_STATIC_SRCU(ibext_handler_srcu);

int ibext_shim_handlers_enter(void)
{
	return srcu_read_lock(&ibext_handler_srcu);
}

void ibext_shim_handlers_exit(int idx)
{
	srcu_read_unlock(&ibext_handler_srcu, idx);
}

void ibext_shim_handlers_wait(void)
{
	synchronize_srcu(&ibext_handler_srcu);
	synchronize_rcu();
}

void ibext_shim_rcu_read_lock(void)
{
	rcu_read_lock();
}

void ibext_shim_rcu_read_unlock(void)
{
	rcu_read_unlock();
}

bool ibext_shim_cq_is_pooled(struct ib_cq *cq)
{
	return cq->shared;
}

/*
 * INIT_WORK() expands one static lock_class_key per expansion, so a single
 * wrapper would give every ibext work item one lockdep class.  The caller
 * passes a key of its own instead (one static per Rust call site, see
 * init_work! in rust/ib/mod.rs), as the kernel's own Rust workqueue does.
 */
void ibext_shim_init_work(struct work_struct *work, work_func_t func,
			  const char *name, struct lock_class_key *key)
{
	__init_work(work, 0);
	work->data = (atomic_long_t)WORK_DATA_INIT();
	lockdep_init_map(&work->lockdep_map, name, key, 0);
	INIT_LIST_HEAD(&work->entry);
	work->func = func;
}

bool ibext_shim_queue_work(struct workqueue_struct *wq, struct work_struct *work)
{
	return queue_work(wq, work);
}

/* INIT_DELAYED_WORK with the caller's lockdep class (as ibext_shim_init_work). */
void ibext_shim_init_delayed_work(struct delayed_work *dw, work_func_t func,
				  const char *name, struct lock_class_key *key)
{
	ibext_shim_init_work(&dw->work, func, name, key);
	timer_setup(&dw->timer, delayed_work_timer_fn, TIMER_IRQSAFE);
}

/* On system_unbound_wq: aging is housekeeping, tied to no CPU. */
bool ibext_shim_queue_delayed_work(struct delayed_work *dw, unsigned int ms)
{
	return queue_delayed_work(system_unbound_wq, dw, msecs_to_jiffies(ms));
}

/* Queues, or moves a queued item to, @ms from now; any context. */
bool ibext_shim_mod_delayed_work(struct delayed_work *dw, unsigned int ms)
{
	return mod_delayed_work(system_unbound_wq, dw, msecs_to_jiffies(ms));
}

bool ibext_shim_disable_delayed_work_sync(struct delayed_work *dw)
{
	return disable_delayed_work_sync(dw);
}

bool ibext_shim_flush_delayed_work(struct delayed_work *dw)
{
	return flush_delayed_work(dw);
}

bool ibext_shim_delayed_work_pending(struct delayed_work *dw)
{
	return delayed_work_pending(dw);
}

u64 ibext_shim_now_ms(void)
{
	return jiffies64_to_msecs(get_jiffies_64());
}

/* The same flags as ib_core's ib_comp_wq and ib_comp_unbound_wq. */
struct workqueue_struct *ibext_shim_alloc_comp_wq(bool unbound)
{
	if (unbound)
		return alloc_workqueue("ibext_comp_unbound",
				       WQ_UNBOUND | WQ_HIGHPRI | WQ_MEM_RECLAIM, 0);
	return alloc_workqueue("ibext_comp",
			       WQ_HIGHPRI | WQ_MEM_RECLAIM | WQ_SYSFS, 0);
}

bool ibext_shim_port_valid(struct ib_device *dev, u32 port)
{
	return rdma_is_port_valid(dev, port);
}

bool ibext_shim_port_is_roce(struct ib_device *dev, u32 port)
{
	return rdma_protocol_roce(dev, port);
}

u32 ibext_shim_start_port(struct ib_device *dev)
{
	return rdma_start_port(dev);
}

u32 ibext_shim_end_port(struct ib_device *dev)
{
	return rdma_end_port(dev);
}

/* @port must be valid (ibext_shim_port_valid()). */
u32 ibext_shim_gid_tbl_len(struct ib_device *dev, u32 port)
{
	return dev->port_data[port].immutable.gid_tbl_len;
}

void ibext_shim_init_event_handler(struct ib_event_handler *h,
				   struct ib_device *dev,
				   void (*fn)(struct ib_event_handler *,
					      struct ib_event *))
{
	INIT_IB_EVENT_HANDLER(h, dev, fn);
}

bool ibext_shim_queue_work_unbound(struct work_struct *work)
{
	return queue_work(system_unbound_wq, work);
}

/*
 * Per-CPU u64 counters for hot paths that any CPU may run (GID lookups): one
 * increment touches only the local CPU's cache line; readers sum them.
 */
u64 __percpu *ibext_shim_counters_alloc(unsigned int n)
{
	return __alloc_percpu(sizeof(u64) * n, __alignof__(u64));
}

void ibext_shim_counters_free(u64 __percpu *c)
{
	free_percpu(c);
}

void ibext_shim_counter_inc(u64 __percpu *c, unsigned int i)
{
	this_cpu_inc(c[i]);
}

u64 ibext_shim_counter_sum(u64 __percpu *c, unsigned int i)
{
	u64 sum = 0;
	int cpu;

	for_each_possible_cpu(cpu)
		sum += per_cpu_ptr(c, cpu)[i];
	return sum;
}

void ibext_shim_cond_resched(void)
{
	cond_resched();
}

/* A basic SRQ of @max_wr receives, its limit armed at @limit (0: none). */
struct ib_srq *ibext_shim_create_srq(struct ib_pd *pd, u32 max_wr, u32 max_sge,
				     u32 limit,
				     void (*handler)(struct ib_event *, void *),
				     void *context)
{
	struct ib_srq_init_attr attr = {
		.event_handler = handler,
		.srq_context = context,
		.attr = {
			.max_wr = max_wr,
			.max_sge = max_sge,
			.srq_limit = limit,
		},
		.srq_type = IB_SRQT_BASIC,
	};

	return ib_create_srq(pd, &attr);
}

int ibext_shim_post_srq_recv(struct ib_srq *srq, struct ib_cqe *cqe, u64 addr,
			     u32 len, u32 lkey)
{
	struct ib_sge sge = { .addr = addr, .length = len, .lkey = lkey };
	struct ib_recv_wr wr = { .wr_cqe = cqe, .sg_list = &sge, .num_sge = 1 };

	return ib_post_srq_recv(srq, &wr, NULL);
}

int ibext_shim_arm_srq_limit(struct ib_srq *srq, u32 limit)
{
	struct ib_srq_attr attr = { .srq_limit = limit };

	return ib_modify_srq(srq, &attr, IB_SRQ_LIMIT);
}

/* Returns 0 on a mapping error. */
u64 ibext_shim_dma_map_from_device(struct ib_device *dev, void *buf, size_t len)
{
	u64 addr = ib_dma_map_single(dev, buf, len, DMA_FROM_DEVICE);

	return ib_dma_mapping_error(dev, addr) ? 0 : addr;
}

void ibext_shim_dma_unmap_from_device(struct ib_device *dev, u64 addr, size_t len)
{
	ib_dma_unmap_single(dev, addr, len, DMA_FROM_DEVICE);
}

void ibext_shim_dma_sync_for_cpu(struct ib_device *dev, u64 addr, size_t len)
{
	ib_dma_sync_single_for_cpu(dev, addr, len, DMA_FROM_DEVICE);
}

void ibext_shim_dma_sync_for_device(struct ib_device *dev, u64 addr, size_t len)
{
	ib_dma_sync_single_for_device(dev, addr, len, DMA_FROM_DEVICE);
}

EXPORT_SYMBOL_GPL(ibext_cq_pool_get);
EXPORT_SYMBOL_GPL(ibext_cq_pool_get_attr);
EXPORT_SYMBOL_GPL(ibext_cq_pool_put);
EXPORT_SYMBOL_GPL(ibext_dim_attach);
EXPORT_SYMBOL_GPL(ibext_dim_sample);
EXPORT_SYMBOL_GPL(ibext_dim_detach);
EXPORT_SYMBOL_GPL(ibext_dim_profile);
EXPORT_SYMBOL_GPL(ibext_dim_arm);
EXPORT_SYMBOL_GPL(ibext_dim_poll_done);
EXPORT_SYMBOL_GPL(ibext_find_gid);
EXPORT_SYMBOL_GPL(ibext_find_gid_by_port);
EXPORT_SYMBOL_GPL(ibext_srq_pool_create);
EXPORT_SYMBOL_GPL(ibext_srq_pool_get);
EXPORT_SYMBOL_GPL(ibext_srq_pool_put);
EXPORT_SYMBOL_GPL(ibext_srq_pool_destroy);
EXPORT_SYMBOL_GPL(ibext_srq_pool_nr_srqs);
EXPORT_SYMBOL_GPL(ibext_srq_pool_srq);
EXPORT_SYMBOL_GPL(ibext_srq_pool_set_srq_ctx);
EXPORT_SYMBOL_GPL(ibext_srq_pool_srq_ctx);
EXPORT_SYMBOL_GPL(ibext_srq_pool_repost);
EXPORT_SYMBOL_GPL(ibext_srq_pool_set_posted);
