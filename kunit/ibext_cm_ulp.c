// SPDX-License-Identifier: GPL-2.0
/*
 * ibext_cm_ulp: a ULP driven by rdma_cm alone, like iSER, NFS/RDMA or
 * SMB-Direct: no ib_client of its own.  It learns that its device is going
 * from RDMA_CM_EVENT_DEVICE_REMOVAL, which rdma_cm's client delivers; rdma_cm
 * registered before ibext (it is loaded first), so it is removed from a device
 * *after* ibext.  The harness (kunit/guest/rdma-cm.sh) deletes the device under
 * this ULP's traffic and checks that the deletion completes.
 *
 * At load it listens on @addr, connects to itself, and runs ping-pong
 * traffic: the client sends, the server replies from its receive handler,
 * the client sends again from its own; WINDOW messages are in flight at any
 * time.  Both QPs use CQs from ibext's pool (ibext_cq_pool_get(), poll
 * context @poll_ctx); with @srq the server receives through an ibext SRQ
 * pool with managed buffers.  init returns only once MIN_ROUNDS replies have
 * arrived, so traffic is running when insmod returns, however slow the
 * machine.
 *
 * On DEVICE_REMOVAL each connection tears itself down as a ULP does:
 * ib_drain_qp(), rdma_destroy_qp(), ibext_srq_pool_put() and
 * ibext_srq_pool_destroy(), ibext_cq_pool_put(), and returns non-zero so
 * that rdma_cm destroys the cm_id.  Read-only parameters report what
 * happened: rounds, removals.
 */
#include <linux/completion.h>
#include <linux/inet.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/ibext.h>
#include <rdma/rdma_cm.h>

#define WINDOW		8
#define MSG_SIZE	64
#define NR_CQE		(4 * WINDOW)
#define MIN_ROUNDS	64
#define TIMEOUT_MS	30000

static char *addr = "10.11.0.1";
module_param(addr, charp, 0444);
MODULE_PARM_DESC(addr, "IPv4 address to listen on and connect to");
static int port = 18515;
module_param(port, int, 0444);
static int poll_ctx = IB_POLL_SOFTIRQ;
module_param(poll_ctx, int, 0444);
MODULE_PARM_DESC(poll_ctx, "0 softirq, 1 workqueue, 2 unbound workqueue");
static bool srq;
module_param(srq, bool, 0444);
MODULE_PARM_DESC(srq, "the server receives through an ibext SRQ pool");

static atomic_long_t rounds;
static atomic_t removals;
static bool stopping;

static int get_atomic_long(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%ld\n", atomic_long_read(kp->arg));
}

static int get_atomic(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%d\n", atomic_read((atomic_t *)kp->arg));
}

static const struct kernel_param_ops rounds_ops = { .get = get_atomic_long };
static const struct kernel_param_ops removals_ops = { .get = get_atomic };
module_param_cb(rounds, &rounds_ops, &rounds, 0444);
MODULE_PARM_DESC(rounds, "replies the client received");
module_param_cb(removals, &removals_ops, &removals, 0444);
MODULE_PARM_DESC(removals, "connections torn down on DEVICE_REMOVAL");

struct conn {
	struct rdma_cm_id *id;
	bool server;
	struct ib_pd *pd;
	struct ib_cq *cq;
	struct ib_qp *qp;
	struct ibext_srq_pool *srqs;
	struct ib_srq *srq;
	void *buf;		/* [0, MSG_SIZE): sends; [MSG_SIZE, 2 * MSG_SIZE): receives */
	u64 dma;
	struct ib_cqe send_cqe;
	struct ib_cqe recv_cqe;
	atomic_t torn;		/* whoever sets it tears the connection down */
	struct completion gone;	/* the teardown that won has finished */
	struct completion established;
	int error;
};

static struct rdma_cm_id *listener;
static int listener_tag;	/* the listener's context */
static atomic_t listener_gone;	/* rdma_cm destroyed it on DEVICE_REMOVAL */
static struct conn client_conn, server_conn;
static DECLARE_WAIT_QUEUE_HEAD(rounds_wq);

