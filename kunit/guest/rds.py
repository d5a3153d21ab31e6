#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""RDS over the IB transport between two local addresses, for rds.sh and
rds-bench.sh. The shape is the kernel's RDS selftest
(tools/testing/selftests/net/rds/test.py, over TCP), made stricter for IB:

  traffic  many socket pairs, one on each address, both directions; message
           sizes from 1 byte to RDS_MAX_MSG_SIZE (1 MiB); every message is
           checked on arrival: the next one of its flow, its size, every
           byte. At the end every flow has all its messages and nothing more
           comes. One past the largest size is refused (EMSGSIZE).
  bench    ping-pong at a given depth per socket pair; one JSON line with
           messages per second, completion events per message (RDS's own
           ib_evt_handler_call counter), the round-trip times and the share
           of CPU time spent idle.
  conns    RDS's connections (RDS_INFO_CONNECTIONS), one line each.

Every wait is bounded by --stall: no progress for that long is a failure
that prints what was missing, never a hang.
"""
import argparse
import ctypes
import errno
import json
import os
import random
import select
import socket
import struct
import sys
import time

SOL_RDS = 276
SO_RDS_TRANSPORT = 8
RDS_TRANS_IB = 0
RDS_INFO_COUNTERS = 10000
RDS_INFO_CONNECTIONS = 10001
RDS_MAX_MSG_SIZE = 1 << 20
SO_SNDBUFFORCE = 32  # asm-generic/socket.h; not in Python's socket module
SO_RCVBUFFORCE = 33
FLAG_NAMES = {1: "sending", 2: "connecting", 4: "connected"}

# Sizes every traffic run sends (each flow starts at another place in the
# list): the edges of a header, a fragment (4 KiB, RDS_FRAG_SIZE) and a page,
# and up to the largest message RDS takes.
EDGES = [1, 2, 3, 15, 16, 17, 47, 48, 49, 255, 256, 1023, 4095, 4096, 4097,
         8191, 8192, 8193, 16384, 65535, 65536, 131072, 262144, 524288,
         1048575, 1048576]
HDR = struct.Struct("<HI")  # flow, message number

libc = ctypes.CDLL(None, use_errno=True)


def info(sock, opt):
    """An RDS_INFO_* getsockopt; Python's own takes at most 1024 bytes."""
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        length = ctypes.c_int(size)
        ret = libc.getsockopt(sock.fileno(), SOL_RDS, opt, buf, ctypes.byref(length))
        if ret >= 0:
            return buf.raw[:length.value], ret
        e = ctypes.get_errno()
        if e != errno.ENOSPC:
            raise OSError(e, os.strerror(e))
        size = length.value


def cpu_times():
    """The "cpu" line of /proc/stat: (idle and iowait, all), in ticks."""
    with open("/proc/stat") as f:
        t = [int(x) for x in f.readline().split()[1:]]
    return t[3] + t[4], sum(t)


def counters(sock):
    raw, each = info(sock, RDS_INFO_COUNTERS)
    out = {}
    for off in range(0, len(raw), each):
        name, value = struct.unpack_from("<32sQ", raw, off)
        out[name.rstrip(b"\0").decode()] = value
    return out


def connections(sock):
    raw, each = info(sock, RDS_INFO_CONNECTIONS)
    out = []
    for off in range(0, len(raw), each):
        tx, rx, la, fa, tr, flags = struct.unpack_from("<QQ4s4s16sB", raw, off)
        out.append((socket.inet_ntoa(la), socket.inet_ntoa(fa), tr.rstrip(b"\0").decode(),
                    flags, tx, rx))
    return out


def rds_socket(addr, port, buf=4 << 20):
    s = socket.socket(socket.AF_RDS, socket.SOCK_SEQPACKET)
    # The transport is chosen before bind, or RDS picks one by address.
    s.setsockopt(SOL_RDS, SO_RDS_TRANSPORT, RDS_TRANS_IB)
    # RDS refuses a message larger than half the send buffer.
    s.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, buf)
    s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, buf)
    s.bind((addr, port))
    s.setblocking(False)
    return s


