# SPDX-License-Identifier: GPL-2.0
#
# ibext: out-of-tree Rust RDMA module.
#
#   make run     boot QEMU with rxe0/rxe1, load ibext, show what it sees
#   make check   host tests, then the KUnit suites on rxe in QEMU
#
# Every target bootstraps what it needs (make setup); the test kernel is built
# once and cached outside the checkout (IBEXT_CACHE, default ~/.cache/ibext).
# KDIR= points the module build at another CONFIG_RUST kernel built with the
# same toolchain.

SHELL := /bin/bash

IBEXT_CACHE ?= $(HOME)/.cache/ibext
export IBEXT_CACHE
export PATH := $(IBEXT_CACHE)/tools/bin:$(PATH)

TOP := $(CURDIR)
BUILD := $(TOP)/build
FLAVOUR ?= test
SUITE ?=
SMP ?= 4
# The benchmarks use as many vCPUs as the machine has cores (2 here): under
# TCG, more vCPUs than host cores stall vCPUs for milliseconds at random and
# the numbers measure the host scheduler instead of ibext.
BENCH_SMP ?= 2
TIMEOUT ?= 900

# Deferred (=): the cache key names the toolchain, which `make setup` may have
# just installed, so it is computed when a recipe runs, not when make starts.
ifeq ($(origin KDIR), undefined)
KDIR = $(shell $(TOP)/scripts/kernel-dir.sh $(FLAVOUR))
KERNEL_DEP := kernel
else
KERNEL_DEP :=
endif

KMAKE = $(MAKE) -C $(KDIR) LLVM=1

.PHONY: all modules setup kernel kunit-module check run bench host-test clippy fmt fmt-check clean

all: modules

setup:
	@$(TOP)/scripts/setup.sh

kernel: setup
	@$(TOP)/scripts/build-kernel.sh $(FLAVOUR)

# The product module, built in place.
modules: setup $(KERNEL_DEP)
	+$(KMAKE) M=$(TOP) modules

# The KUnit flavour: the same sources with the suites compiled in, built in a
# copy so that the two flavours do not rebuild each other.
kunit-module: setup $(KERNEL_DEP)
	@mkdir -p $(BUILD)/kunit
	@rsync -a --delete --exclude='*.o' --exclude='.*.cmd' --exclude='.*.d' \
		--exclude='bindings_generated.rs' \
		$(TOP)/Kbuild $(TOP)/rust $(TOP)/include $(BUILD)/kunit/
	+$(KMAKE) M=$(BUILD)/kunit IBEXT_KUNIT=y IBEXT_SRC=$(TOP) \
		$(if $(CLIPPY),CLIPPY=$(CLIPPY)) modules

# Both flavours through clippy-driver; the build must stay warning-free.
clippy: setup $(KERNEL_DEP)
	+$(KMAKE) M=$(TOP) CLIPPY=1 modules
	+$(MAKE) kunit-module CLIPPY=1

# rustfmt with the kernel's .rustfmt.toml; it follows the crate's mod lines.
RUSTFMT = rustfmt --edition 2021 --config-path $(KDIR)/source/.rustfmt.toml
RUST_ROOTS = rust/ibext_main.rs $(wildcard host/*.rs)

fmt: setup $(KERNEL_DEP)
	$(RUSTFMT) $(RUST_ROOTS)

fmt-check: setup $(KERNEL_DEP)
	@$(RUSTFMT) --check $(RUST_ROOTS) >/dev/null || \
		{ echo "ibext: rustfmt differs; run 'make fmt'"; exit 1; }

host-test: setup
	@mkdir -p $(BUILD)
	cd host && cargo test 2>&1 | tee $(BUILD)/host-test.log; exit $${PIPESTATUS[0]}

check: fmt-check host-test modules kunit-module
	python3 $(TOP)/kunit/run.py --mode check --kdir $(KDIR) --smp $(SMP) \
		--timeout $(TIMEOUT) --suite "$(SUITE)" --out $(BUILD) \
		--host-log $(BUILD)/host-test.log

run: modules kunit-module
	python3 $(TOP)/kunit/run.py --mode run --kdir $(KDIR) --smp $(SMP) \
		--timeout $(TIMEOUT) --out $(BUILD)

# Benchmarks: side by side in one boot; prints a table and, last,
# "bench results: <file>" (one JSON object per case).
bench: modules kunit-module
	python3 $(TOP)/kunit/run.py --mode bench --kdir $(KDIR) --smp $(BENCH_SMP) \
		--timeout $(TIMEOUT) --suite "$(SUITE)" --out $(BUILD)

clean:
	-[ -d "$(KDIR)" ] && $(KMAKE) M=$(TOP) clean
	rm -rf $(BUILD) host/target rust/bindings_generated.rs