static int post_send(struct conn *c)
{
	struct ib_sge sge = {
		.addr = c->dma, .length = MSG_SIZE, .lkey = c->pd->local_dma_lkey,
	};
	struct ib_send_wr wr = {
		.wr_cqe = &c->send_cqe, .sg_list = &sge, .num_sge = 1,
		.opcode = IB_WR_SEND, .send_flags = IB_SEND_SIGNALED,
	};

	return ib_post_send(c->qp, &wr, NULL);
}

static int post_recv(struct conn *c)
{
	struct ib_sge sge = {
		.addr = c->dma + MSG_SIZE, .length = MSG_SIZE,
		.lkey = c->pd->local_dma_lkey,
	};
	struct ib_recv_wr wr = { .wr_cqe = &c->recv_cqe, .sg_list = &sge, .num_sge = 1 };

	return ib_post_recv(c->qp, &wr, NULL);
}

static void send_done(struct ib_cq *cq, struct ib_wc *wc)
{
}

/* Client: a reply arrived; send the next message.  Server (no SRQ): reply. */
static void recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct conn *c = container_of(wc->wr_cqe, struct conn, recv_cqe);

	if (wc->status != IB_WC_SUCCESS || READ_ONCE(stopping))
		return;
	if (post_recv(c))
		return;
	if (!c->server) {
		atomic_long_inc(&rounds);
		wake_up(&rounds_wq);
	}
	post_send(c);
}

/* Server with an SRQ pool: a message arrived in a managed buffer; reply. */
static enum ibext_recv_action srq_recv_done(struct ib_srq *s, struct ib_wc *wc,
					    void *buf, void *ctx)
{
	struct conn *c = ctx;

	if (!READ_ONCE(stopping))
		post_send(c);
	return IBEXT_RECV_REPOST;
}

static int conn_setup(struct conn *c, struct rdma_cm_id *id)
{
	struct ib_device *dev = id->device;
	struct ibext_srq_pool_attr sattr = {
		.srq_size = 4 * WINDOW, .max_sge = 1, .buf_size = MSG_SIZE,
		.recv_done = srq_recv_done, .ctx = c,
	};
	struct ib_qp_init_attr qattr = {
		.qp_context = c,
		.cap = {
			.max_send_wr = 2 * WINDOW, .max_recv_wr = 2 * WINDOW,
			.max_send_sge = 1, .max_recv_sge = 1,
		},
		.sq_sig_type = IB_SIGNAL_ALL_WR,
		.qp_type = IB_QPT_RC,
	};
	int i, ret;

	c->id = id;
	c->send_cqe.done = send_done;
	c->recv_cqe.done = recv_done;
	c->pd = ib_alloc_pd(dev, 0);
	if (IS_ERR(c->pd))
		return PTR_ERR(c->pd);
	c->buf = kzalloc(2 * MSG_SIZE, GFP_KERNEL);
	if (!c->buf) {
		ret = -ENOMEM;
		goto pd;
	}
	c->dma = ib_dma_map_single(dev, c->buf, 2 * MSG_SIZE, DMA_BIDIRECTIONAL);
	if (ib_dma_mapping_error(dev, c->dma)) {
		ret = -ENOMEM;
		goto buf;
	}
	c->cq = ibext_cq_pool_get(dev, NR_CQE, -1, poll_ctx);
	if (IS_ERR(c->cq)) {
		ret = PTR_ERR(c->cq);
		goto unmap;
	}
	qattr.send_cq = c->cq;
	qattr.recv_cq = c->cq;
	if (c->server && srq) {
		c->srqs = ibext_srq_pool_create(c->pd, &sattr);
		if (IS_ERR(c->srqs)) {
			ret = PTR_ERR(c->srqs);
			goto cq;
		}
		c->srq = ibext_srq_pool_get(c->srqs, -1);
		if (IS_ERR(c->srq)) {
			ret = PTR_ERR(c->srq);
			goto srqs;
		}
		qattr.srq = c->srq;
		qattr.cap.max_recv_wr = 0;
	}
	ret = rdma_create_qp(id, c->pd, &qattr);
	if (ret)
		goto srq_put;
	c->qp = id->qp;
	for (i = 0; !c->srq && i < 2 * WINDOW; i++) {
		ret = post_recv(c);
		if (ret)
			goto qp;
	}
	return 0;

qp:
	rdma_destroy_qp(id);
	c->qp = NULL;
srq_put:
	if (c->srq)
		ibext_srq_pool_put(c->srqs, c->srq);
srqs:
	if (c->srqs)
		WARN_ON(ibext_srq_pool_destroy(c->srqs));
cq:
	ibext_cq_pool_put(c->cq, NR_CQE);
unmap:
	ib_dma_unmap_single(dev, c->dma, 2 * MSG_SIZE, DMA_BIDIRECTIONAL);
buf:
	kfree(c->buf);
pd:
	ib_dealloc_pd(c->pd);
	c->srq = NULL;
	c->srqs = NULL;
	c->pd = NULL;
	return ret;
}