def socket_pairs(args):
    """--links pairs: socket i on a at port + i, its peer on b at port + 1000 + i; the
    sockets and their addresses."""
    addr_a = [(args.a, args.port + i) for i in range(args.links)]
    addr_b = [(args.b, args.port + 1000 + i) for i in range(args.links)]
    return [rds_socket(*a) for a in addr_a], addr_a, [rds_socket(*b) for b in addr_b], addr_b


class Flow:
    """One direction of one socket pair: messages 0..count-1 in order."""

    def __init__(self, ident, src, dst, dst_addr, count, large_every):
        self.ident, self.src, self.dst, self.dst_addr = ident, src, dst, dst_addr
        self.count, self.large_every = count, large_every
        self.sent = self.received = 0

    def size(self, k):
        if self.large_every and k % self.large_every == 0:
            return EDGES[(k // self.large_every + self.ident) % len(EDGES)]
        return 1 + (k * 2654435761 + self.ident * 40503) % 4096

    def message(self, blob, k):
        size = self.size(k)
        off = (self.ident * 7919 + k * 104729) % (len(blob) - size)
        return (HDR.pack(self.ident, k) + blob[off:off + size])[:size]


def traffic(args):
    blob = random.Random(args.seed).randbytes(2 * RDS_MAX_MSG_SIZE + 64)
    socks_a, addr_a, socks_b, addr_b = socket_pairs(args)
    flows, by_pair = [], {}
    for i in range(args.links):
        for src, dst, addr in ((socks_a[i], socks_b[i], addr_b[i]),
                               (socks_b[i], socks_a[i], addr_a[i])):
            f = Flow(len(flows), src, dst, addr, args.messages, args.large_every)
            flows.append(f)
            by_pair[(dst.fileno(), src.getsockname())] = f

    # One past the largest message is refused, and nothing is sent.
    try:
        socks_a[0].sendto(b"\0" * (RDS_MAX_MSG_SIZE + 1), flows[0].dst_addr)
        print(f"# rds: a message of {RDS_MAX_MSG_SIZE + 1} bytes was taken")
        return 1
    except OSError as e:
        if e.errno != errno.EMSGSIZE:
            print(f"# rds: a message of {RDS_MAX_MSG_SIZE + 1} bytes: {e}, not EMSGSIZE")
            return 1

    ep = select.epoll()
    by_fd = {}
    for s in socks_a + socks_b:
        ep.register(s, select.EPOLLIN)
        by_fd[s.fileno()] = s
    errors, total, nbytes = [], args.messages * len(flows), 0
    received = 0
    last = time.monotonic()
    next_report = 0

    def fail(what):
        errors.append(what)
        return len(errors) >= 10

    while received < total and not errors:
        progress = False
        for f in flows:
            while f.sent < f.count and f.sent - f.received < args.window:
                try:
                    f.src.sendto(f.message(blob, f.sent), f.dst_addr)
                except OSError as e:
                    # A full send buffer, a congested receiver (RDS's
                    # congestion map) or a connection being made again.
                    if e.errno in (errno.EAGAIN, errno.ENOBUFS, errno.ECONNRESET,
                                   errno.ENOTCONN, errno.EPIPE, errno.EHOSTUNREACH):
                        break
                    raise
                f.sent += 1
                progress = True
        for fd, _ in ep.poll(0.05):
            s = by_fd[fd]
            while True:
                try:
                    data, _, flags, addr = s.recvmsg(RDS_MAX_MSG_SIZE + 1)
                except BlockingIOError:
                    break
                progress = True
                f = by_pair.get((fd, addr))
                if f is None:
                    fail(f"message from unknown sender {addr}")
                    continue
                k = f.received
                if flags & socket.MSG_TRUNC or k >= f.count or data != f.message(blob, k):
                    who = struct.unpack_from("<HI", data) if len(data) >= HDR.size else ()
                    fail(f"flow {f.ident}: expected message {k} of {f.size(k)} bytes, "
                         f"got {len(data)} bytes (header {who}, flags {flags:#x})")
                    continue
                f.received += 1
                received += 1
                nbytes += len(data)
        now = time.monotonic()
        if progress:
            last = now
        elif now - last > args.stall:
            fail(f"no progress for {args.stall} s")
        if args.progress and (received >= next_report or received == total):
            with open(args.progress + ".new", "w") as p:
                p.write(f"{received}\n")
            os.replace(args.progress + ".new", args.progress)
            next_report = received + 200

    # Nothing more may come: a duplicate would arrive now.
    if not errors:
        end = time.monotonic() + args.drain
        while time.monotonic() < end:
            for fd, _ in ep.poll(0.1):
                try:
                    data, _, _, addr = by_fd[fd].recvmsg(RDS_MAX_MSG_SIZE + 1)
                    fail(f"a message after the last one: {len(data)} bytes from {addr}")
                except BlockingIOError:
                    pass
            if errors:
                break
    for e in errors:
        print(f"# rds: {e}")
    if errors:
        for f in flows:
            if f.received < f.count:
                print(f"# rds: flow {f.ident}: sent {f.sent}, received {f.received} of {f.count}")
        for c in connections(socks_a[0]):
            print(f"# rds: connection {c}")
        return 1
    sizes = {f.size(k) for f in flows for k in range(f.count)}
    edges = sum(1 for e in EDGES if e in sizes)
    print(f"# rds: {len(flows)} flows on {args.links} socket pairs: {received} messages, "
          f"{nbytes} bytes, each once and in order, {min(sizes)} to {max(sizes)} bytes "
          f"({edges} of the {len(EDGES)} edge sizes); {RDS_MAX_MSG_SIZE + 1} refused")
    return 0


def bench(args):
    """Ping-pong: each pair keeps --depth messages of --size bytes in flight
    from a to b, b echoes each one back; one round trip is two messages. Or,
    with --stream, a sends as fast as RDS takes messages and b receives: the
    messages received per second."""
    socks_a, _, socks_b, addr_b = socket_pairs(args)
    ep = select.epoll()
    role = {}
    for i in range(args.links):
        ep.register(socks_a[i], select.EPOLLIN)
        ep.register(socks_b[i], select.EPOLLIN)
        role[socks_a[i].fileno()] = ("a", i)
        role[socks_b[i].fileno()] = ("b", i)
    payload = bytes(args.size)
    sent_at = [[] for _ in range(args.links)]
    rtts, trips = [], 0

    def send(s, addr):
        while True:
            try:
                s.sendto(payload, addr)
                return
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.ENOBUFS):
                    raise
                time.sleep(0.0005)

    seen = [False] * args.links  # a message came through this pair

    def run(seconds, record):
        nonlocal trips
        end = time.monotonic() + seconds
        last = time.monotonic()
        # The warm-up lasts until every pair is connected, as well.
        while time.monotonic() < end or not (record or all(seen)):
            for fd, _ in ep.poll(0.05):
                side, i = role[fd]
                s = socks_a[i] if side == "a" else socks_b[i]
                while True:
                    try:
                        _, addr = s.recvfrom(args.size + 1)
                    except BlockingIOError:
                        break
                    last = time.monotonic()
                    if side == "b":
                        send(s, addr)
                        continue
                    t0 = sent_at[i].pop(0)
                    seen[i] = True
                    if record:
                        trips += 1
                        rtts.append(last - t0)
                    sent_at[i].append(time.monotonic())
                    send(s, addr_b[i])
            if time.monotonic() - last > args.stall:
                raise SystemExit(f"# rds bench: no progress for {args.stall} s")

    def stream(seconds, record):
        """a sends whenever RDS takes a message, b only receives."""
        nonlocal trips
        end = time.monotonic() + seconds
        last = time.monotonic()
        while time.monotonic() < end or not (record or all(seen)):
            for i in range(args.links):
                for _ in range(64):
                    try:
                        socks_a[i].sendto(payload, addr_b[i])
                    except OSError as e:
                        if e.errno not in (errno.EAGAIN, errno.ENOBUFS):
                            raise
                        break
            for fd, _ in ep.poll(0.001):
                side, i = role[fd]
                s = socks_b[i] if side == "b" else socks_a[i]
                while True:
                    try:
                        s.recvfrom(args.size + 1)
                    except BlockingIOError:
                        break
                    last = time.monotonic()
                    seen[i] = True
                    if record:
                        trips += 1
            if time.monotonic() - last > args.stall:
                raise SystemExit(f"# rds bench: no progress for {args.stall} s")

    if args.stream:
        stream(args.warmup, False)
        c0, t0, cpu0 = counters(socks_a[0]), time.monotonic(), cpu_times()
        stream(args.seconds, True)
        c1, t1, cpu1 = counters(socks_a[0]), time.monotonic(), cpu_times()
        msgs = trips
    else:
        for i in range(args.links):
            for _ in range(args.depth):
                sent_at[i].append(time.monotonic())
                send(socks_a[i], addr_b[i])
        run(args.warmup, False)
        c0, t0, cpu0 = counters(socks_a[0]), time.monotonic(), cpu_times()
        run(args.seconds, True)
        c1, t1, cpu1 = counters(socks_a[0]), time.monotonic(), cpu_times()
        msgs = 2 * trips
    ev = {k: c1[k] - c0.get(k, 0) for k in ("ib_evt_handler_call", "ib_tasklet_call",
                                             "ib_tx_cq_event", "ib_rx_cq_event")}
    rtts.sort()
    pick = lambda q: round(rtts[min(len(rtts) - 1, int(q * len(rtts)))] * 1e6, 1) if rtts else 0
    print("ibext-bench: " + json.dumps({
        "bench": "rds", "setup": args.setup, "rep": args.rep, "order": args.order,
        "links": args.links, "depth": "stream" if args.stream else args.depth,
        "size": args.size, "seconds": round(t1 - t0, 3), "messages": msgs,
        "msgs_per_s": round(msgs / (t1 - t0), 1),
        "events_per_msg": round(ev["ib_evt_handler_call"] / msgs, 4) if msgs else 0,
        "rtt_p50_us": pick(0.5), "rtt_p99_us": pick(0.99),
        "idle_pct": round(100 * (cpu1[0] - cpu0[0]) / max(1, cpu1[1] - cpu0[1]), 1), **ev}))
    return 0


def conns(args):
    s = socket.socket(socket.AF_RDS, socket.SOCK_SEQPACKET)
    for la, fa, tr, flags, tx, rx in connections(s):
        names = ",".join(n for b, n in FLAG_NAMES.items() if flags & b) or "down"
        print(f"{la} {fa} {tr} {names} tx {tx} rx {rx}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["traffic", "bench", "conns"])
    ap.add_argument("--a", default="10.14.0.1")
    ap.add_argument("--b", default="10.14.0.2")
    ap.add_argument("--port", type=int, default=4000)
    ap.add_argument("--links", type=int, default=8, help="socket pairs")
    ap.add_argument("--messages", type=int, default=200, help="per flow (traffic)")
    ap.add_argument("--large-every", type=int, default=8,
                    help="every n-th message of a flow is one of the edge sizes, up to 1 MiB; "
                    "0: small messages only (traffic)")
    ap.add_argument("--window", type=int, default=16, help="messages in flight per flow")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--progress", help="file to write the count of messages received to")
    ap.add_argument("--drain", type=float, default=0.5,
                    help="seconds to listen for a message after the last (traffic)")
    ap.add_argument("--stall", type=float, default=120)
    ap.add_argument("--depth", type=int, default=1, help="(bench)")
    ap.add_argument("--stream", action="store_true",
                    help="one way, as fast as RDS takes messages, instead of ping-pong (bench)")
    ap.add_argument("--size", type=int, default=64, help="(bench)")
    ap.add_argument("--seconds", type=float, default=5, help="(bench)")
    ap.add_argument("--warmup", type=float, default=1, help="(bench)")
    ap.add_argument("--setup", default="", help="label of the JSON line (bench)")
    ap.add_argument("--rep", type=int, default=0, help="repetition (bench)")
    ap.add_argument("--order", type=int, default=0, help="place in the repetition (bench)")
    args = ap.parse_args()
    return {"traffic": traffic, "bench": bench, "conns": conns}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
