#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Boot the ibext test guests with virtme-ng and judge what they printed.

Each kernel flavour boots under TCG with the host's userspace (vng), runs
kunit/guest/main.sh, and leaves its whole console in a log file. Then:

  * every KTAP document between the guest's "begin|end ktap" markers (the
    KUnit flavour of ibext, and each guest script) is parsed by the kernel's
    own kunit_parser, from the kernel source the flavour was built from;
  * any oops/BUG/WARN/lockdep/KASAN/kmemleak report fails the run, but for
    the known upstream ones below and the warnings a test expects;
  * so do a missing document or suite, a bad-input row never checked, a
    guest that never said "done", and a console silent for --stall seconds.

The last line is "N passed, N failed"; the exit status is 0 only if nothing
failed.
"""

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (kunit/bench.py)

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("IBEXT_CACHE", os.path.expanduser("~/.cache/ibext"))

# Kernel reports that fail a run wherever they appear on the console.
BAD = [
    (re.compile(r"-+\[ cut here \]-+"), "kernel warning/bug"),
    (re.compile(r"\bWARNING: (CPU|possible|suspicious)"), "kernel WARNING"),
    (re.compile(r"\bBUG: "), "kernel BUG"),
    (re.compile(r"\bOops\b"), "oops"),
    (re.compile(r"Kernel panic"), "kernel panic"),
    (re.compile(r"general protection fault"), "general protection fault"),
    (re.compile(r"KASAN|UBSAN"), "sanitizer report"),
    (re.compile(r"possible (recursive|circular) locking|inconsistent lock state|"
                r"suspicious RCU usage|INFO: trying to register non-static key|"
                r"lock held when returning to user space|possible irq lock inversion"),
     "lockdep report"),
    (re.compile(r"unreferenced object 0x"), "kmemleak report"),
    (re.compile(r"blocked for more than \d+ seconds"), "hung task"),
    (re.compile(r"rcu: .*detected stalls?"), "RCU stall"),
    (re.compile(r"list_(add|del) corruption"), "list corruption"),
    (re.compile(r"ibext: .* leaked at unload"), "ibext leak at unload"),
]
WARNINGS = ("kernel warning/bug", "kernel WARNING")
EXPECT = re.compile(r"ibext-test: expected kernel warning (begins|ends): (.*)$")

# Reports of an upstream 6.12 race that ibext's tests reach but ibext cannot cause or avoid:
# (name, the report's first line after its opening, frames the report must all contain). A
# match (from "cut here" to "end trace", or between a KASAN report's "====" lines) is printed
# as known and does not fail the run; nothing else in it may match BAD.
#
# ib_mad: rdma_cm's teardown on RDMA_CM_EVENT_DEVICE_REMOVAL (ibext_cm_ulp, rxe1 looped back)
# sends CM MADs that arrive on the dying device's QP1. ib_mad_recv_done() (core/mad.c) checks
# list_empty_careful(&port_priv->port_list) only at entry; ib_mad_port_close() then unlists the
# port and frees the MAD QPs (destroy_mad_qp) before ib_free_cq() stops the CQ's poller, so a
# handler already past the check reposts on a destroyed QP: rxe_post_recv() warns, and once the
# QP is freed KASAN reports the use after free. The stacks are ib_core's own MAD CQ.
KNOWN_UPSTREAM = [
    ("ib_mad reposts on a destroyed MAD QP during device removal (warning)",
     re.compile(r"WARNING: .* at drivers/infiniband/sw/rxe/rxe_verbs\.c:\d+ rxe_post_recv"),
     [re.compile(r"\bib_mad_post_receive_mads\b"), re.compile(r"\bib_mad_recv_done\b")]),
    ("ib_mad reposts on a MAD QP that ib_mad_port_close() freed (KASAN)",
     re.compile(r"BUG: KASAN: slab-use-after-free in "),
     [re.compile(r"\brxe_post_recv\b"), re.compile(r"\bib_mad_post_receive_mads\b"),
      re.compile(r"\bib_mad_port_close\b"), re.compile(r"^Freed by task")]),
]
REPORT_START = re.compile(r"-+\[ cut here \]-+|^={40,}$")
REPORT_END = {True: re.compile(r"---\[ end trace [0-9a-f]+ \]---"), False: re.compile(r"^={40,}$")}


def known_upstream_reports(lines):
    """Line ranges of reports in KNOWN_UPSTREAM, as {first line: (last line, name)}."""
    found = {}
    for i, line in enumerate(lines[:-1]):
        if not REPORT_START.search(line) or any(s <= i <= e for s, (e, _) in found.items()):
            continue
        warning = "cut here" in line
        end = next((j for j in range(i + 1, min(i + 400, len(lines)))
                    if REPORT_END[warning].search(lines[j])), None)
        if end is None:
            continue
        block = lines[i:end + 1]
        kinds = WARNINGS if warning else ("sanitizer report", "kernel BUG")
        clean = not any(p.search(l) for l in block[2:] for p, what in BAD if what not in kinds)
        for name, first, frames in KNOWN_UPSTREAM:
            if clean and first.search(lines[i + 1]) and \
                    all(any(f.search(l) for l in block) for f in frames):
                found[i] = (end, name)
                break
    return found


# The host's root, read-only over 9p, through the guest's page cache (virtme-ng mounts it
# uncached; the host does not change it while a guest runs): otherwise every exec of the guest's
# scripts reads its binary and libraries over 9p again.
ROOTFLAGS = "rootflags=version=9p2000.L,trans=virtio,access=any,msize=524288,cache=loose"
TS = re.compile(r"^\[\s*(\d+\.\d+)\]\s?")
MARK = re.compile(r"^ibext-guest: (begin|end) ktap (\S+)")
# A line a guest script printed. Searched, not matched: text the demo writes to the console
# can come first on the same line.
SCRIPT_LINE = re.compile(r"ibext-ktap: (.*)$")
SUITE_DECL = re.compile(r"^kunit_suite!\(\s*(\w+)\s*,\s*\[[^\]]*\]\s*(,\s*slow)?", re.M)


def declared_suites():
    """Every KUnit suite declared in the crate's tests, as {name: slow}."""
    suites = {}
    for root, _, files in os.walk(os.path.join(TOP, "rust", "tests")):
        for f in (f for f in files if f.endswith(".rs")):
            for m in SUITE_DECL.finditer(open(os.path.join(root, f)).read()):
                suites[m.group(1)] = bool(m.group(2))
    return suites


