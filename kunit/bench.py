#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""ibext benchmark results: per-setup medians, paired ratios and the goals table.

The guest prints one line `ibext-bench: {json}` per repetition of each setup ("rep", and
"order", its place in that repetition). A repetition runs the setups of one case back to back,
their order rotating from one repetition to the next, so the ratio of two setups is measured
once per repetition, with the two close in time. A goal's ratio is reported as the median and
min-max of those per-repetition ratios, and judged:

  met      every repetition's ratio is on the goal's side of the bound;
  not met  every repetition's ratio is on the wrong side;
  unclear  otherwise.

Usage:
  bench.py RESULTS.jsonl             the tables and goals of one run (what `make bench` prints)
  bench.py --spread A.jsonl B.jsonl ...
                                     each goal's median ratio in every run, and its spread
                                     across the runs (max - min); for choosing a measurement
"""

import argparse
import json
import re
import statistics
import sys

LINE = re.compile(r"ibext-bench: (\{.*\})\s*$")

# Everything a case measures; the other keys (bench, qps, depth, table, position, ...) name it.
METRICS = {
    "ops_per_s", "events_per_1k_completions", "lat_mean_ns", "lat_p99_ns", "cqs",
    "cqe_allocated", "max_profile", "deferred_polls", "mode_switches", "profile_changes",
    "defer_asked_us", "defer_waited_us", "defer_found", "idle_pct", "ns_per_lookup", "lookups", "recv_bytes",
    "iops", "clat_p99_us", "events_per_io", "target_recv_bytes", "initiator_events_per_io",
    "target_events_per_io",
    "peak_cqs", "peak_cqe", "resident_cqs", "resident_cqe", "recv_bytes_end",
    "drain_ns", "ns_per_completion",
    "ios", "srq_limit_events", "srq_limit_arms", "srq_limit_arms_total",
    "rnr_naks", "rnr_naks_per_io",
    "seconds", "messages", "msgs_per_s", "events_per_msg", "rtt_p50_us", "rtt_p99_us",
    "ib_evt_handler_call", "ib_tasklet_call", "ib_tx_cq_event", "ib_rx_cq_event", "deferrals",
}
NOT_CASE = METRICS | {"setup", "rep", "order", "reps"}


def rows_of_log(path):
    """The benchmark lines of a guest console log."""
    rows = []
    for line in open(path, errors="replace"):
        m = LINE.search(line)
        if m:
            rows.append(json.loads(m.group(1)))
    return rows


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def case_of(r):
    return tuple(sorted((k, v) for k, v in r.items() if k not in NOT_CASE))


def grouped(rows, bench):
    """{case: {rep: {setup: row}}} of one benchmark. Rows without "rep" (results of an older
    run, already medians) count as repetition 0."""
    out = {}
    for r in rows:
        if r.get("bench") == bench:
            out.setdefault(case_of(r), {}).setdefault(r.get("rep", 0), {})[r["setup"]] = r
    return out


def medians(rows):
    """One row per (case, setup): each metric's median over the repetitions."""
    by = {}
    for r in rows:
        by.setdefault((r.get("bench"), case_of(r), r.get("setup")), []).append(r)
    out = []
    for rs in by.values():
        m = {k: v for k, v in rs[0].items() if k not in METRICS and k not in ("rep", "order")}
        for k in sorted({k for r in rs for k in r} & METRICS):
            vals = [r[k] for r in rs if k in r]
            m[k] = statistics.median(vals)
            if isinstance(vals[0], int) and float(m[k]).is_integer():
                m[k] = int(m[k])
        m["reps"] = max(len(rs), rs[0].get("reps", 1))
        out.append(m)
    return out


