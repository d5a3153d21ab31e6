// SPDX-License-Identifier: GPL-2.0
/*
 * Test-only helpers (KUnit flavour): loopback RC QPs on rxe.
 *
 * Written in C because the work is almost all static inline helpers and
 * macros of ib_verbs.h (ib_alloc_pd, ib_create_qp, rdma_ah_*, ib_post_*,
 * ib_dma_map_single).  Each QP is connected to itself: rxe loops a packet
 * back only when its destination MAC is the device's own, and ib_modify_qp
 * resolves the MAC only for user QPs, so the helper fills it in from the
 * GID's netdev.  The link-local RoCE v2 GID at index 0 is source and
 * destination.
 */
#include <linux/delay.h>
#include <linux/bottom_half.h>
#include <linux/etherdevice.h>
#include <linux/kernel_stat.h>
#include <linux/netdevice.h>
#include <linux/module.h>
#include <linux/sched.h>
#include <linux/umh.h>
#include <rdma/ib_cache.h>
#include <rdma/ib_verbs.h>

#include "../ibext_shim.h"

struct ib_pd *ibext_test_alloc_pd(struct ib_device *dev)
{
	return ib_alloc_pd(dev, IB_PD_UNSAFE_GLOBAL_RKEY);
}

void ibext_test_dealloc_pd(struct ib_pd *pd)
{
	ib_dealloc_pd(pd);
}

u32 ibext_test_pd_rkey(struct ib_pd *pd)
{
	return pd->unsafe_global_rkey;
}

u32 ibext_test_pd_lkey(struct ib_pd *pd)
{
	return pd->local_dma_lkey;
}

struct ib_qp *ibext_test_create_qp(struct ib_pd *pd, struct ib_cq *send_cq,
				   struct ib_cq *recv_cq, struct ib_srq *srq,
				   u32 depth, u32 recv_depth)
{
	struct ib_qp_init_attr attr = {
		.send_cq = send_cq,
		.recv_cq = recv_cq,
		.srq = srq,
		.cap = {
			.max_send_wr = depth,
			.max_recv_wr = srq ? 0 : recv_depth,
			.max_send_sge = 1,
			.max_recv_sge = srq ? 0 : 1,
		},
		.sq_sig_type = IB_SIGNAL_ALL_WR,
		.qp_type = IB_QPT_RC,
	};

	return ib_create_qp(pd, &attr);
}

int ibext_test_destroy_qp(struct ib_qp *qp)
{
	return ib_destroy_qp(qp);
}

u32 ibext_test_qp_num(struct ib_qp *qp)
{
	return qp->qp_num;
}

/* RESET -> INIT -> RTR -> RTS, with the QP as its own peer. */
int ibext_test_connect_self(struct ib_qp *qp)
{
	const struct ib_gid_attr *sgid;
	struct net_device *ndev;
	struct ib_qp_attr attr;
	union ib_gid dgid;
	int ret;

	sgid = rdma_get_gid_attr(qp->device, 1, 0);
	if (IS_ERR(sgid))
		return PTR_ERR(sgid);

	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IB_QPS_INIT;
	attr.port_num = 1;
	attr.qp_access_flags = IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_READ |
			       IB_ACCESS_LOCAL_WRITE;
	ret = ib_modify_qp(qp, &attr, IB_QP_STATE | IB_QP_PKEY_INDEX |
			   IB_QP_PORT | IB_QP_ACCESS_FLAGS);
	if (ret)
		goto out;

	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IB_QPS_RTR;
	attr.path_mtu = IB_MTU_1024;
	attr.dest_qp_num = qp->qp_num;
	attr.rq_psn = 0;
	attr.max_dest_rd_atomic = 1;
	attr.min_rnr_timer = 1;
	attr.ah_attr.type = RDMA_AH_ATTR_TYPE_ROCE;
	rdma_ah_set_port_num(&attr.ah_attr, 1);
	dgid = sgid->gid;
	rdma_ah_set_grh(&attr.ah_attr, &dgid, 0, 0, 64, 0);
	attr.ah_attr.grh.sgid_attr = sgid;
	rcu_read_lock();
	ndev = rdma_read_gid_attr_ndev_rcu(sgid);
	if (IS_ERR(ndev)) {
		rcu_read_unlock();
		ret = PTR_ERR(ndev);
		goto out;
	}
	ether_addr_copy(attr.ah_attr.roce.dmac, ndev->dev_addr);
	rcu_read_unlock();
	ret = ib_modify_qp(qp, &attr, IB_QP_STATE | IB_QP_AV | IB_QP_PATH_MTU |
			   IB_QP_DEST_QPN | IB_QP_RQ_PSN |
			   IB_QP_MAX_DEST_RD_ATOMIC | IB_QP_MIN_RNR_TIMER);
	if (ret)
		goto out;

	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IB_QPS_RTS;
	attr.sq_psn = 0;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.max_rd_atomic = 1;
	ret = ib_modify_qp(qp, &attr, IB_QP_STATE | IB_QP_SQ_PSN |
			   IB_QP_TIMEOUT | IB_QP_RETRY_CNT | IB_QP_RNR_RETRY |
			   IB_QP_MAX_QP_RD_ATOMIC);
out:
	rdma_put_gid_attr(sgid);
	return ret;
}

