// SPDX-License-Identifier: GPL-2.0
/*
 * ibext_test_ulp: the smallest C ULP of ibext, for the harness's
 * module-lifetime steps (kunit/guest-init.sh).
 *
 * It registers an ib_client after ibext.  On every RDMA device its add takes
 * entries on a pooled CQ with ibext_cq_pool_get() and its remove gives them
 * back with ibext_cq_pool_put().  Using ibext's exported symbols pins ibext:
 * while this module is loaded, rmmod ibext is refused.
 */
#include <linux/err.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/ibext.h>

#define ULP_NR_CQE 64

struct ulp_dev {
	struct ib_cq *cq;
};

static struct ib_client ulp_client;

static int ulp_add(struct ib_device *dev)
{
	struct ulp_dev *ud = kzalloc(sizeof(*ud), GFP_KERNEL);

	if (!ud)
		return -ENOMEM;
	ud->cq = ibext_cq_pool_get(dev, ULP_NR_CQE, -1, IB_POLL_SOFTIRQ);
	if (IS_ERR(ud->cq)) {
		int ret = PTR_ERR(ud->cq);

		kfree(ud);
		return ret;
	}
	ib_set_client_data(dev, &ulp_client, ud);
	pr_info("holds %d entries on a pooled CQ of %s\n", ULP_NR_CQE,
		dev_name(&dev->dev));
	return 0;
}

static void ulp_remove(struct ib_device *dev, void *client_data)
{
	struct ulp_dev *ud = client_data;

	ibext_cq_pool_put(ud->cq, ULP_NR_CQE);
	kfree(ud);
	pr_info("gave its entries on %s back\n", dev_name(&dev->dev));
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
