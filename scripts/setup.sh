#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Idempotent bootstrap of everything ibext needs on a Debian 12 machine:
# Debian packages, rust-src for the installed rustc, a pinned bindgen-cli,
# and a pinned virtme-ng (vng, from PyPI), which boots the test kernels.
# Stops with one clear line naming the missing piece if something cannot be had.
set -euo pipefail

CACHE=${IBEXT_CACHE:-$HOME/.cache/ibext}
BINDGEN_VERSION=0.73.2
VNG_VERSION=1.42

# nvme-cli, fio: the NVMe and SRP steps; xfsprogs, multipath-tools and
# sg3-utils: programs the blktests nvme and srp groups require (make blktests).
PKGS=(clang lld llvm libclang-dev qemu-system-x86 flex bison bc
      cpio kmod libelf-dev libssl-dev iproute2 rdma-core ibverbs-utils
      rdmacm-utils perftest linux-source-6.12 xz-utils rsync nvme-cli fio
      xfsprogs multipath-tools sg3-utils
      python3-venv)

die() { echo "ibext setup: missing: $*" >&2; exit 1; }

missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "ibext setup: installing ${missing[*]}"
	SUDO=
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
	$SUDO apt-get update -qq >/dev/null || die "apt-get update failed"
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
		"${missing[@]}" >/dev/null || die "Debian packages: ${missing[*]}"
fi

command -v rustc >/dev/null || die "rustc (install Rust with rustup)"
command -v rustup >/dev/null || die "rustup (needed for the rust-src component)"
if [ ! -d "$(rustc --print sysroot)/lib/rustlib/src/rust/library/core" ]; then
	echo "ibext setup: rustup component add rust-src"
	rustup component add rust-src >/dev/null 2>&1 || die "rust-src (rustup component add rust-src failed)"
fi

if ! "$CACHE/tools/bin/bindgen" --version 2>/dev/null | grep -q "$BINDGEN_VERSION"; then
	echo "ibext setup: cargo install bindgen-cli $BINDGEN_VERSION (about 2 min)"
	mkdir -p "$CACHE/tools"
	cargo install -q bindgen-cli --version "$BINDGEN_VERSION" --locked \
		--root "$CACHE/tools" >/dev/null 2>&1 || die "bindgen-cli $BINDGEN_VERSION (cargo install failed)"
fi

[ -f /usr/src/linux-source-6.12.tar.xz ] || die "/usr/src/linux-source-6.12.tar.xz (package linux-source-6.12)"

if ! "$CACHE/tools/bin/vng" --version 2>/dev/null | grep -q "$VNG_VERSION"; then
	echo "ibext setup: pip install virtme-ng==$VNG_VERSION"
	rm -rf "$CACHE/tools/vng"
	mkdir -p "$CACHE/tools/bin"
	python3 -m venv "$CACHE/tools/vng" >/dev/null 2>&1 || die "python3 -m venv (package python3-venv)"
	"$CACHE/tools/vng/bin/pip" install -q "virtme-ng==$VNG_VERSION" >/dev/null 2>&1 ||
		die "virtme-ng $VNG_VERSION (pip install failed)"
fi
# vng runs virtme-run and virtme-prep-kdir-mods by name: all of them on PATH.
for b in vng virtme-run virtme-prep-kdir-mods virtme-configkernel virtme-mkinitramfs; do
	ln -sf "../vng/bin/$b" "$CACHE/tools/bin/$b"
done
