#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""make blktests: the public blktests suite over rxe, upstream's modules against the ports.

Boots the test kernel with virtme-ng twice, runs blktests' ./check with the given groups
(NVMET_TRTYPES=rdma, USE_RXE=1) once with upstream's nvme-rdma/nvmet-rdma and once with the
ports of ulp/ installed under those names (kunit/guest/blktests.sh), and prints one table, test
by test. A test that passes upstream and does not pass on the ports fails the run.
"""

import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (kunit/run.py)

# "nvme/010 (tr=rdma bd=file) (...) [passed]"; a whole group not run is "srp/*** [not run]".
RESULT = re.compile(r"^(\S+/(?:\d+|\*\*\*)) (?:\(([^)]*)\) )?.*\[(passed|failed|not run)\]\s*$")


def results(log_path):
    """{test (conditions): status} from a console log, and the kernel reports in it."""
    out = {}
    lines = [run.TS.sub("", l.rstrip("\r")) for l in
             open(log_path, "rb").read().decode("utf-8", "replace").split("\n")]
    for line in lines:
        m = RESULT.match(line)
        if m:
            out[m.group(1) + (f" ({m.group(2)})" if m.group(2) else "")] = m.group(3)
    reports = run.Result()
    run.scan_reports(lines, reports)
    return out, reports.problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flavour", required=True, help="NAME:KDIR:BUILDDIR of the kernel")
    ap.add_argument("--blktests", required=True, help="a built blktests checkout")
    ap.add_argument("--out", required=True)
    ap.add_argument("--smp", type=int, default=2)
    ap.add_argument("groups", nargs="+")
    args = ap.parse_args()
    _, kdir, bdir = args.flavour.split(":", 2)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    opts = argparse.Namespace(mode="blktests", verbose=False, timeout=0, clock="tcg",
                              stall=1800)
    table, notes = {}, []
    for which in ("upstream", "ports"):
        log_path = os.path.join(args.out, f"console-blktests-{which}-{stamp}.log")
        guest = [os.path.join(run.TOP, "kunit", "guest", "blktests.sh"), which, bdir,
                 kdir, args.blktests, *args.groups]
        # 4G: the nvme tests back namespaces with a 1 GiB file (NVME_IMG_SIZE) under the results
        # directory on the guest's /tmp, a tmpfs of half the memory; 2G gave ENOSPC in nvme/010.
        cmd = ["vng", "--run", kdir, "--disable-kvm", "--force-9p", "--verbose",
               "--cpus", str(args.smp), "--memory", "4G", f"--rwdir={args.blktests}",
               "--append", f"{run.ROOTFLAGS} printk.time=1 no_timer_check panic=-1",
               "--exec", " ".join(guest)]
        print(f"ibext blktests: {' '.join(args.groups)} on {which}; console log: {log_path}",
              flush=True)
        why, secs = run.boot(opts, cmd, log_path)
        res, reports = results(log_path)
        if why or "ibext-blktests: done" not in open(log_path, errors="replace").read():
            notes.append(f"{which}: the guest did not finish ({why or 'no done line'})")
        notes += [f"{which}: {p}" for p in reports]
        for test, status in res.items():
            table.setdefault(test, {})[which] = status
        print(f"ibext blktests: {which}: {len(res)} tests in {secs:.0f}s", flush=True)
    bad = 0
    width = max([len(t) for t in table] + [4])
    print(f"\n{'test':<{width}}  {'upstream':<8}  {'ports':<8}  verdict")
    for test in sorted(table):
        up, ports = table[test].get("upstream", "-"), table[test].get("ports", "-")
        verdict = "FAIL" if up == "passed" and ports != "passed" else "ok"
        bad += verdict == "FAIL"
        print(f"{test:<{width}}  {up:<8}  {ports:<8}  {verdict}")
    for n in notes:
        print(f"note: {n}")
    print(f"{len(table)} tests, {bad} passed upstream and not on the ports")
    sys.exit(1 if bad or not table else 0)


if __name__ == "__main__":
    main()
