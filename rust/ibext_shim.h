/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Declarations shared by the C shim and the Rust crate (through the private
 * bindgen pass).  Everything here exists because Rust on 6.12 cannot reach it
 * directly: static inline helpers, WARN(), and macro-built file_operations.
 */
#ifndef IBEXT_SHIM_H
#define IBEXT_SHIM_H

#include <linux/debugfs.h>
#include <linux/hrtimer.h>
#include <linux/seq_file.h>
#include <rdma/ib_verbs.h>

/**
 * struct ibext_show - a debugfs file rendered by a Rust callback
 * @show: called under seq_file's single_open() for every read
 * @data: handed back to @show unchanged
 *
 * The owner keeps this alive until the file has been removed; debugfs
 * removal waits for readers still inside @show.
 */
struct ibext_show {
	int (*show)(struct seq_file *m, void *data);
	void *data;
};

struct dentry *ibext_shim_debugfs_create_show(const char *name,
					      struct dentry *parent,
					      struct ibext_show *show);
void *ibext_shim_get_client_data(struct ib_device *dev,
				 struct ib_client *client);
unsigned int ibext_shim_num_online_cpus(void);

/* The aging period, ibext.age_ms (rust/ibext_shim.c). */
#define IBEXT_AGE_MS_DEFAULT 60000
unsigned int ibext_shim_age_ms(void);

void ibext_shim_warn(const char *file, int line, const char *msg);

/* ib_verbs.h static inlines */
void ibext_shim_cq_set_pooled(struct ib_cq *cq, bool pooled);
bool ibext_shim_cq_is_pooled(struct ib_cq *cq);
void ibext_shim_cq_set_used(struct ib_cq *cq, unsigned int used);
void *ibext_shim_cq_comp_handler(struct ib_cq *cq);
int ibext_shim_modify_cq(struct ib_cq *cq, u16 cq_count, u16 cq_period);
bool ibext_shim_cq_polled_by_core(struct ib_cq *cq);
int ibext_shim_req_notify_cq(struct ib_cq *cq, enum ib_cq_notify_flags flags);
void ibext_shim_cq_raise(struct ib_cq *cq);
void ibext_shim_cq_arm_or_raise(struct ib_cq *cq, enum ib_cq_notify_flags flags);
bool ibext_shim_device_try_get(struct ib_device *dev);
bool ibext_shim_srq_in_use(struct ib_srq *srq);

/* hrtimer_init is a function, hrtimer_start an inline. */
void ibext_shim_hrtimer_init(struct hrtimer *timer,
			     enum hrtimer_restart (*fn)(struct hrtimer *));
void ibext_shim_hrtimer_start_us(struct hrtimer *timer, unsigned int usec);

/* SRCU around the handlers ibext's completion engine calls. */
int ibext_shim_handlers_enter(void);
void ibext_shim_handlers_exit(int idx);
void ibext_shim_handlers_wait(void);

/* RCU read side around completion handlers (rcu_read_lock is inline). */
void ibext_shim_rcu_read_lock(void);
void ibext_shim_rcu_read_unlock(void);

/* Workqueues: INIT_WORK and alloc_workqueue are macros. */
void ibext_shim_init_work(struct work_struct *work, work_func_t func,
			  const char *name, struct lock_class_key *key);
bool ibext_shim_queue_work(struct workqueue_struct *wq, struct work_struct *work);
struct workqueue_struct *ibext_shim_alloc_comp_wq(bool unbound);
/* Delayed work (INIT_DELAYED_WORK, delayed_work_pending and msecs_to_jiffies are macros). */
void ibext_shim_init_delayed_work(struct delayed_work *dw, work_func_t func,
				  const char *name, struct lock_class_key *key);
bool ibext_shim_queue_delayed_work(struct delayed_work *dw, unsigned int ms);
bool ibext_shim_disable_delayed_work_sync(struct delayed_work *dw);
bool ibext_shim_delayed_work_pending(struct delayed_work *dw);
bool ibext_shim_flush_delayed_work(struct delayed_work *dw);
bool ibext_shim_mod_delayed_work(struct delayed_work *dw, unsigned int ms);
/* A monotonic clock in milliseconds, jiffies-coarse (for aging, not for measuring). */
u64 ibext_shim_now_ms(void);