class Goal:
    """A ratio `num / den` of `metric` (den may be several setups: their best), per case of
    `bench` that `select` accepts, judged against `bound` with `op` ("ge" or "le")."""

    def __init__(self, text, bench, metric, num, den, op, bound, select=None, label=None,
                 best=max):
        self.text, self.bench, self.metric = text, bench, metric
        self.num, self.den = num, den if isinstance(den, tuple) else (den,)
        self.op, self.bound = op, bound
        self.select = select or (lambda case, all_cases: True)
        self.label = label or (lambda c: " ".join(f"{k}={v}" for k, v in c if k not in ("bench", "ops")))
        self.best = best

    def ratios(self, reps):
        out = []
        for _, s in sorted(reps.items()):
            if self.num in s and all(d in s for d in self.den):
                den = self.best(s[d][self.metric] for d in self.den)
                if den:
                    out.append(s[self.num][self.metric] / den)
        return out

    def evaluate(self, rows):
        """[(case label, ratios)] for every selected case that has both sides."""
        cases = grouped(rows, self.bench)
        out = []
        for case, reps in sorted(cases.items(), key=lambda kv: _sort_key(kv[0])):
            if self.select(dict(case), [dict(c) for c in cases]):
                vals = self.ratios(reps)
                if vals:
                    out.append((self.label(case), vals))
        return out

    def judge(self, vals):
        ok = [(v >= self.bound) if self.op == "ge" else (v <= self.bound) for v in vals]
        if all(ok):
            return "met"
        if not any(ok):
            return "not met"
        return "unclear"

    def bound_text(self):
        return f"{'>=' if self.op == 'ge' else '<='} {self.bound:g}"


class DiffGoal(Goal):
    """A difference `num - den` of `metric` instead of a ratio: for counts whose baseline may
    be 0 (RNR NAKs per I/O), where a ratio says nothing."""

    def ratios(self, reps):
        sides = (self.num,) + self.den
        return [s[self.num][self.metric] - self.best(s[d][self.metric] for d in self.den)
                for _, s in sorted(reps.items())
                if all(d in s and self.metric in s[d] for d in sides)]


def _sort_key(case):
    return tuple((k, (0, v) if isinstance(v, (int, float)) else (1, str(v))) for k, v in case)


def _table_sizes(cases):
    return sorted({c["table"] for c in cases if "table" in c})


