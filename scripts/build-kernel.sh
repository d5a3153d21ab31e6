#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Build the test kernel (bzImage, modules and the tree that out-of-tree
# modules build against) from Debian's linux-source-6.12, with ibext's own
# config fragment, into a cache directory outside the checkout.  About six
# minutes on two cores; a finished build is reused.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
flavour=${1:-test}
CACHE=${IBEXT_CACHE:-$HOME/.cache/ibext}
export PATH="$CACHE/tools/bin:$PATH"

out=$("$top/scripts/kernel-dir.sh" "$flavour")
if [ -f "$out/.ibext-complete" ]; then
	exit 0
fi

srcver=$(dpkg-query -W -f='${Version}' linux-source-6.12)
src="$CACHE/src/$srcver/linux-source-6.12"
if [ ! -f "$src/.ibext-unpacked" ]; then
	echo "ibext: unpacking linux-source-6.12 $srcver"
	rm -rf "$src.tmp"
	mkdir -p "$src.tmp"
	tar -xf /usr/src/linux-source-6.12.tar.xz -C "$src.tmp" --strip-components=1
	touch "$src.tmp/.ibext-unpacked"
	rm -rf "$src"
	mv "$src.tmp" "$src"
fi

frags="$top/kernel/ibext.config"
[ "$flavour" = test ] || frags="$frags $top/kernel/$flavour.config"

echo "ibext: building the $flavour kernel in $out (about 12 min on 2 cores)"
start=$(date +%s)
mkdir -p "$out"
kmake() { make -s -C "$src" O="$out" LLVM=1 "$@"; }
kmake allnoconfig >/dev/null
cp "$out/.config" "$out/.config.base"
(cd "$src" && scripts/kconfig/merge_config.sh -m -O "$out" "$out/.config.base" $frags >/dev/null)
kmake olddefconfig >/dev/null

# merge_config only warns; a lost option (Rust not available, say) is fatal.
for f in $frags; do
	grep -E '^CONFIG_[A-Z0-9_]+=[ym]$' "$f" | while read -r line; do
		grep -qx "$line" "$out/.config" || {
			echo "ibext: kernel config lost '$line' (for RUST, check 'make LLVM=1 rustavailable')" >&2
			exit 1
		}
	done
done

# The kernel's own warnings are not ours to fix: keep them in a log, show its
# tail only if the build fails.
if ! kmake -j"$(($(nproc) + 1))" bzImage modules > "$out/build.log" 2>&1; then
	tail -n 40 "$out/build.log" >&2
	echo "ibext: kernel build failed; full log: $out/build.log" >&2
	exit 1
fi
rm -rf "$out/modinst"
kmake INSTALL_MOD_PATH="$out/modinst" modules_install >/dev/null
touch "$out/.ibext-complete"
echo "ibext: kernel built in $(( $(date +%s) - start ))s"
