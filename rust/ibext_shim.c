// SPDX-License-Identifier: GPL-2.0
/*
 * The C half of ibext.ko.
 *
 * C is used only where Rust on 6.12 cannot do the job:
 *  - static inline helpers of ib_core, wrapped so that bindgen sees symbols;
 *  - WARN(), which has no Rust binding on 6.12;
 *  - file_operations built by DEFINE_SHOW_ATTRIBUTE;
 *  - EXPORT_SYMBOL_GPL of the C API, whose bodies are #[no_mangle] Rust
 *    functions in the same module.
 */
#include <linux/bug.h>
#include <linux/cpumask.h>
#include <linux/module.h>
#include <linux/rcupdate.h>
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

int ibext_shim_poll_cq(struct ib_cq *cq, int num_entries, struct ib_wc *wc)
{
	return ib_poll_cq(cq, num_entries, wc);
}

int ibext_shim_req_notify_cq(struct ib_cq *cq, enum ib_cq_notify_flags flags)
{
	return ib_req_notify_cq(cq, flags);
}

/*
 * A pooled CQ is marked shared, as ib_core marks its own pooled CQs, so that
 * a ULP that calls ib_free_cq() or ib_destroy_cq() on one gets a warning
 * instead of freeing it under the pool.  ibext clears the mark before it
 * destroys the CQ itself.
 */
void ibext_shim_cq_set_pooled(struct ib_cq *cq, bool pooled)
{
	cq->shared = pooled;
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

void ibext_shim_init_work(struct work_struct *work, work_func_t func)
{
	INIT_WORK(work, func);
}

bool ibext_shim_queue_work(struct workqueue_struct *wq, struct work_struct *work)
{
	return queue_work(wq, work);
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

EXPORT_SYMBOL_GPL(ibext_cq_pool_get);
EXPORT_SYMBOL_GPL(ibext_cq_pool_get_attr);
EXPORT_SYMBOL_GPL(ibext_cq_pool_put);
EXPORT_SYMBOL_GPL(ibext_dim_attach);
EXPORT_SYMBOL_GPL(ibext_dim_sample);
EXPORT_SYMBOL_GPL(ibext_dim_detach);
EXPORT_SYMBOL_GPL(ibext_dim_profile);