def documents(args):
    """The KTAP documents a guest must print, and the KUnit suites in them."""
    suite = args.suite.split(".")[0]
    if args.mode == "run":
        return ["demo"], []
    if args.mode == "bench":
        if suite in ("ibext_nvme_bench", "ibext_nvme_mem"):
            return ["nvme_bench"], []
        if suite == "ibext_srp_bench":
            return ["srp_bench"], []
        if suite == "ibext_rds_bench":
            return ["rds_bench"], []
        return ["kunit"] + (["nvme_bench", "srp_bench", "rds_bench"] if not suite else []), \
            [suite or "ibext_bench"]
    docs = {"": ["modules", "rdma_cm", "kunit", "nvme", "srp", "rds"],
            "ibext_guest": ["modules", "rdma_cm"], "ibext_nvme": ["nvme"],
            "ibext_srp": ["srp"], "ibext_rds": ["rds"]}.get(suite, ["kunit"])
    want = [s for s, slow in declared_suites().items() if not slow] if not suite else [suite]
    return docs + ["finish"], want if "kunit" in docs else []


def vng_command(args, docs, flavour, kdir, bdir):
    append = [ROOTFLAGS, "printk.devkmsg=on", "printk.time=1", "no_timer_check", "panic=-1"]
    smp = args.smp
    if flavour == "debug":
        # KASAN and lockdep make every vCPU several times slower under TCG; with more vCPUs than
        # host cores a vCPU can go unscheduled past RCU's 21 s stall timeout: one vCPU per host
        # core and a 60 s timeout, which still catches a real stall.
        smp = min(smp, os.cpu_count() or 2)
        append.append("rcupdate.rcu_cpu_stall_timeout=60")
        # QEMU's TCG CPU has LA57; with 5-level paging, inline generic KASAN can report a false
        # wild-memory-access on an interrupt during identify_cpu() at boot (seen once here, in
        # rcu_is_watching; upstream: "kasan: Fix false-positive wild-memory-access on x86 under
        # 5-level paging", lkml.iu.edu/2606.1/07330.html). 4-level paging avoids it.
        append.append("no5lvl")
    suite = args.suite
    if "kunit" in docs and (suite or args.mode == "bench"):
        append.append(f"kunit.filter_glob={suite or 'ibext_bench'}")
    if args.mode == "check" and not declared_suites().get(suite.split(".")[0]):
        append.append("kunit.filter=speed>slow")  # benchmarks carry KUnit's speed=slow
    qemu = []
    if args.clock == "icount":
        # Deterministic instruction-count time: one instruction is 1 ns of virtual time, an
        # idle guest jumps to its next timer, vCPUs take turns on one host thread. What the
        # guest measures is instructions executed (CPU cost), not the host's load.
        qemu += ["-icount", "shift=0,align=off,sleep=off"]
    if args.gdb:
        qemu += ["-s"]  # QEMU's gdbstub on :1234 (scripts/insn-profile.py)
        append.append("nokaslr")
    guest = [os.path.join(TOP, "kunit", "guest", "main.sh"), flavour, bdir, kdir, str(smp),
             ",".join(docs), suite]
    cmd = ["vng", "--run", kdir, "--disable-kvm", "--force-9p", "--verbose", "--cpus", str(smp),
           "--memory", "2G", "--append", " ".join(append), "--exec", " ".join(guest)]
    return cmd + ([f"--qemu-opts={' '.join(qemu)}"] if qemu else [])