/* Completions waiting in @cq, up to @n, through the driver's peek_cq (rxe has one). */
int ibext_test_peek_cq(struct ib_cq *cq, int n)
{
	if (!cq->device->ops.peek_cq)
		return -EOPNOTSUPP;
	return cq->device->ops.peek_cq(cq, n);
}

/* ib_poll_cq(), as a ULP that polls its own CQ calls it. */
int ibext_test_poll_cq(struct ib_cq *cq, int num_entries, struct ib_wc *wc)
{
	return ib_poll_cq(cq, num_entries, wc);
}

/* The SRQ limit the device has armed now (0: none), or a negative errno. */
int ibext_test_srq_limit(struct ib_srq *srq)
{
	struct ib_srq_attr attr = {};
	int ret = ib_query_srq(srq, &attr);

	return ret ?: attr.srq_limit;
}

/* Moves the QP to the error state: outstanding work requests are flushed. */
int ibext_test_qp_to_error(struct ib_qp *qp)
{
	struct ib_qp_attr attr = { .qp_state = IB_QPS_ERR };

	return ib_modify_qp(qp, &attr, IB_QP_STATE);
}

u64 ibext_test_dma_map(struct ib_device *dev, void *buf, size_t len)
{
	u64 addr = ib_dma_map_single(dev, buf, len, DMA_BIDIRECTIONAL);

	return ib_dma_mapping_error(dev, addr) ? 0 : addr;
}

void ibext_test_dma_unmap(struct ib_device *dev, u64 addr, size_t len)
{
	ib_dma_unmap_single(dev, addr, len, DMA_BIDIRECTIONAL);
}

int ibext_test_post_recv(struct ib_qp *qp, struct ib_cqe *cqe, u64 addr,
			 u32 len, u32 lkey)
{
	struct ib_sge sge = { .addr = addr, .length = len, .lkey = lkey };
	struct ib_recv_wr wr = { .wr_cqe = cqe, .sg_list = &sge, .num_sge = 1 };

	return ib_post_recv(qp, &wr, NULL);
}

/*
 * A SEND, or with @remote_addr an RDMA WRITE WITH IMMEDIATE of the buffer to
 * @remote_addr/@rkey carrying @imm.
 */
int ibext_test_post_send(struct ib_qp *qp, struct ib_cqe *cqe, u64 addr,
			 u32 len, u32 lkey, u64 remote_addr, u32 rkey, u32 imm)
{
	struct ib_sge sge = { .addr = addr, .length = len, .lkey = lkey };
	struct ib_rdma_wr wr = {
		.wr = {
			.wr_cqe = cqe,
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = IB_WR_SEND,
			.send_flags = IB_SEND_SIGNALED,
		},
	};

	if (remote_addr) {
		wr.wr.opcode = IB_WR_RDMA_WRITE_WITH_IMM;
		wr.wr.ex.imm_data = cpu_to_be32(imm);
		wr.remote_addr = remote_addr;
		wr.rkey = rkey;
	}
	return ib_post_send(qp, &wr.wr, NULL);
}

/*
 * Fault injection: make the @n-th allocation of the current task that
 * failslab sees fail (what writing /proc/self/fail-nth does for a user task;
 * KUnit's kthreads have no such file).  Returns what is left of a previous
 * setting: non-zero means the fault was never reached.
 */
unsigned int ibext_test_set_fail_nth(unsigned int n)
{
#ifdef CONFIG_FAULT_INJECTION
	unsigned int left = READ_ONCE(current->fail_nth);

	WRITE_ONCE(current->fail_nth, n);
	return left;
#else
	return n;
#endif
}

/* The text of this module, for failslab's stacktrace filter. */
void ibext_test_text_range(unsigned long *start, unsigned long *end)
{
	struct module_memory *mem = &THIS_MODULE->mem[MOD_TEXT];

	*start = (unsigned long)mem->base;
	*end = *start + mem->size;
}

static int ibext_test_umh_init(struct subprocess_info *info, struct cred *new)
{
#ifdef CONFIG_FAULT_INJECTION
	WRITE_ONCE(current->fail_nth, *(unsigned int *)info->data);
#endif
	return 0;
}