/* What a ULP does when its device goes: drain, destroy, give back. */
static void conn_teardown(struct conn *c)
{
	struct ib_device *dev = c->id->device;

	WRITE_ONCE(stopping, true);
	if (c->qp) {
		ib_drain_qp(c->qp);
		rdma_destroy_qp(c->id);
		c->qp = NULL;
	}
	if (c->srq) {
		ibext_srq_pool_put(c->srqs, c->srq);
		c->srq = NULL;
	}
	if (c->srqs) {
		WARN_ON(ibext_srq_pool_destroy(c->srqs));
		c->srqs = NULL;
	}
	if (c->pd) {
		ibext_cq_pool_put(c->cq, NR_CQE);
		ib_dma_unmap_single(dev, c->dma, 2 * MSG_SIZE, DMA_BIDIRECTIONAL);
		kfree(c->buf);
		ib_dealloc_pd(c->pd);
		c->pd = NULL;
	}
}

static void conn_failed(struct conn *c, int err)
{
	c->error = err;
	complete(&c->established);
}

/* Returns non-zero to have rdma_cm destroy @id. */
static int cm_handler(struct rdma_cm_id *id, struct rdma_cm_event *ev)
{
	struct conn *c = id->context == &listener_tag ? NULL : id->context;
	struct rdma_conn_param param = {
		.responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
		.rnr_retry_count = 7,
	};
	int ret;

	switch (ev->event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		ret = rdma_resolve_route(id, TIMEOUT_MS);
		if (ret)
			conn_failed(c, ret);
		return 0;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		ret = conn_setup(c, id);
		if (!ret)
			ret = rdma_connect_locked(id, &param);
		if (ret)
			conn_failed(c, ret);
		return 0;
	case RDMA_CM_EVENT_CONNECT_REQUEST:
		/* The listener's context is NULL; the new id is the server's connection. */
		c = &server_conn;
		if (c->id)
			return -EBUSY;	/* one connection only: reject */
		id->context = c;
		ret = conn_setup(c, id);
		if (ret) {
			c->id = NULL;
			conn_failed(c, ret);
			return 1;	/* rdma_cm destroys @id */
		}
		ret = rdma_accept(id, &param);
		if (ret) {
			atomic_set(&c->torn, 1);
			conn_teardown(c);
			complete(&c->gone);
			conn_failed(c, ret);
			return 1;
		}
		return 0;
	case RDMA_CM_EVENT_ESTABLISHED:
		complete(&c->established);
		return 0;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		if (!c) {	/* the listener */
			atomic_set(&listener_gone, 1);
			return 1;
		}
		if (atomic_xchg(&c->torn, 1))
			return 0;	/* module exit is tearing it down */
		conn_teardown(c);
		atomic_inc(&removals);
		pr_info("ibext_cm_ulp: %s connection torn down on device removal\n",
			c->server ? "server" : "client");
		complete(&c->gone);
		return 1;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_REJECTED:
		if (c)
			conn_failed(c, -ECONNREFUSED);
		return 0;
	default:
		return 0;
	}
}