def boot(args, cmd, log_path):
    """Runs the guest, its console into log_path; returns (why it was stopped or None, secs)."""
    start = last = time.monotonic()
    showing = args.verbose
    last_line, partial, why = "", b"", None
    with open(log_path, "wb") as log:
        # A session of its own: a guest given up on is killed with QEMU, which vng runs as its
        # child (killing vng alone left QEMU running after a timeout).
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=TOP, start_new_session=True)
        os.set_blocking(proc.stdout.fileno(), False)
        while why is None:
            chunk = proc.stdout.read() or b""
            if chunk:
                last = time.monotonic()
                log.write(chunk)
                log.flush()
                if args.mode == "run" and not showing and b"ibext-guest: setup done" in chunk:
                    showing, chunk = True, chunk[chunk.index(b"ibext-guest: setup done"):]
                if showing:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
                *lines, partial = (partial + chunk).split(b"\n")
                for raw in lines:
                    line = TS.sub("", raw.decode("utf-8", "replace").rstrip("\r"))
                    last_line = line.strip()[:160] or last_line
                    m = MARK.match(line)
                    if m and m.group(1) == "end" and args.mode == "bench":
                        print(f"ibext: {m.group(2)} done (wall {last - start:.0f}s)", flush=True)
            if proc.poll() is not None and not chunk:
                break
            now = time.monotonic()
            if args.timeout and args.clock != "icount" and now - start > args.timeout:
                why = f"timeout after {args.timeout}s"
            elif now - last > args.stall:
                why = f"the console was silent for {args.stall}s (a hang); last: {last_line!r}"
            time.sleep(0.05)
        if why:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return why, time.monotonic() - start


class Result:
    def __init__(self):
        self.passed = self.failed = self.skipped = self.known = 0
        self.problems = []

    def fail(self, what):
        self.failed += 1
        self.problems.append(what)


