# SPDX-License-Identifier: GPL-2.0
#
# ibext: out-of-tree Rust RDMA module.
#
#   make run     boot QEMU with rxe0/rxe1, load ibext, show what it sees
#   make check   host tests, then the KUnit suites on rxe in QEMU, on the
#                test kernel and on the debug kernel (KASAN, lockdep, ...)
#
# Every target bootstraps what it needs (make setup); the kernels are built
# once and cached outside the checkout (IBEXT_CACHE, default ~/.cache/ibext).
# KDIR= points the build and the tests at another CONFIG_RUST kernel built
# with the same toolchain (then only that kernel is tested).

SHELL := /bin/bash

IBEXT_CACHE ?= $(HOME)/.cache/ibext
export IBEXT_CACHE
export PATH := $(IBEXT_CACHE)/tools/bin:$(PATH)

TOP := $(CURDIR)
BUILD := $(TOP)/build
SUITE ?=
SMP ?= 4
# The benchmarks use as many vCPUs as the machine has cores (2 here): under
# TCG, more vCPUs than host cores stall vCPUs for milliseconds at random and
# the numbers measure the host scheduler instead of ibext.
BENCH_SMP ?= 2
# The benchmarks' clock: "icount" (QEMU's instruction count: virtual time follows executed
# instructions, so host load and timer overshoot drop out) or "tcg" (the host's time); see
# "Benchmarks" in Documentation/ibext-testing.rst for what each measures and their spread.
BENCH_CLOCK ?= icount
# A guest is stopped as hung once its console has been silent for STALL
# seconds (every guest step and KUnit case prints when it ends), and in any
# case after TIMEOUT seconds; STRESS=1 doubles the latter, not the former.
STALL ?= 900
TIMEOUT ?= $(if $(STRESS),4800,2400)

# Kernel flavours: "test" (the fast one) and "debug" (kernel/debug.config).
# Their directories are deferred (=): the cache key names the toolchain, which
# `make setup` may only just have installed.
ifeq ($(origin KDIR), undefined)
FLAVOURS ?= test debug
kdir = $(shell $(TOP)/scripts/kernel-dir.sh $(1))
KDIR = $(call kdir,test)
else
FLAVOURS := custom
kdir = $(KDIR)
endif

KMAKE = $(MAKE) -C $(KDIR) LLVM=1
# STRESS=1: a CPU hog on every host core while the guests run (tests must pass so).
STRESS ?=
HARNESS = python3 $(TOP)/kunit/run.py --smp $(SMP) --timeout $(TIMEOUT) --stall $(STALL) \
	$(if $(STRESS),--stress)
flavour_arg = --flavour $(1):$(call kdir,$(1)):$(BUILD)/$(1)

.PHONY: all modules setup kernel kernels flavours check run bench blktests host-test \
	clippy fmt fmt-check layers bindgen-flags clean

all: modules

setup:
	@$(TOP)/scripts/setup.sh

# One kernel (FLAVOUR=test by default), or every flavour `make check` uses.
kernel: setup
ifneq ($(FLAVOURS),custom)
	@$(TOP)/scripts/build-kernel.sh $(or $(FLAVOUR),test)
endif

kernels: setup
ifneq ($(FLAVOURS),custom)
	@for f in $(FLAVOURS); do $(TOP)/scripts/build-kernel.sh $$f || exit 1; done
endif

# The product module, built in place against the test kernel (or KDIR).
modules: kernel
	+$(KMAKE) M=$(TOP) modules

# Both module flavours against every kernel flavour, in build/<flavour>/, the
# kernel flavours side by side (each build is mostly one job at a time); a
# failed build's output is printed.
flavours: kernels
	@mkdir -p $(BUILD); for f in $(FLAVOURS); do \
		if [ $$f = custom ]; then k=$(KDIR); else k=$$($(TOP)/scripts/kernel-dir.sh $$f); fi; \
		echo "ibext: building the modules for the $$f kernel"; \
		$(TOP)/scripts/build-flavour.sh "$$k" $(BUILD)/$$f > $(BUILD)/build-$$f.log 2>&1 & \
	done; rc=0; for f in $(FLAVOURS); do wait -n || rc=1; done; \
	for f in $(FLAVOURS); do cat $(BUILD)/build-$$f.log; done; exit $$rc

# Both flavours through clippy-driver; the build must stay warning-free.
clippy: kernel
	+$(KMAKE) M=$(TOP) CLIPPY=1 modules
	$(TOP)/scripts/build-flavour.sh $(KDIR) $(BUILD)/clippy CLIPPY=1

# rustfmt with the kernel's .rustfmt.toml; it follows the crate's mod lines.
RUSTFMT = rustfmt --edition 2021 --config-path $(KDIR)/source/.rustfmt.toml
RUST_ROOTS = rust/ibext_main.rs $(wildcard host/*.rs)

fmt: kernel
	$(RUSTFMT) $(RUST_ROOTS)

fmt-check: kernel
	@$(RUSTFMT) --check $(RUST_ROOTS) >/dev/null || \
		{ echo "ibext: rustfmt differs; run 'make fmt'"; exit 1; }

# The private bindgen pass filters C flags with a copy of the kernel's list.
bindgen-flags: kernel
	@$(TOP)/scripts/check-bindgen-flags.sh $(KDIR)

# The direction of the crate's imports (Documentation/ibext.rst, "Structure").
layers:
	@python3 $(TOP)/scripts/check-layers.py

host-test: setup
	@mkdir -p $(BUILD)
	cd host && cargo test 2>&1 | tee $(BUILD)/host-test.log; exit $${PIPESTATUS[0]}

check: fmt-check layers bindgen-flags host-test flavours
	$(HARNESS) --mode check --suite "$(SUITE)" --out $(BUILD) \
		--host-log $(BUILD)/host-test.log \
		$(foreach f,$(FLAVOURS),$(call flavour_arg,$(f)))

run: FLAVOURS := $(firstword $(FLAVOURS))
run: flavours
	$(HARNESS) --mode run --out $(BUILD) $(call flavour_arg,$(firstword $(FLAVOURS)))

# Benchmarks: side by side in one boot of the test kernel; prints a table and,
# last, "bench results: <file>" (one JSON object per case).
bench: FLAVOURS := $(firstword $(FLAVOURS))
bench: flavours
	python3 $(TOP)/kunit/run.py --mode bench --smp $(BENCH_SMP) --clock $(BENCH_CLOCK) \
		--timeout $(TIMEOUT) --stall $(STALL) \
		--suite "$(SUITE)" --out $(BUILD) $(call flavour_arg,$(firstword $(FLAVOURS)))

# The public blktests suite over rxe (BLKTESTS=<checkout>, else the pinned
# snapshot in ../shared/vendor/), against upstream's modules and the ports,
# test by test. Not part of make check.
BLKTESTS_GROUPS ?= nvme srp
blktests: FLAVOURS := test
blktests: flavours
	$(TOP)/scripts/blktests.sh $(call kdir,test) $(BUILD)/test $(BUILD) $(BLKTESTS_GROUPS)

clean:
	-[ -d "$(KDIR)" ] && $(KMAKE) M=$(TOP) clean
	rm -rf $(BUILD) host/target rust/bindings_generated.rs