static void conn_init(struct conn *c, bool server)
{
	memset(c, 0, sizeof(*c));
	c->server = server;
	init_completion(&c->gone);
	init_completion(&c->established);
}

/* Module exit, or failed init: tear down whatever DEVICE_REMOVAL did not. */
static void conn_destroy(struct conn *c)
{
	if (!c->id)
		return;
	if (atomic_xchg(&c->torn, 1)) {
		/* DEVICE_REMOVAL tore it down and rdma_cm destroyed the id. */
		wait_for_completion(&c->gone);
		return;
	}
	conn_teardown(c);
	rdma_destroy_id(c->id);
}

static int __init cm_ulp_init(void)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct rdma_cm_id *id;
	int i, ret;

	if (!in4_pton(addr, -1, (u8 *)&sin.sin_addr.s_addr, -1, NULL))
		return -EINVAL;
	conn_init(&client_conn, false);
	conn_init(&server_conn, true);
	stopping = false;

	atomic_set(&listener_gone, 0);
	listener = rdma_create_id(&init_net, cm_handler, &listener_tag, RDMA_PS_TCP,
				  IB_QPT_RC);
	if (IS_ERR(listener))
		return PTR_ERR(listener);
	ret = rdma_bind_addr(listener, (struct sockaddr *)&sin);
	if (!ret)
		ret = rdma_listen(listener, 1);
	if (ret)
		goto listener;

	id = rdma_create_id(&init_net, cm_handler, &client_conn, RDMA_PS_TCP, IB_QPT_RC);
	if (IS_ERR(id)) {
		ret = PTR_ERR(id);
		goto listener;
	}
	client_conn.id = id;
	ret = rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, TIMEOUT_MS);
	if (ret)
		goto conns;
	if (!wait_for_completion_timeout(&client_conn.established,
					 msecs_to_jiffies(2 * TIMEOUT_MS)) ||
	    !wait_for_completion_timeout(&server_conn.established,
					 msecs_to_jiffies(2 * TIMEOUT_MS))) {
		ret = -ETIMEDOUT;
		goto conns;
	}
	ret = client_conn.error ?: server_conn.error;
	if (ret)
		goto conns;

	for (i = 0; i < WINDOW && !ret; i++)
		ret = post_send(&client_conn);
	if (ret)
		goto conns;
	if (!wait_event_timeout(rounds_wq, atomic_long_read(&rounds) >= MIN_ROUNDS,
				msecs_to_jiffies(TIMEOUT_MS))) {
		ret = -ETIMEDOUT;
		goto conns;
	}
	pr_info("ibext_cm_ulp: connected to itself on %s, %s CQs%s, %ld rounds\n",
		addr, poll_ctx == IB_POLL_SOFTIRQ ? "softirq" :
		poll_ctx == IB_POLL_WORKQUEUE ? "workqueue" : "unbound workqueue",
		srq ? ", server on an SRQ pool" : "", atomic_long_read(&rounds));
	return 0;

conns:
	pr_err("ibext_cm_ulp: setup failed: %d\n", ret);
	conn_destroy(&client_conn);
	conn_destroy(&server_conn);
listener:
	if (listener)
		rdma_destroy_id(listener);
	listener = NULL;
	return ret;
}

static void __exit cm_ulp_exit(void)
{
	WRITE_ONCE(stopping, true);
	conn_destroy(&client_conn);
	conn_destroy(&server_conn);
	/* A listener on a removed device was destroyed by rdma_cm (we returned 1). */
	if (listener && !atomic_read(&listener_gone))
		rdma_destroy_id(listener);
}

module_init(cm_ulp_init);
module_exit(cm_ulp_exit);
MODULE_DESCRIPTION("An rdma_cm-only ULP of ibext, for device-removal tests");
MODULE_LICENSE("GPL");
