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
