#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# The Kbuild's private bindgen pass filters the kernel's C flags with its own
# copy of the kernel's bindgen_skip_c_flags (rust/Makefile): libclang must see
# the flags the kernel's own bindgen pass sees, or the two binding sets can
# disagree on a layout.  This compares the two lists as sets of words and
# fails, naming the difference, when the kernel's changed.
# Usage: check-bindgen-flags.sh <kdir> (a build directory with a 'source' link,
# or a source tree)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
kdir=$1
src=$kdir
[ -e "$kdir/source" ] && src=$(readlink -f "$kdir/source")

# The words of the make variable $2 (assigned with := in file $1, continued with
# backslashes), one per line, sorted.
words() {
	awk -v var="$2" '
		$0 ~ "^" var "[ \t]*:=" { on = 1; sub("^" var "[ \t]*:=", "") }
		on { cont = sub(/\\[ \t]*$/, ""); print; if (!cont) exit }
	' "$1" | tr -s ' \t' '\n' | sed '/^$/d' | sort -u
}

ours=$(words "$top/Kbuild" ibext_bindgen_skip_c_flags)
theirs=$(words "$src/rust/Makefile" bindgen_skip_c_flags)
if [ -z "$theirs" ]; then
	echo "ibext: no bindgen_skip_c_flags in $src/rust/Makefile" >&2
	exit 1
fi
if [ "$ours" != "$theirs" ]; then
	echo "ibext: Kbuild's ibext_bindgen_skip_c_flags differs from $src/rust/Makefile:" >&2
	diff <(echo "$theirs") <(echo "$ours") | sed -n 's/^</  kernel only:/p; s/^>/  Kbuild only:/p' >&2
	exit 1
fi
echo "ibext: bindgen skip flags match the kernel's ($(echo "$theirs" | wc -l) flags)"