def scan_reports(lines, res):
    """One failure per kernel report; between a test's "expected kernel warning" markers
    (kunit.rs) a warning is required instead, and every other kind still fails."""
    last, expecting, skip_to = -10, None, -1
    known = known_upstream_reports(lines)
    for i, line in enumerate(lines):
        if i in known and expecting is None:
            skip_to, name = known[i]
            print(f"  known upstream report, not ibext's (KNOWN_UPSTREAM in run.py): {name}")
            res.known += 1
        if i <= skip_to:
            continue
        m = EXPECT.search(line)
        if m and m.group(1) == "begins":
            expecting, warned = m.group(2), 0
        elif m and expecting is not None:
            if not warned:
                res.fail(f"expected kernel warning did not appear: {expecting}")
            expecting = None
        for pat, what in ([] if m else BAD):
            if pat.search(line):
                if expecting is not None and what in WARNINGS:
                    warned += 1
                elif i - last > 2:
                    res.fail(f"console: {what}: {line.strip()}")
                last = i
                break
    if expecting is not None:
        res.fail(f"expected kernel warning never ended: {expecting}")


def parse_ktap(ksrc, name, lines, res, out):
    """Parses one KTAP document with kunit_parser; returns its top-level test."""
    sys.path.insert(0, os.path.join(ksrc, "tools", "testing", "kunit"))
    import kunit_parser
    import kunit_printer
    kunit_printer.stdout._output = out  # the parser's own report goes to the results file
    out.write(f"\n==== {name}\n")
    test = kunit_parser.parse_run_tests(lines)

    def failed(t, path):
        for sub in t.subtests:
            failed(sub, f"{path}.{sub.name}" if path else sub.name)
        if not t.subtests and t.status not in (kunit_parser.TestStatus.SUCCESS,
                                               kunit_parser.TestStatus.SKIPPED):
            res.problems.append(f"{name}: {path or 'document'}: {t.status.name}")
    c = test.counts
    res.passed += c.passed
    res.skipped += c.skipped
    res.failed += c.failed + c.crashed + c.errors
    failed(test, "")
    if c.errors:
        res.problems.append(f"{name}: {c.errors} KTAP error(s), see {out.name}")
    return test


def judge(args, want, ksrc, log_path, why, out):
    res = Result()
    raw = open(log_path, "rb").read().decode("utf-8", "replace")
    lines = [TS.sub("", l.rstrip("\r")) for l in raw.split("\n")]
    scan_reports(lines, res)
    docs, current = {}, None
    for line in lines:
        m = MARK.match(line)
        if m:
            current = m.group(2) if m.group(1) == "begin" else None
            docs.setdefault(m.group(2), []) if current else None
        elif current == "kunit":  # the KUnit module's KTAP, printed by the kernel
            docs[current].append(line)
        elif current and (script := SCRIPT_LINE.search(line)):
            docs[current].append(script.group(1))
    if current:
        res.fail(f"KTAP document {current} never ended (the guest stopped inside it)")
    want_docs, want_suites = want
    suites = []
    for name, block in docs.items():
        test = parse_ktap(ksrc, name, block, res, out)
        if name == "kunit":
            suites = [s.name for s in test.subtests]
    for name in want_docs:
        if name not in docs:
            res.fail(f"KTAP document {name} is missing")
    for s in want_suites:
        if s not in suites:
            res.fail(f"KUnit suite {s} did not run")
    if args.mode == "check" and not args.suite:
        # Every row of the bad-input table is checked by KUnit on every flavour, except rows
        # only the debug kernel's fault injection reaches.
        doc = open(os.path.join(TOP, "Documentation", "ibext-bad-input.rst")).read()
        reported = set(re.findall(r"# bad-input ([a-z_]+\.[a-z_]+): ok", raw))
        for row in re.findall(r"^   \* - ``([a-z_]+\.[a-z_]+)``$", doc, re.M):
            if row not in reported and not (row == "cq_get.not_attached" and "KASAN" not in raw):
                res.fail(f"bad-input row {row} was not checked")
    if why:
        res.fail(why)
    if not any(l.startswith("ibext-guest: done") for l in lines):
        res.fail("the guest did not finish (no 'ibext-guest: done')")
    return res


