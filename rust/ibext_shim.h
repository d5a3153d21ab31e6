/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Declarations shared by the C shim and the Rust crate (through the private
 * bindgen pass).  Everything here exists because Rust on 6.12 cannot reach it
 * directly: static inline helpers, WARN(), and macro-built file_operations.
 */
#ifndef IBEXT_SHIM_H
#define IBEXT_SHIM_H

#include <linux/debugfs.h>
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
void ibext_shim_warn(const char *file, int line, const char *msg);

#endif /* IBEXT_SHIM_H */
