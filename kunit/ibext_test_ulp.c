// SPDX-License-Identifier: GPL-2.0
/*
 * ibext_test_ulp: the smallest C ULP of ibext, for the harness's
 * module-lifetime steps (kunit/guest/modules.sh).
 *
 * It registers an ib_client after ibext.  On every RDMA device its add takes
 * entries on a pooled CQ with ibext_cq_pool_get(), makes an SRQ pool with
 * managed buffers on its own PD and takes a reference to one of its SRQs,
 * and finds the GID at index 0 of port 1 with ibext_find_gid(); its remove
 * gives everything back, in reverse order.  So the C header and every
 * exported symbol are used from C.  Using ibext's exported symbols pins
 * ibext: while this module is loaded, rmmod ibext is refused.
 */
#include <linux/err.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/ibext.h>

#define ULP_NR_CQE 64

struct ulp_dev {
	struct ib_cq *cq;
	struct ib_pd *pd;
	struct ibext_srq_pool *srqs;
	struct ib_srq *srq;
};

static struct ib_client ulp_client;

/* Nothing is ever sent to the ULP's QP-less SRQs. */
static enum ibext_recv_action ulp_recv_done(struct ib_srq *srq,
					    struct ib_wc *wc, void *buf,
					    void *ctx)
{
	return IBEXT_RECV_REPOST;
}

/* Nothing is sent, so nothing presses: counted only to show the C API. */
static atomic_t ulp_pressure_calls = ATOMIC_INIT(0);

static void ulp_pressure(struct ib_srq *srq, enum ibext_srq_pressure what,
			 unsigned int posted, void *ctx)
{
	atomic_inc(&ulp_pressure_calls);
}

/* ibext_find_gid() of the GID at index 0 of port 1 returns that very entry. */
static int ulp_check_gid(struct ib_device *dev)
{
	const struct ib_gid_attr *want, *got;
	int ret = 0;

	want = rdma_get_gid_attr(dev, 1, 0);
	if (IS_ERR(want))
		return PTR_ERR(want);
	got = ibext_find_gid(dev, &want->gid, want->gid_type, NULL);
	if (IS_ERR(got))
		ret = PTR_ERR(got);
	else if (got != want)
		ret = -EINVAL;
	if (!IS_ERR(got))
		rdma_put_gid_attr(got);
	rdma_put_gid_attr(want);
	return ret;
}

static int ulp_add(struct ib_device *dev)
{
	struct ibext_srq_pool_attr attr = {
		.srq_size = 32,
		.max_sge = 1,
		.buf_size = 256,
		.recv_done = ulp_recv_done,
		/* Room to grow to twice the size: one step of 32. */
		.max_srq_size = 64,
		.pressure = ulp_pressure,
	};
	struct ulp_dev *ud = kzalloc(sizeof(*ud), GFP_KERNEL);
	int ret;

	if (!ud)
		return -ENOMEM;
	ret = ulp_check_gid(dev);
	if (ret)
		goto free;
	ud->cq = ibext_cq_pool_get(dev, ULP_NR_CQE, -1, IB_POLL_SOFTIRQ);
	if (IS_ERR(ud->cq)) {
		ret = PTR_ERR(ud->cq);
		goto free;
	}
	ud->pd = ib_alloc_pd(dev, 0);
	if (IS_ERR(ud->pd)) {
		ret = PTR_ERR(ud->pd);
		goto put_cq;
	}
	ud->srqs = ibext_srq_pool_create(ud->pd, &attr);
	if (IS_ERR(ud->srqs)) {
		ret = PTR_ERR(ud->srqs);
		goto dealloc_pd;
	}
	ud->srq = ibext_srq_pool_get(ud->srqs, 0);
	if (IS_ERR(ud->srq)) {
		ret = PTR_ERR(ud->srq);
		goto destroy_srqs;
	}
	ib_set_client_data(dev, &ulp_client, ud);
	pr_info("holds %d entries on a pooled CQ and an SRQ of a pool on %s, found its GID 0\n",
		ULP_NR_CQE, dev_name(&dev->dev));
	return 0;

destroy_srqs:
	ibext_srq_pool_destroy(ud->srqs);
dealloc_pd:
	ib_dealloc_pd(ud->pd);
put_cq:
	ibext_cq_pool_put(ud->cq, ULP_NR_CQE);
free:
	kfree(ud);
	pr_err("add on %s failed: %d\n", dev_name(&dev->dev), ret);
	return ret;
}

static void ulp_remove(struct ib_device *dev, void *client_data)
{
	struct ulp_dev *ud = client_data;

	ibext_srq_pool_put(ud->srqs, ud->srq);
	WARN_ON(ibext_srq_pool_destroy(ud->srqs));
	ib_dealloc_pd(ud->pd);
	ibext_cq_pool_put(ud->cq, ULP_NR_CQE);
	kfree(ud);
	pr_info("gave everything on %s back\n", dev_name(&dev->dev));
}

static struct ib_client ulp_client = {
	.name = "ibext_test_ulp",
	.add = ulp_add,
	.remove = ulp_remove,
};

static int __init ulp_init(void)
{
	return ib_register_client(&ulp_client);
}

static void __exit ulp_exit(void)
{
	ib_unregister_client(&ulp_client);
}

module_init(ulp_init);
module_exit(ulp_exit);
MODULE_DESCRIPTION("Minimal C ULP of ibext, for tests");
MODULE_LICENSE("GPL");