GOALS = [
    Goal("CQ pool ops/s, ibext / upstream's pool", "cq_pool", "ops_per_s",
         "ibext_pool", "upstream_pool", "ge", 1.0),
    Goal("CQ drain time (engine, driver, callbacks), ibext / upstream's pool", "cq_drain",
         "drain_ns", "ibext_pool", "upstream_pool", "le", 1.0),
    Goal("CQ pool ops/s, aging on / aging off", "cq_aging_ops", "ops_per_s",
         "ibext_pool", "ibext_pool_aging_off", "ge", 0.98),
    Goal("Resident CQs after a 64-QP burst, ibext / the floor (1 per used vector)",
         "cq_aging", "resident_cqs", "ibext_pool", "floor", "le", 1.0),
    Goal("Resident CQ entries after a 64-QP burst, ibext / upstream's pool", "cq_aging",
         "resident_cqe", "ibext_pool", "upstream_pool", "le", 1.0),
    Goal("GID find time, ibext / rdma_find_gid, every table and position", "gid",
         "ns_per_lookup", "ibext", "rdma_find_gid", "le", 1.1,
         select=lambda c, cs: c["position"] != "second_device"),
    Goal("GID find at the last of the largest table, rdma_find_gid / ibext (times faster)",
         "gid", "ns_per_lookup", "rdma_find_gid", "ibext", "ge", 20.0,
         select=lambda c, cs: c["table"] == _table_sizes(cs)[-1] and c["position"] == "last"),
    Goal("ADAPTIVE ops/s / best fixed mode (none_softirq, none_workqueue, dim)", "dim",
         "ops_per_s", "adaptive", ("none_softirq", "none_workqueue", "dim"), "ge", 0.95),
    Goal("DIM events per completion / none_softirq, depth >= 32", "dim",
         "events_per_1k_completions", "dim", "none_softirq", "le", 0.70,
         select=lambda c, cs: c["depth"] >= 32),
    Goal("DIM mean latency / none_softirq, depth 1", "dim", "lat_mean_ns", "dim",
         "none_softirq", "le", 1.05, select=lambda c, cs: c["depth"] == 1),
    Goal("SRQ pool receive bytes / per-QP receive queues", "srq", "recv_bytes", "srq_pool",
         "per_qp_rq", "le", 0.125),
    Goal("SRQ pool ops/s / per-QP receive queues", "srq", "ops_per_s", "srq_pool",
         "per_qp_rq", "ge", 0.90),
    Goal("NVMe/RDMA 4K random-read IOPS, ports / upstream's modules", "nvme", "iops",
         "ibext", "upstream", "ge", 1.0),
    Goal("NVMe/RDMA completion events per I/O, ports / upstream's modules", "nvme",
         "events_per_io", "ibext", "upstream", "le", 1.0),
    DiffGoal("NVMe/RDMA RNR NAKs per I/O, ports - upstream's modules (1% of I/Os)", "nvme",
             "rnr_naks_per_io", "ibext", "upstream", "le", 0.01),
    Goal("SRP 4K random-read IOPS, ADAPTIVE port / best of upstream, NONE, DIM", "srp",
         "iops", "adaptive", ("upstream", "none", "dim"), "ge", 0.95),
    Goal("SRP completion events per I/O, ADAPTIVE port / upstream, depth >= 32", "srp",
         "events_per_io", "adaptive", "upstream", "le", 1.0,
         select=lambda c, cs: c["depth"] >= 32),
    Goal("RDS messages/s, port / upstream rds_rdma", "rds", "msgs_per_s", "port", "upstream",
         "ge", 1.0),
    Goal("RDS completion events per message, port / upstream rds_rdma, depth 16 and stream",
         "rds", "events_per_msg", "port", "upstream", "le", 0.70,
         select=lambda c, cs: c["depth"] in (16, "stream")),
    Goal("RDS round-trip time (median), port / upstream rds_rdma, depth 1", "rds",
         "rtt_p50_us", "port", "upstream", "le", 1.05, select=lambda c, cs: c["depth"] == 1),
    Goal("NVMe/RDMA target receive bytes, port / upstream with use_srq=1", "nvme_mem",
         "target_recv_bytes", "ibext", "upstream_srq", "le", 1.0),
    Goal("NVMe/RDMA target receive bytes at one host queue, port / upstream without SRQ",
         "nvme_mem", "target_recv_bytes", "ibext", "upstream", "le", 1.0,
         select=lambda c, cs: c["host_queues"] == 1),
]


def print_table(rows, cols, out=sys.stdout):
    """Prints `rows` with `cols` first, then any other key they have."""
    if not rows:
        return
    cols = cols + sorted({k for r in rows for k in r} - set(cols))
    present = [c for c in cols if any(c in r for r in rows)]
    print(" ".join(f"{c:>14}" for c in present), file=out)
    for r in rows:
        print(" ".join(f"{str(r.get(c, '')):>14}" for c in present), file=out)


