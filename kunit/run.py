#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Boot the ibext test guest in QEMU and judge what it printed.

Builds an initramfs (busybox; iproute2's ip and rdma, nvme-cli and fio with their
libraries; the test kernel's modules, ibext.ko and its KUnit flavour, the NVMe
ports of ulp/, kunit/guest-init.sh as /init), boots it under TCG, keeps the whole console in a log file, and then:

  * parses the KTAP of every KUnit module the guest inserted, between the
    guest's "begin kunit"/"end kunit" markers;
  * counts the guest's own steps ("ibext-guest: ok|not ok N - ...");
  * fails on a missing or short test plan, a suite that should have run and
    did not, any oops/BUG/WARN/lockdep/KASAN/kmemleak report, a guest that
    never said "done", and a timeout.

The last line is "N passed, N failed"; the exit status is 0 only if nothing
failed.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (kunit/bench.py)

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# `--clock icount`: virtual nanoseconds per guest instruction, as a power of two (0: a
# 1 GIPS virtual CPU).
ICOUNT_SHIFT = 0

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

EXPECT = re.compile(r"ibext-test: expected kernel warning (begins|ends): (.*)$")

# Reports of an upstream 6.12 race that ibext's tests reach but ibext cannot cause or avoid. Each
# entry is (name, what the report's first line after its opening says, frames the report must
# all contain); a matching report (from "cut here" to "end trace", or from a KASAN report's
# "====" line to its closing one) is printed as known and does not fail the run. Nothing else
# in it may match BAD beyond the kind of report it is, and every report outside still fails.
#
# ib_mad: rdma_cm's teardown on RDMA_CM_EVENT_DEVICE_REMOVAL (ibext_cm_ulp, over rxe1 looped
# back to itself) sends CM MADs (cm_destroy_id -> DREQ/DREP, from cma_process_remove) that
# arrive on the dying device's QP1. ib_mad_recv_done() (drivers/infiniband/core/mad.c) checks
# list_empty_careful(&port_priv->port_list) only at entry; ib_mad_port_close() then unlists the
# port and destroys and frees the MAD QPs (destroy_mad_qp) before ib_free_cq() stops the CQ's
# poller, so a handler already past the check reposts on a destroyed QP: rxe_post_recv()
# (sw/rxe/rxe_verbs.c) warns, and, once the QP is freed, KASAN reports the use after free. The
# stacks are ib_core's own MAD CQ (ib_cq_poll_work); no ibext code is on them.
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
    i = 0
    while i < len(lines):
        if not REPORT_START.search(lines[i]) or i + 1 >= len(lines):
            i += 1
            continue
        warning = "cut here" in lines[i]
        end = next((j for j in range(i + 1, min(i + 400, len(lines)))
                    if REPORT_END[warning].search(lines[j])), None)
        if end is None:
            i += 1
            continue
        block = lines[i:end + 1]
        kinds = ("kernel warning/bug", "kernel WARNING") if warning else \
            ("sanitizer report", "kernel BUG")
        clean = not any(pat.search(l) for l in block[2:] for pat, what in BAD if what not in kinds)
        for name, first, frames in KNOWN_UPSTREAM:
            if (first.search(lines[i + 1]) and clean
                    and all(any(f.search(l) for l in block) for f in frames)):
                found[i] = (end, name)
                break
        i = end + 1 if i in found else i + 1
    return found
TS = re.compile(r"^\[\s*\d+\.\d+\]\s?")
GUEST_TS = re.compile(r"^\[\s*(\d+\.\d+)\]")
GUEST = re.compile(r"^ibext-guest: (.*)$")

# SUITE= values that name guest steps rather than a KUnit suite (kunit/guest-init.sh): the
# module-lifetime steps, and the NVMe over RDMA steps of the ports in ulp/.
GUEST_SUITES = {"ibext_guest", "ibext_nvme"}
# Guest steps a full `make check` (or SUITE=ibext_nvme) must have run, by the start of their
# description, and how many of each.
REQUIRED_STEPS = {"NVMe over RDMA on ibext": 6}


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


