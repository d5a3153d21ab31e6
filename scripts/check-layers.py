#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Checks the direction of the crate's imports (Documentation/ibext.rst, "Structure").

Reads every `use crate::...`/`use super::...` and every `crate::`/`super::` path in the code
(comments are skipped) of rust/, resolves each to the module it names, and fails when:

- a module under rust/ib/ uses anything of the crate but rust/ib/, the bindings and
  rust/backport/;
- a module under rust/backport/ uses anything but rust/backport/ and the bindings;
- a module under rust/policy/ uses anything but rust/policy/;
- two modules use each other (a module and the modules inside it count as one only when
  one is the other's parent: a folder's mod.rs may use its own files);
- a suite file under rust/tests/ uses another suite: suites share only rust/tests/fixtures/,
  the hooks and the KUnit glue, and fixtures use no suite.

Prints each violation and exits 1; prints the module count and exits 0 otherwise.
"""

import glob
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "rust")
# Names the crate root brings into scope for every module (`use tests::kunit;`).
ROOT_ALIASES = {"kunit": "tests::kunit"}
SHARED_TEST = ("tests::fixtures", "tests::hooks", "tests::kunit")


def module_of(path):
    rel = os.path.relpath(path, ROOT)[:-3]
    if rel == "ibext_main":
        return ""
    if rel.endswith("/mod"):
        rel = rel[:-4]
    return rel.replace("/", "::")


def modules():
    files = [f for f in glob.glob(os.path.join(ROOT, "**", "*.rs"), recursive=True)
             if not f.endswith("bindings_generated.rs")]
    return {module_of(f): f for f in files}


def expand(tree):
    """`a::{b, c::{d}}` -> [`a::b`, `a::c::d`]."""
    tree = re.sub(r"\s+", "", tree)
    i = tree.find("{")
    if i < 0:
        return [tree]
    pre, inner = tree[:i], tree[i + 1:-1]
    items, depth, cur = [], 0, ""
    for ch in inner:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        items.append(cur)
    return [p for it in items for p in expand(pre + it)]


def resolve(path, cur, mods):
    parts = path.split(" as ")[0].split("::")
    if parts[0] == "crate":
        parts = parts[1:]
    elif parts[0] == "super":
        base = cur.split("::") if cur else []
        while parts and parts[0] == "super":
            parts, base = parts[1:], base[:-1]
        parts = base + parts
    else:
        return None
    if parts and parts[0] in ROOT_ALIASES:
        parts = ROOT_ALIASES[parts[0]].split("::") + parts[1:]
    best = ""
    for n in range(1, len(parts) + 1):
        m = "::".join(parts[:n])
        if m in mods:
            best = m
    return best


def imports(mods):
    edges = {}
    for m, f in mods.items():
        src = re.sub(r"//.*", "", open(f).read())
        deps = set()
        for use in re.findall(r"\buse\s+((?:crate|super)::[^;]+);", src):
            for p in expand(use):
                deps.add(resolve(p, m, mods))
        for p in re.findall(r"\b((?:crate|super)(?:::(?:super|[A-Za-z_]\w*))+)", src):
            deps.add(resolve(p, m, mods))
        deps.discard(None)
        deps.discard("")
        deps.discard(m)
        edges[m] = deps
    return edges


def under(m, top):
    return m == top or m.startswith(top + "::")


def main():
    mods = modules()
    edges = imports(mods)
    bad = []
    allowed = {
        "ib": ("ib", "bindings", "backport"),
        "backport": ("backport", "bindings"),
        "policy": ("policy",),
    }
    for m, deps in sorted(edges.items()):
        for layer, ok in allowed.items():
            if under(m, layer):
                for d in sorted(deps):
                    if not any(under(d, o) for o in ok):
                        bad.append(f"{m} uses {d}: rust/{layer}/ may use only {', '.join(ok)}")
        if under(m, "tests") and m not in ("tests",) and not any(under(m, s) for s in SHARED_TEST):
            suite = "::".join(m.split("::")[:2])
            for d in sorted(deps):
                if under(d, "tests") and not under(d, suite) and \
                        not any(under(d, s) for s in SHARED_TEST):
                    bad.append(f"{m} uses {d}: a suite uses only the fixtures, hooks and kunit")
        if under(m, "tests::fixtures"):
            for d in sorted(deps):
                if under(d, "tests") and not any(under(d, s) for s in SHARED_TEST):
                    bad.append(f"{m} uses {d}: fixtures use no suite")
    for a in sorted(edges):
        for b in sorted(edges[a]):
            if a < b and a in edges.get(b, ()):
                bad.append(f"{a} and {b} use each other")
    for line in bad:
        print(f"ibext: layers: {line}")
    if bad:
        return 1
    print(f"ibext: layers: {len(mods)} modules, imports point down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