def print_medians(rows):
    med = medians(rows)
    print("Per setup, the median over the repetitions:")
    print_table([r for r in med if r.get("bench") == "nvme"],
                ["bench", "setup", "jobs", "depth", "reps", "iops", "clat_p99_us",
                 "events_per_io", "rnr_naks_per_io", "ios", "srq_limit_arms_total",
                 "srq_limit_events", "srq_limit_arms"])
    print_table([r for r in med if r.get("bench") == "srp"],
                ["bench", "setup", "jobs", "depth", "reps", "iops", "clat_p99_us",
                 "events_per_io", "initiator_events_per_io", "target_events_per_io", "ios"])
    print_table([r for r in med if r.get("bench") == "rds"],
                ["bench", "setup", "links", "depth", "size", "reps", "msgs_per_s",
                 "events_per_msg", "rtt_p50_us", "rtt_p99_us", "idle_pct", "deferrals",
                 "defer_asked_us", "defer_waited_us", "defer_found"])
    print_table([r for r in med if r.get("bench") == "nvme_mem"],
                ["bench", "setup", "host_queues", "controllers", "target_recv_bytes"])
    print_table([r for r in med if r.get("bench") == "cq_aging"],
                ["bench", "setup", "qps", "nr_cqe", "reps", "peak_cqs", "peak_cqe",
                 "resident_cqs", "resident_cqe"])
    print_table([r for r in med
                 if r.get("bench") not in ("gid", "srq", "nvme", "nvme_mem", "cq_aging", "srp",
                                               "rds")],
                ["bench", "setup", "qps", "depth", "ops", "reps", "ops_per_s",
                 "events_per_1k_completions", "lat_mean_ns", "lat_p99_ns", "cqs",
                 "cqe_allocated"])
    print_table([r for r in med if r.get("bench") == "srq"],
                ["bench", "setup", "qps", "vectors", "entries", "buf_size", "reps",
                 "recv_bytes", "recv_bytes_end", "ops_per_s"])
    print_table([r for r in med if r.get("bench") == "gid"],
                ["bench", "setup", "table", "position", "reps", "lookups", "ns_per_lookup"])


def goal_rows(rows):
    """[(goal, case label, ratios)] of every goal with data in `rows`."""
    return [(g, label, vals) for g in GOALS for label, vals in g.evaluate(rows)]


def print_goals(rows):
    print("Goals (paired ratios: the median and min-max over the repetitions):")
    hdr = f"{'goal':<72} {'case':<26} {'bound':>8} {'median':>8} {'range':>13} {'n':>3}  verdict"
    print(hdr)
    counts = {}
    for g, label, vals in goal_rows(rows):
        v = g.judge(vals)
        counts[v] = counts.get(v, 0) + 1
        rng = f"{min(vals):.2f}-{max(vals):.2f}"
        print(f"{g.text:<72} {label:<26} {g.bound_text():>8} {statistics.median(vals):>8.2f} "
              f"{rng:>13} {len(vals):>3}  {v}")
    print("goals: " + ", ".join(f"{counts.get(k, 0)} {k}" for k in ("met", "not met", "unclear")))


def print_growth(rows):
    """How each NVMe target's receive memory grows with the host queues (`rows`: medians)."""
    by = {}
    for r in rows:
        if r.get("bench") == "nvme_mem":
            by.setdefault(r["setup"], {})[r["host_queues"]] = r["target_recv_bytes"]
    for setup, q in sorted(by.items()):
        lo, hi = min(q), max(q)
        if q[lo]:
            print(f"nvme target receive bytes, {setup}: {hi} host queues / {lo}: "
                  f"{q[hi] / q[lo]:.2f} ({q[lo]} -> {q[hi]})")


def report(rows):
    print_medians(rows)
    print_growth(medians(rows))
    print_goals(rows)


def spread(paths):
    """Each goal's median ratio per run, and the spread across runs (max - min, and that
    relative to the median of the medians)."""
    runs = [goal_rows(load(p)) for p in paths]
    keys = []
    for run in runs:
        for g, label, _ in run:
            if (g.text, label) not in keys:
                keys.append((g.text, label))
    print(f"{len(paths)} runs: " + " ".join(paths))
    print(f"{'goal':<72} {'case':<26} {'medians per run':<48} {'spread':>7} {'rel':>6}")
    for text, label in keys:
        meds = []
        for run in runs:
            for g, lab, vals in run:
                if g.text == text and lab == label:
                    meds.append(statistics.median(vals))
        if not meds:
            continue
        sp = max(meds) - min(meds)
        mid = statistics.median(meds)
        per = " ".join(f"{m:.2f}" for m in meds)
        print(f"{text:<72} {label:<26} {per:<48} {sp:>7.2f} {sp / mid if mid else 0:>6.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spread", action="store_true")
    ap.add_argument("results", nargs="+")
    args = ap.parse_args()
    if args.spread:
        spread(args.results)
    else:
        for p in args.results:
            report(load(p))


if __name__ == "__main__":
    main()