SUITE_DECL = re.compile(r"^kunit_suite!\(\s*(\w+)\s*,\s*\[[^\]]*\]\s*(,\s*slow)?", re.M)


def declared_suites():
    """Every suite declared in the crate's tests, as (name, slow)."""
    suites = []
    for root, _, files in os.walk(os.path.join(TOP, "rust", "tests")):
        for f in files:
            if f.endswith(".rs"):
                text = open(os.path.join(root, f)).read()
                suites += [(m.group(1), bool(m.group(2))) for m in SUITE_DECL.finditer(text)]
    return sorted(suites)


def expected_suites():
    """The suites `make check` must see: every one not marked slow (benchmarks are)."""
    return [name for name, slow in declared_suites() if not slow]


def ldd_libs(binary):
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    libs = []
    for line in out.splitlines():
        m = re.search(r"(/\S+) \(0x", line)
        if m:
            libs.append(m.group(1))
    return libs


def build_initramfs(args, kdir, bdir):
    stage = os.path.join(bdir, "initramfs")
    if os.path.exists(stage):
        shutil.rmtree(stage)
    for d in ["bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "tmp", "lib",
              "lib64", "ibext/kunit", "ibext/ulp"]:
        os.makedirs(os.path.join(stage, d), exist_ok=True)
    shutil.copy2("/bin/busybox", os.path.join(stage, "bin/busybox"))
    os.symlink("busybox", os.path.join(stage, "bin/sh"))
    tools = {"rdma": ("bin/rdma", "iproute2"), "ip": ("usr/sbin/ip", "iproute2"),
             "nvme": ("usr/sbin/nvme", "nvme-cli"), "fio": ("usr/bin/fio", "fio")}
    for tool, (dest, package) in tools.items():
        path = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin")
        if not path:
            sys.exit(f"ibext run: missing: {tool} (package {package}; make setup installs it)")
        shutil.copy2(path, os.path.join(stage, dest))
        for lib in ldd_libs(path):
            dst = os.path.join(stage, lib.lstrip("/"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(os.path.realpath(lib), dst)
    shutil.copy2(os.path.join(TOP, "kunit", "guest-init.sh"), os.path.join(stage, "init"))
    os.chmod(os.path.join(stage, "init"), 0o755)

    modinst = os.path.join(kdir, "modinst")
    if not os.path.isdir(os.path.join(modinst, "lib", "modules")):
        modinst = os.path.join(bdir, "modinst")
        shutil.rmtree(modinst, ignore_errors=True)
        sh(["make", "-s", "-C", kdir, "LLVM=1", f"INSTALL_MOD_PATH={modinst}",
            "modules_install"], stdout=subprocess.DEVNULL)
    shutil.copytree(os.path.join(modinst, "lib", "modules"),
                    os.path.join(stage, "lib", "modules"), symlinks=True)

    shutil.copy2(os.path.join(bdir, "product", "ibext.ko"), os.path.join(stage, "ibext"))
    shutil.copy2(os.path.join(bdir, "kunit", "ibext.ko"), os.path.join(stage, "ibext", "kunit"))
    for ulp in ("ibext_test_ulp.ko", "ibext_cm_ulp.ko"):
        shutil.copy2(os.path.join(bdir, "test-ulps", ulp), os.path.join(stage, "ibext"))
    for port in ("nvme-rdma-ibext.ko", "nvmet-rdma-ibext.ko"):
        shutil.copy2(os.path.join(bdir, "ulp", port), os.path.join(stage, "ibext", "ulp"))

    cpio = os.path.join(bdir, "initramfs.cpio")
    files = subprocess.run(["find", "."], cwd=stage, capture_output=True, check=True).stdout
    with open(cpio, "wb") as f:
        sh(["cpio", "--quiet", "-o", "-H", "newc"], cwd=stage, input=files, stdout=f)
    return cpio


def boot(args, flavour, kdir, cpio, log_path):
    bzimage = os.path.join(kdir, "arch", "x86", "boot", "bzImage")
    smp = args.smp
    # no_timer_check: io_apic.c's timer_irq_works() counts jiffies over a short busy wait at
    # boot; a vCPU the loaded host does not run meanwhile fails it, and check_timer() panics
    # ("IO-APIC + timer doesn't work!", seen with 6 busy loops beside the guest on 2 cores).
    append = ["console=ttyS0", "panic=-1", "printk.time=1", "no_timer_check",
              f"ibext.mode={args.mode}", f"ibext.flavour={flavour}"]
    if flavour == "debug":
        # KASAN and lockdep make every vCPU several times slower under TCG. With more vCPUs
        # than host cores (2), a vCPU can go unscheduled past RCU's 21 s stall timeout and
        # report a stall that is the host's, not the guest's: use one vCPU per host core and
        # a 60 s timeout, which still catches a real stall.
        smp = min(smp, os.cpu_count() or 2)
        append.append("rcupdate.rcu_cpu_stall_timeout=60")
    append.append(f"ibext.smp={smp}")
    slow = {name for name, is_slow in declared_suites() if is_slow}
    if args.mode == "bench":
        # ibext_nvme_bench is the guest's NVMe over RDMA benchmark alone (no KUnit), and
        # ibext_nvme_mem its target-memory part alone.
        append.append(f"kunit.filter_glob={args.suite or 'ibext_bench'}")
        if args.suite:
            append.append(f"ibext.suite={args.suite}")
    elif args.suite:
        append.append(f"ibext.suite={args.suite}")
        if args.suite not in GUEST_SUITES:
            append.append(f"kunit.filter_glob={args.suite}")
    if args.mode == "check" and args.suite not in slow:
        # Benchmarks carry KUnit's speed=slow attribute; make check leaves them out.
        append.append("kunit.filter=speed>slow")
    accel = ["-accel", "tcg"]
    if args.clock == "icount":
        # Deterministic instruction-count time: one instruction is 2^ICOUNT_SHIFT ns of
        # virtual time, an idle guest jumps to its next timer (sleep=off), and the vCPUs take
        # turns on one host thread. Timers then fire when asked, and what the guest measures
        # is instructions executed, not the host's load: CPU cost, not cache or lock contention.
        accel = ["-accel", "tcg,thread=single", "-icount",
                 f"shift={ICOUNT_SHIFT},align=off,sleep=off"]
    cmd = ["qemu-system-x86_64", *accel, "-m", "2048", "-smp", str(smp),
           "-nodefaults", "-display", "none", "-serial", "stdio", "-no-reboot",
           "-kernel", bzimage, "-initrd", cpio, "-append", " ".join(a for a in append if a)]
    if args.gdb:
        # QEMU's gdbstub on :1234, and the kernel where System.map says (scripts/insn-profile.py).
        cmd += ["-s"]
        cmd[cmd.index("-append") + 1] += " nokaslr"
    start = time.monotonic()
    timed_out = None
    # `make run` shows the guest from /init on; the boot messages stay in the log.
    showing = [args.verbose]
    # Under the instruction-count clock the guest's results do not depend on the host's load,
    # but its wall time does: a busy host only makes it slower. So a benchmark is judged by
    # progress (the stall limit), not by a wall-clock budget, and says how far it got in guest
    # time against the last complete run's total.
    wall_limit = args.timeout
    progress = None
    if args.mode == "bench" and args.clock == "icount":
        wall_limit = None
        expected = bench_guest_total(args)
        total = f"about {expected:.0f}s" if expected else "a total not known yet (first run)"

        def progress(name, guest_s):
            print(f"ibext bench: {name} done at guest time {guest_s:.0f}s of {total} "
                  f"(wall {time.monotonic() - start:.0f}s)", flush=True)
        print(f"ibext bench: no wall-clock limit under icount; a guest silent for {args.stall}s "
              "counts as hung", flush=True)
    clock = SuiteClock(start, progress)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        os.set_blocking(proc.stdout.fileno(), False)
        while True:
            chunk = proc.stdout.read()
            if chunk:
                log.write(chunk)
                log.flush()
                clock.feed(chunk)
                if args.mode == "run" and not showing[0] and b"Run /init" in chunk:
                    showing[0] = True
                    chunk = chunk[chunk.index(b"Run /init"):]
                if showing[0]:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
            if proc.poll() is not None:
                rest = proc.stdout.read()
                if rest:
                    log.write(rest)
                    if showing[0]:
                        sys.stdout.buffer.write(rest)
                break
            now = time.monotonic()
            if wall_limit is not None and now - start > wall_limit:
                timed_out = f"timeout after {wall_limit}s"
            elif now - clock.last_output > args.stall:
                timed_out = (f"the guest printed nothing for {args.stall}s (a hang); "
                             f"its last line: {clock.last_line!r}")
            if timed_out:
                proc.kill()
                proc.wait()
                break
            time.sleep(0.05)
    if args.mode == "bench" and args.clock == "icount" and not timed_out:
        record_bench_guest_total(args, clock.guest_now)
    return timed_out, time.monotonic() - start, clock.summary()


class SuiteClock:
    """Wall time of the boot, of each guest step, of each KUnit suite and of its slowest cases,
    read off the console as it arrives (the guest's printk has no timestamps), so that slow
    parts are visible; and when the console last printed, for the hang detector."""

    SUBTEST = re.compile(rb"# Subtest: (ibext_\w+)")
    SUITE_END = re.compile(rb"^(?:not )?ok \d+ (ibext_\w+)")
    CASE_END = re.compile(rb"^    (?:not )?ok \d+ (\w+)")
    STEP_END = re.compile(rb"ibext-guest: (?:not )?ok \d+ - (.*)$")
    KUNIT = re.compile(rb"ibext-guest: (begin|end) kunit")
    INIT = b"Run /init"
    SETUP = b"ibext-guest: setup done"

    def __init__(self, start, progress=None):
        self.start = start
        # Called with (what ended, guest seconds) as cases and steps end (make bench).
        self.progress = progress
        self.partial = b""
        self.open = {}
        self.times = []
        self.steps = []
        self.cases = []
        # Marks are seconds since the guest booted (its printk clock), or since `start`.
        self.mark = 0.0
        self.case_mark = 0.0
        self.suite = None
        self.last_output = start
        self.last_line = ""
        self.longest_silence = (0.0, "")
        # The guest's clock at its last line (seconds since boot).
        self.guest_now = 0.0

    def feed(self, chunk):
        host_now = time.monotonic()
        silence = host_now - self.last_output
        if silence > self.longest_silence[0]:
            self.longest_silence = (silence, self.last_line)
        self.last_output = host_now
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        for raw in lines:
            text = raw.rstrip(b"\r").decode("utf-8", "replace")
            # The guest's own clock (printk.time=1) where the line has it: the console can
            # lag behind the kernel, so the host's arrival time is only the fallback.
            ts = GUEST_TS.match(text)
            now = float(ts.group(1)) if ts else host_now - self.start
            if ts:
                self.guest_now = now
            line = TS.sub("", text).encode()
            if line.strip():
                self.last_line = line.decode()[:160]
            if self.INIT in line and not self.steps:
                self.steps.append(("boot", now - self.mark))
                self.mark = now
                continue
            m = self.SUBTEST.search(line)
            if m:
                self.open[m.group(1)] = now
                self.suite = m.group(1).decode()
                self.case_mark = now
                continue
            m = self.SUITE_END.search(line)
            if m and m.group(1) in self.open:
                self.times.append((m.group(1).decode(), now - self.open.pop(m.group(1))))
                self.suite = None
                continue
            m = self.CASE_END.search(line)
            if m and self.suite:
                self.cases.append((f"{self.suite}.{m.group(1).decode()}", now - self.case_mark))
                self.case_mark = now
                if self.progress:
                    self.progress(self.cases[-1][0], now)
                continue
            if self.SETUP in line:
                self.steps.append(("guest setup (veth, 994 GIDs, rxe0, rxe1)", now - self.mark))
                self.mark = now
                continue
            m = self.STEP_END.search(line)
            if m:
                self.steps.append((m.group(1).decode()[:60], now - self.mark))
                self.mark = now
                if self.progress:
                    self.progress(self.steps[-1][0], now)
                continue
            m = self.KUNIT.search(line)
            if m:
                # The KUnit module is one step; its suites are timed on their own.
                self.mark = now

    def summary(self):
        if not self.steps and not self.times:
            return ""
        out = ["steps: " + ", ".join(f"{name} {secs:.0f}s" for name, secs in self.steps)]
        if self.times:
            out.append("suites: " + ", ".join(f"{name} {secs:.0f}s" for name, secs in self.times))
        slow = sorted(self.cases, key=lambda c: -c[1])[:5]
        if slow:
            out.append("slowest cases: " + ", ".join(f"{n} {s:.0f}s" for n, s in slow))
        secs, after = self.longest_silence
        out.append(f"longest silence {secs:.0f}s, after: {after!r}")
        return "\n    ".join(out)


class Result:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0
        self.known_upstream = 0
        self.problems = []

    def fail(self, what):
        self.failed += 1
        self.problems.append(what)


def parse_ktap(module, lines, res, suites_seen):
    """Judge the KTAP a module printed between the guest's markers."""
    top_plan = None
    top_results = 0
    suite = None          # [name, plan, results]
    for line in lines:
        m = re.match(r"^1\.\.(\d+)$", line)
        if m and top_plan is None:
            top_plan = int(m.group(1))
            continue
        m = re.match(r"^    # Subtest: (\S+)$", line)
        if m:
            suite = [m.group(1), None, 0]
            suites_seen.append(m.group(1))
            continue
        m = re.match(r"^    1\.\.(\d+)$", line)
        if m and suite is not None:
            suite[1] = int(m.group(1))
            continue
        m = re.match(r"^    (not ok|ok) (\d+) (\S+)(.*)$", line)
        if m and suite is not None:
            suite[2] += 1
            name = f"{suite[0]}.{m.group(3)}"
            if m.group(1) == "not ok":
                res.fail(f"KUnit {name}")
            elif "# SKIP" in m.group(4):
                res.skipped += 1
            else:
                res.passed += 1
            continue
        m = re.match(r"^(not ok|ok) (\d+) (\S+)", line)
        if m:
            top_results += 1
            if suite is not None:
                if suite[1] is None:
                    res.fail(f"KUnit suite {suite[0]}: no test plan")
                elif suite[2] != suite[1]:
                    res.fail(f"KUnit suite {suite[0]}: plan 1..{suite[1]}, "
                             f"{suite[2]} results")
                if m.group(1) == "not ok" and suite[2] == 0:
                    res.fail(f"KUnit suite {suite[0]} failed before its cases ran")
            suite = None
    if top_plan is None:
        res.fail(f"KUnit module {module}: no test plan")
    elif top_results != top_plan:
        res.fail(f"KUnit module {module}: plan 1..{top_plan}, {top_results} suites reported")
    if suite is not None:
        res.fail(f"KUnit suite {suite[0]}: never finished")


def bad_input_rows():
    """The row ids of Documentation/ibext-bad-input.rst."""
    path = os.path.join(TOP, "Documentation", "ibext-bad-input.rst")
    return re.findall(r"^   \* - ``([a-z_]+\.[a-z_]+)``$", open(path).read(), re.M)


def judge(args, log_path, timed_out):
    res = Result()
    raw = open(log_path, "rb").read().decode("utf-8", "replace")
    lines = [TS.sub("", l.rstrip("\r")) for l in raw.split("\n")]

    # One failure per report: a "cut here" line and the WARNING under it are one report.
    # Between a test's "expected kernel warning" markers (kunit.rs, expect_kernel_warning)
    # a kernel warning is required instead; every other kind of report still fails.
    last = -10
    expecting = None
    known = known_upstream_reports(lines)
    skip_to = -1
    for i, line in enumerate(lines):
        if i in known and expecting is None:
            skip_to, name = known[i]
            print(f"  known upstream warning, not ibext's (see KNOWN_UPSTREAM in run.py): {name}")
            res.known_upstream += 1
        if i <= skip_to:
            continue
        m = EXPECT.search(line)
        if m:
            if m.group(1) == "begins":
                expecting, warned = m.group(2), 0
            elif expecting is not None:
                if not warned:
                    res.fail(f"expected kernel warning did not appear: {expecting}")
                expecting = None
            continue
        for pat, what in BAD:
            if pat.search(line):
                if expecting is not None and what in ("kernel warning/bug", "kernel WARNING"):
                    warned += 1
                elif i - last > 2:
                    res.fail(f"console: {what}: {line.strip()}")
                last = i
                break
    if expecting is not None:
        res.fail(f"expected kernel warning never ended: {expecting}")

    done = None
    steps = []
    blocks = {}
    current = None
    suites_seen = []
    for line in lines:
        m = GUEST.match(line)
        if not m:
            if current is not None:
                blocks[current].append(line)
            continue
        msg = m.group(1)
        if msg.startswith("begin kunit "):
            current = msg.split()[2]
            blocks[current] = []
        elif msg.startswith("end kunit "):
            current = None
        elif msg.startswith("done"):
            done = msg
        else:
            s = re.match(r"^(not ok|ok) (\d+) - (.*)$", msg)
            if s:
                steps.append(s.group(3))
                if s.group(1) == "ok":
                    res.passed += 1
                else:
                    res.fail(f"guest step: {s.group(3)}")
            elif args.verbose or msg.startswith("#"):
                print(f"  guest {msg}")
    for module, block in blocks.items():
        parse_ktap(module, block, res, suites_seen)
    if current is not None:
        res.fail(f"KUnit module {current}: never finished (guest stopped inside insmod)")

    if args.mode in ("check", "bench"):
        want = expected_suites()
        # SUITE may name one case: suite.case.
        if args.mode == "bench":
            want = [(args.suite or "ibext_bench").split(".")[0]]
            if args.suite in ("ibext_nvme_bench", "ibext_nvme_mem"):
                want = []
        elif args.suite and args.suite not in GUEST_SUITES:
            want = [args.suite.split(".")[0]]
        if args.suite not in GUEST_SUITES:
            for s in want:
                if s not in suites_seen:
                    res.fail(f"KUnit suite {s} did not run")
    if args.mode == "check" and args.suite in ("", None, "ibext_nvme"):
        for prefix, n in REQUIRED_STEPS.items():
            ran = sum(1 for d in steps if d.startswith(prefix))
            if ran != n:
                res.fail(f"guest steps '{prefix}...': {ran} ran, {n} expected")
    if args.mode == "check" and not args.suite:
        # Every row of the bad-input table must be checked by KUnit on every flavour, except
        # rows that only the debug kernel's fault injection can reach (skipped elsewhere).
        reported = set(re.findall(r"# bad-input ([a-z_]+\.[a-z_]+): ok", raw))
        debug_only = {"cq_get.not_attached"}
        for row in bad_input_rows():
            if row not in reported and not (row in debug_only and "KASAN" not in raw):
                res.fail(f"bad-input row {row} was not checked")
    if timed_out:
        res.fail(timed_out)
    if done is None:
        res.fail("guest did not finish (no 'ibext-guest: done')")
    return res


def bench_total_path(args):
    """Where the guest time of the last complete benchmark run of this selection is kept."""
    name = re.sub(r"[^\w.-]", "_", args.suite or "all")
    cache = os.environ.get("IBEXT_CACHE", os.path.expanduser("~/.cache/ibext"))
    return os.path.join(cache, f"bench-guest-seconds-{args.clock}-{name}")


def bench_guest_total(args):
    """The guest seconds the last complete run of this benchmark selection took, or None."""
    try:
        return float(open(bench_total_path(args)).read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def record_bench_guest_total(args, guest_s):
    if guest_s <= 0:
        return
    path = bench_total_path(args)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(f"{guest_s:.0f}\n")
    except OSError:
        pass


def bench_report(args, log_path, stamp):
    """Collects the guest's benchmark lines into a results file and prints its tables and
    goals (kunit/bench.py)."""
    rows = bench.rows_of_log(log_path)
    out = os.path.join(args.out, f"bench-{stamp}.jsonl")
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    bench.report(rows)
    print(f"bench results: {out}")


def host_totals(path, res):
    """Adds cargo test's results (already run, and already required to pass) to the totals."""
    found = False
    for line in open(path, errors="replace"):
        m = re.search(r"test result: \w+\. (\d+) passed; (\d+) failed", line)
        if m:
            found = True
            res.passed += int(m.group(1))
            for _ in range(int(m.group(2))):
                res.fail(f"host test ({path})")
    if not found:
        res.fail(f"host tests: no results in {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["check", "run", "bench"], default="check")
    ap.add_argument("--flavour", action="append", required=True,
                    help="NAME:KDIR:BUILDDIR of a kernel flavour to boot (repeatable)")
    ap.add_argument("--smp", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=1800,
                    help="seconds a guest may run in all")
    ap.add_argument("--stall", type=int, default=900,
                    help="seconds the console may stay silent before the guest counts as hung")
    ap.add_argument("--clock", choices=["tcg", "icount"], default="tcg",
                    help="the guest's time: the host's (tcg) or instructions executed (icount)")
    ap.add_argument("--suite", default="")
    ap.add_argument("--out", default=os.path.join(TOP, "build"))
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--gdb", action="store_true",
                    help="QEMU's gdbstub on :1234 and no KASLR, for scripts/insn-profile.py")
    ap.add_argument("--host-log", help="cargo test output to add to the totals")
    ap.add_argument("--stress", action="store_true",
                    help="run a CPU hog on every host core while the guests run (STRESS=1)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")

    total = Result()
    logs = []
    # Every initramfs first: a guest boots what the tree held when the run began, even if the
    # tree (kunit/guest-init.sh, the modules) changes while an earlier guest runs.
    guests = []
    for spec in args.flavour:
        flavour, kdir, bdir = spec.split(":", 2)
        guests.append((flavour, kdir, build_initramfs(args, kdir, bdir)))
    hogs = start_hogs() if args.stress else []
    try:
        run_guests(args, guests, stamp, total, logs)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    if args.host_log:
        host_totals(args.host_log, total)
    for p in total.problems:
        print(f"FAIL: {p}")
    print("console logs: " + " ".join(logs))
    skipped = f", {total.skipped} skipped" if total.skipped else ""
    print(f"{total.passed} passed, {total.failed} failed{skipped}")
    if args.mode == "bench":
        bench_report(args, logs[-1], stamp)
    sys.exit(1 if total.failed else 0)


def start_hogs():
    """One busy process per host core, for the whole run: the guests then get a share of the
    host, not all of it, as on a busy CI machine. Tests must pass like this: no test may depend on the guest's speed."""
    n = os.cpu_count() or 2
    print(f"ibext: STRESS: {n} CPU hogs on the host for the whole run", flush=True)
    return [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]


def run_guests(args, guests, stamp, total, logs):
    for flavour, kdir, cpio in guests:
        log_path = os.path.join(args.out, f"console-{args.mode}-{flavour}-{stamp}.log")
        logs.append(log_path)
        clock = ", instruction-count clock" if args.clock == "icount" else ""
        print(f"ibext: booting the {flavour} kernel (TCG{clock}); "
              f"console log: {log_path}", flush=True)
        timed_out, secs, times = boot(args, flavour, kdir, cpio, log_path)
        res = judge(args, log_path, timed_out)
        if times:
            print(f"ibext: {flavour} kernel: wall time per part:\n    {times}", flush=True)
        known = f", {res.known_upstream} known upstream report(s)" if res.known_upstream else ""
        print(f"ibext: {flavour} kernel: {res.passed} passed, {res.failed} failed{known} "
              f"in {secs:.1f}s; console log: {log_path}", flush=True)
        total.passed += res.passed
        total.failed += res.failed
        total.skipped += res.skipped
        total.problems += [f"[{flavour}] {p}" for p in res.problems]


if __name__ == "__main__":
    main()