/* GID index: static inlines and macros of ib_verbs.h, per-CPU counters. */
bool ibext_shim_port_valid(struct ib_device *dev, u32 port);
bool ibext_shim_port_is_roce(struct ib_device *dev, u32 port);
u32 ibext_shim_start_port(struct ib_device *dev);
u32 ibext_shim_end_port(struct ib_device *dev);
u32 ibext_shim_gid_tbl_len(struct ib_device *dev, u32 port);
void ibext_shim_init_event_handler(struct ib_event_handler *h,
				   struct ib_device *dev,
				   void (*fn)(struct ib_event_handler *,
					      struct ib_event *));
bool ibext_shim_queue_work_unbound(struct work_struct *work);
u64 __percpu *ibext_shim_counters_alloc(unsigned int n);
void ibext_shim_counters_free(u64 __percpu *c);
void ibext_shim_counter_inc(u64 __percpu *c, unsigned int i);
u64 ibext_shim_counter_sum(u64 __percpu *c, unsigned int i);
void ibext_shim_cond_resched(void);

/* SRQ pools: static inlines of ib_verbs.h. */
struct ib_srq *ibext_shim_create_srq(struct ib_pd *pd, u32 max_wr, u32 max_sge,
				     u32 limit,
				     void (*handler)(struct ib_event *, void *),
				     void *context);
int ibext_shim_post_srq_recv(struct ib_srq *srq, struct ib_cqe *cqe, u64 addr,
			     u32 len, u32 lkey);
int ibext_shim_arm_srq_limit(struct ib_srq *srq, u32 limit);
u64 ibext_shim_dma_map_from_device(struct ib_device *dev, void *buf, size_t len);
void ibext_shim_dma_unmap_from_device(struct ib_device *dev, u64 addr, size_t len);
void ibext_shim_dma_sync_for_cpu(struct ib_device *dev, u64 addr, size_t len);
void ibext_shim_dma_sync_for_device(struct ib_device *dev, u64 addr, size_t len);

#ifdef IBEXT_KUNIT
/* Sets ibext.age_ms as a write to the parameter does (rust/ibext_shim.c). */
int ibext_test_set_age_ms(const char *val);
/* Test-only helpers, rust/tests/qp.c. */
struct ib_pd *ibext_test_alloc_pd(struct ib_device *dev);
void ibext_test_dealloc_pd(struct ib_pd *pd);
u32 ibext_test_pd_rkey(struct ib_pd *pd);
u32 ibext_test_pd_lkey(struct ib_pd *pd);
struct ib_qp *ibext_test_create_qp(struct ib_pd *pd, struct ib_cq *send_cq,
				   struct ib_cq *recv_cq, struct ib_srq *srq,
				   u32 depth, u32 recv_depth);
int ibext_test_destroy_qp(struct ib_qp *qp);
u32 ibext_test_qp_num(struct ib_qp *qp);
int ibext_test_connect_self(struct ib_qp *qp);
int ibext_test_qp_to_error(struct ib_qp *qp);
int ibext_test_peek_cq(struct ib_cq *cq, int n);
int ibext_test_poll_cq(struct ib_cq *cq, int num_entries, struct ib_wc *wc);
int ibext_test_srq_limit(struct ib_srq *srq);
u64 ibext_test_dma_map(struct ib_device *dev, void *buf, size_t len);
void ibext_test_dma_unmap(struct ib_device *dev, u64 addr, size_t len);
int ibext_test_post_recv(struct ib_qp *qp, struct ib_cqe *cqe, u64 addr,
			 u32 len, u32 lkey);
int ibext_test_post_send(struct ib_qp *qp, struct ib_cqe *cqe, u64 addr,
			 u32 len, u32 lkey, u64 remote_addr, u32 rkey, u32 imm);
u32 ibext_test_wc_imm(const struct ib_wc *wc);
unsigned int ibext_test_set_fail_nth(unsigned int n);
void ibext_test_text_range(unsigned long *start, unsigned long *end);
int ibext_test_run_with_fail_nth(char **argv, char **envp, unsigned int nth);
void ibext_test_usleep(unsigned long min_us, unsigned long max_us);
void ibext_test_in_bh(void (*fn)(void *), void *arg);
bool ibext_test_may_sleep(void);
u64 ibext_test_softirq_run(void);
int ibext_test_pin_self(int cpu);
int ibext_test_this_cpu(void);
int ibext_test_other_cpu(int cpu);
s64 ibext_test_hw_counter(struct ib_device *dev, u32 port, const char *name);
void ibext_test_upstream_pool_resident(struct ib_device *dev,
				       enum ib_poll_context ctx, u32 *cqs,
				       u64 *cqe);
#endif

#endif /* IBEXT_SHIM_H */