/*
 * call_usermodehelper() whose process has fail-nth armed from the start, so
 * that the n-th allocation failslab counts in it fails: with the stacktrace
 * filter on this module's text, the n-th allocation ibext makes while the
 * command runs (ibext's client add during "rdma link add", say).
 */
/* usleep_range() is an inline function: Rust cannot call it. */
void ibext_test_usleep(unsigned long min_us, unsigned long max_us)
{
	usleep_range(min_us, max_us);
}

/*
 * The CQs upstream's pool (ib_cq_pool_get, drivers/infiniband/core/cq.c) holds
 * for poll context @ctx, and their entries: the list and lock that 6.12's
 * ib_cq_pool_get and ib_cq_pool_cleanup walk.
 */
void ibext_test_upstream_pool_resident(struct ib_device *dev,
				       enum ib_poll_context ctx, u32 *cqs,
				       u64 *cqe)
{
	struct ib_cq *cq;

	*cqs = 0;
	*cqe = 0;
	spin_lock_irq(&dev->cq_pools_lock);
	list_for_each_entry(cq, &dev->cq_pools[ctx], pool_entry) {
		(*cqs)++;
		*cqe += cq->cqe;
	}
	spin_unlock_irq(&dev->cq_pools_lock);
}

/*
 * The driver's hardware counter @name of @port (what
 * /sys/class/infiniband/<dev>/ports/<port>/hw_counters/<name> shows), read
 * through the driver's own ops as ib_core's sysfs does; -ENOENT if the
 * device has no such counter.
 */
s64 ibext_test_hw_counter(struct ib_device *dev, u32 port, const char *name)
{
	struct rdma_hw_stats *stats;
	s64 ret = -ENOENT;
	int i, n;

	if (!dev->ops.alloc_hw_port_stats || !dev->ops.get_hw_stats)
		return -EOPNOTSUPP;
	stats = dev->ops.alloc_hw_port_stats(dev, port);
	if (!stats)
		return -ENOMEM;
	n = dev->ops.get_hw_stats(dev, stats, port, 0);
	for (i = 0; n > 0 && i < stats->num_counters; i++) {
		if (!strcmp(stats->descs[i].name, name)) {
			ret = stats->value[i];
			break;
		}
	}
	rdma_free_hw_stats_struct(stats);
	return ret;
}

int ibext_test_run_with_fail_nth(char **argv, char **envp, unsigned int nth)
{
	struct subprocess_info *info;

	info = call_usermodehelper_setup(argv[0], argv, envp, GFP_KERNEL,
					 ibext_test_umh_init, NULL, &nth);
	if (!info)
		return -ENOMEM;
	return call_usermodehelper_exec(info, UMH_WAIT_PROC);
}

u32 ibext_test_wc_imm(const struct ib_wc *wc)
{
	return be32_to_cpu(wc->ex.imm_data);
}

/*
 * Calls @fn(@arg) with bottom halves disabled: softirqs it raises on this CPU
 * (irq_poll's, for a CQ's pass) run in the local_bh_enable() that follows,
 * before this returns.
 */
void ibext_test_in_bh(void (*fn)(void *), void *arg)
{
	local_bh_disable();
	fn(arg);
	local_bh_enable();
}

/*
 * Whether the caller may sleep while a test holds it at a park point: task
 * context with interrupts on (a kworker's pass, a put); not a softirq pass.
 */
bool ibext_test_may_sleep(void)
{
	return in_task() && !irqs_disabled();
}

/*
 * Pins the calling task to @cpu (negative: every CPU again); it runs on @cpu
 * when this returns 0.
 */
int ibext_test_pin_self(int cpu)
{
	if (cpu < 0)
		return set_cpus_allowed_ptr(current, cpu_possible_mask);
	return set_cpus_allowed_ptr(current, cpumask_of(cpu));
}

/* The calling task's CPU now. */
int ibext_test_this_cpu(void)
{
	return raw_smp_processor_id();
}

/* An online CPU other than @cpu, or @cpu if it is the only one. */
int ibext_test_other_cpu(int cpu)
{
	unsigned int other = cpumask_any_but(cpu_online_mask, cpu);

	return other < nr_cpu_ids ? other : cpu;
}

/*
 * Which run of IRQ_POLL_SOFTIRQ this CPU is in: the CPU in the top 16 bits, its
 * count of the softirq's runs (kstat_incr_softirqs_this_cpu(), once before each
 * irq_poll_softirq() call) below. Two calls in one run of irq_poll_softirq()
 * return the same value. Called from that softirq, so the CPU cannot change.
 */
u64 ibext_test_softirq_run(void)
{
	unsigned int cpu = smp_processor_id();

	return ((u64)cpu << 48) |
	       (kstat_softirqs_cpu(IRQ_POLL_SOFTIRQ, cpu) & ((1ULL << 48) - 1));
}
