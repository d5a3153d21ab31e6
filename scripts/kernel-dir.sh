#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Print the cache directory of the test kernel for a flavour (default: "test").
# The key covers the Debian source version, the config fragments and the
# toolchain, so a fresh clone on the same machine reuses a finished build and
# any change to one of them builds a new kernel beside the old one.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
flavour=${1:-test}
CACHE=${IBEXT_CACHE:-$HOME/.cache/ibext}
export PATH="$CACHE/tools/bin:$PATH"

frags="$top/kernel/ibext.config"
[ "$flavour" = test ] || frags="$frags $top/kernel/$flavour.config"

key=$( {
	dpkg-query -W -f='${Version}\n' linux-source-6.12 2>/dev/null || echo none
	rustc --version 2>/dev/null || true
	clang --version 2>/dev/null | head -n1 || true
	bindgen --version 2>/dev/null || true
	echo "$flavour"
	cat $frags
} | sha256sum | cut -c1-12)
echo "$CACHE/kernel/6.12-$flavour-$key"
