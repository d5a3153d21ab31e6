# SPDX-License-Identifier: GPL-2.0
"""Instruction profile of one call of a function of ibext's KUnit module, by single-stepping
the guest under gdb: every instruction executed from the function's entry to its return,
counted per function (the module's, vmlinux's, other modules' as one "other module" bucket).

Under TCG there is no PMU; this is how issue 17's per-instruction accounting of the GID lookup
and of a CQ drain was made. The guest must run with `kunit/run.py --gdb` (gdbstub on :1234,
no KASLR):

    python3 kunit/run.py --gdb --mode bench --smp 2 --clock icount \\
        --suite ibext_bench.cq_drain_bench --out /tmp/p --flavour test:$KDIR:$PWD/build/test &
    FUNC=ibext_test_in_bh ANCHOR=__local_bh_enable_ip SKIP=10 COUNT=2 \\
        gdb -q -batch -x scripts/insn-profile.py $KDIR/vmlinux

FUNC     the module function to profile (a symbol of the KUnit module's .text)
ANCHOR   a vmlinux function FUNC calls directly: its first hit from FUNC gives the module's
         load address (the return address minus the call site's offset in the .ko)
SKIP     calls of FUNC to let run first, at least 1: the anchor's first hit is inside call 1
         (default 1)
COUNT    calls to profile, one after the other (default 1)
KO       the module (default build/test/kunit/ibext.ko)

The guest is killed at the end. Single-stepping masks interrupts (QEMU's default), so a profile
holds the call's own instructions.
"""

import bisect
import os
import re
import subprocess

import gdb

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KO = os.environ.get("KO", os.path.join(TOP, "build/test/kunit/ibext.ko"))
FUNC = os.environ["FUNC"]
ANCHOR = os.environ["ANCHOR"]
SKIP = int(os.environ.get("SKIP", "1"))
COUNT = int(os.environ.get("COUNT", "1"))
MODULES = 0xffffffffa0000000


def text_symbols(path):
    """[(address, name)] of the functions of an ELF file, by nm (section-relative in a .ko)."""
    out = subprocess.run(["nm", "-n", path], capture_output=True, text=True, check=True).stdout
    syms = []
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in "tTwW":
            syms.append((int(f[0], 16), f[2]))
    return syms


def return_site(ko, func, anchor):
    """The offset in the .ko's .text of the instruction after `func`'s call of `anchor`."""
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-r", ko],
                         capture_output=True, text=True, check=True).stdout
    body = re.search(r"^[0-9a-f]+ <%s>:\n(.*?)\n\n" % re.escape(func), dis, re.S | re.M)
    if not body:
        raise gdb.GdbError(f"{func} not in {ko}")
    lines = body.group(1).splitlines()
    for i, line in enumerate(lines):
        if f"R_X86_64_PLT32\t{anchor}-0x4" in line:
            nxt = [ln for ln in lines[i + 1:] if re.match(r"\s+[0-9a-f]+:", ln)]
            return int(nxt[0].split(":")[0], 16)
    raise gdb.GdbError(f"{func} does not call {anchor}")


def reg(name):
    return int(gdb.parse_and_eval(name))


def main():
    mod = text_symbols(KO)
    entry = dict((n, a) for a, n in mod)[FUNC]
    ret_off = return_site(KO, FUNC, ANCHOR)
    gdb.execute("set pagination off")
    gdb.execute("target remote :1234")
    gdb.execute(f"break *{ANCHOR}")
    base = None
    while base is None:
        gdb.execute("continue", to_string=True)
        ret = int(gdb.parse_and_eval("*(unsigned long *)$rsp"))
        if ret >= MODULES and (ret - ret_off) & 0xfff == 0:
            base = ret - ret_off
    gdb.execute("delete")
    vml = text_symbols(gdb.current_progspace().filename)
    syms = sorted(vml + [(a + base, n) for a, n in mod])
    addrs = [a for a, _ in syms]
    mod_end = base + max(a for a, _ in mod) + 0x1000

    def name(pc):
        if pc >= MODULES and not base <= pc < mod_end:
            return "(other module)"
        i = bisect.bisect_right(addrs, pc) - 1
        return syms[i][1] if i >= 0 else "?"

    if SKIP < 1:
        raise gdb.GdbError("SKIP must be at least 1")
    gdb.execute("break *0x%x" % (base + entry))
    # The anchor was hit from inside call 1: the next entry is call 2's.
    seen = 1
    for call in range(SKIP + 1, SKIP + 1 + COUNT):
        while seen < call:
            gdb.execute("continue", to_string=True)
            seen += 1
        gdb.execute("disable")
        sp0 = reg("$rsp")
        counts = {}
        n = 0
        while True:
            nm = name(reg("$pc"))
            counts[nm] = counts.get(nm, 0) + 1
            n += 1
            gdb.execute("stepi", to_string=True)
            # Returned: the return address popped.
            if reg("$rsp") > sp0:
                break
        gdb.execute("enable")
        print(f"call {call} of {FUNC}: {n} instructions")
        for nm, c in sorted(counts.items(), key=lambda kv: -kv[1]):
            print(f"{c:7d}  {nm}")
    gdb.execute("kill")


main()
