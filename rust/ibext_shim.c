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
#include <linux/percpu.h>
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

bool ibext_shim_port_valid(struct ib_device *dev, u32 port)
{
	return rdma_is_port_valid(dev, port);
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

EXPORT_SYMBOL_GPL(ibext_cq_pool_get);
EXPORT_SYMBOL_GPL(ibext_cq_pool_get_attr);
EXPORT_SYMBOL_GPL(ibext_cq_pool_put);
EXPORT_SYMBOL_GPL(ibext_dim_attach);
EXPORT_SYMBOL_GPL(ibext_dim_sample);
EXPORT_SYMBOL_GPL(ibext_dim_detach);
EXPORT_SYMBOL_GPL(ibext_dim_profile);
EXPORT_SYMBOL_GPL(ibext_find_gid);
EXPORT_SYMBOL_GPL(ibext_find_gid_by_port);