def phases(log_path):
    """Guest seconds of boot and setup, and of each KTAP document."""
    out, begin, prev = [], {}, 0.0
    for raw in open(log_path, "rb").read().decode("utf-8", "replace").split("\n"):
        ts = TS.match(raw)
        if not ts:
            continue
        now, line = float(ts.group(1)), TS.sub("", raw)
        if line.startswith("ibext-guest: setup done"):
            out.append(f"boot and setup {now:.0f}s")
        m = MARK.match(line)
        if m and m.group(1) == "begin":
            begin[m.group(2)] = now
        elif m:
            out.append(f"{m.group(2)} {now - begin.get(m.group(2), prev):.0f}s")
        prev = now
    return ", ".join(out)


def host_totals(path, res):
    """Adds cargo test's results (already run, and required to pass) to the totals."""
    found = re.findall(r"test result: \w+\. (\d+) passed; (\d+) failed", open(path).read())
    res.passed += sum(int(p) for p, _ in found)
    for _ in range(sum(int(f) for _, f in found)):
        res.fail(f"host test ({path})")
    if not found:
        res.fail(f"host tests: no results in {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["check", "run", "bench"], default="check")
    ap.add_argument("--flavour", action="append", required=True,
                    help="NAME:KDIR:BUILDDIR of a kernel flavour to boot (repeatable)")
    ap.add_argument("--smp", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=2400, help="seconds a guest may run")
    ap.add_argument("--stall", type=int, default=900,
                    help="seconds the console may stay silent before the guest counts as hung")
    ap.add_argument("--clock", choices=["tcg", "icount"], default="tcg",
                    help="the guest's time: the host's (tcg) or instructions executed (icount)")
    ap.add_argument("--suite", default="")
    ap.add_argument("--out", default=os.path.join(TOP, "build"))
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--gdb", action="store_true", help="QEMU's gdbstub on :1234, no KASLR")
    ap.add_argument("--host-log", help="cargo test output to add to the totals")
    ap.add_argument("--stress", action="store_true", help="a CPU hog on every host core")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    total, logs = Result(), []
    want = documents(args)  # the same for every flavour
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"])
            for _ in range(os.cpu_count() or 2)] if args.stress else []
    try:
        for spec in args.flavour:
            flavour, kdir, bdir = spec.split(":", 2)
            log_path = os.path.join(args.out, f"console-{args.mode}-{flavour}-{stamp}.log")
            ktap_path = os.path.join(args.out, f"ktap-{args.mode}-{flavour}-{stamp}.txt")
            logs.append(log_path)
            print(f"ibext: booting the {flavour} kernel with vng (TCG"
                  f"{', instruction-count clock' if args.clock == 'icount' else ''}); "
                  f"console log: {log_path}", flush=True)
            why, secs = boot(args, vng_command(args, want[0], flavour, kdir, bdir), log_path)
            ksrc = os.path.realpath(os.path.join(kdir, "source"))
            with open(ktap_path, "w") as out, contextlib.redirect_stdout(out):
                res = judge(args, want, ksrc, log_path, why, out)
            known = f", {res.known} known upstream report(s)" if res.known else ""
            print(f"ibext: {flavour} kernel: guest time per part: {phases(log_path)}\n"
                  f"ibext: {flavour} kernel: {res.passed} passed, {res.failed} failed{known} "
                  f"in {secs:.1f}s; KTAP results: {ktap_path}", flush=True)
            total.passed += res.passed
            total.failed += res.failed
            total.skipped += res.skipped
            total.problems += [f"[{flavour}] {p}" for p in res.problems]
    finally:
        for h in hogs:
            h.kill()
    if args.host_log:
        host_totals(args.host_log, total)
    for p in total.problems:
        print(f"FAIL: {p}")
    print("console logs: " + " ".join(logs))
    skipped = f", {total.skipped} skipped" if total.skipped else ""
    print(f"{total.passed} passed, {total.failed} failed{skipped}")
    if args.mode == "bench":
        rows = bench.rows_of_log(logs[-1])
        path = os.path.join(args.out, f"bench-{stamp}.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in rows)
        bench.report(rows)
        print(f"bench results: {path}")
    sys.exit(1 if total.failed else 0)


if __name__ == "__main__":
    main()
