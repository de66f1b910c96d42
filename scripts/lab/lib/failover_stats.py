#!/usr/bin/env python3
"""Reads the shim's statistics files of a lab scenario (VERBS_FAILOVER_STATS, written at exit).

The lab's app() gives every shim process VERBS_FAILOVER_STATS=<scenario>/<H>/stats.<H>.<job>.%p.json
(docs/lab.md, "Failover statistics"). Run on the host by scripts/lab/lib/api.sh:

  failover_stats.py check SCEN_DIR HOST JOB [--failover] [--expect EXPR]...
      Exit 0 when every condition holds for the job's stats file(s), else print one line saying
      what does not hold and exit 1 (exit 2: usage). --failover: the summed totals.failovers >= 1
      and every event of every QP resumed (resumed_unix_ns > 0). --expect EXPR: a Python
      expression that must be true for every file, evaluated with s = the file's object, and
      qps(s), dev(s, NAME), totals(s) as helpers.
  failover_stats.py times SCEN_DIR HOST [JOB...]
      Failover timing: prints "key value" lines. For each fault injected on HOST (SCEN_DIR/
      fault_times, written by the lab's fault()), the failover events of HOST's processes (JOBs, or
      all) detected after that fault and before the next one; fault_to_resume = the latest
      resumed_unix_ns among them minus the fault's time (both read from HOST's clock), and the
      fault time's error bound. Also the event "ms" (detection to first completion, each host's own
      clock) over every host, and the same for the failovers a peer asked for (reason
      peer_request: from the peer's request reaching this host to its first completion here).
"""
import glob
import json
import os
import re
import statistics
import sys


def stats_files(scen_dir, host, job=None):
    pattern = os.path.join(scen_dir, host, "stats.%s.%s.*.json" % (host, job if job else "*"))
    out = []
    for path in sorted(glob.glob(pattern)):
        name = os.path.basename(path)
        m = re.fullmatch(r"stats\.%s\.(.+)\.(\d+)\.json" % re.escape(host), name)
        if m and (job is None or m.group(1) == job):
            out.append((m.group(1), path))
    return out


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def qps(s):
    return s.get("qps") or []


def dev(s, name):
    for d in s.get("devices") or []:
        if d.get("name") == name:
            return d
    return {}


def totals(s):
    return s.get("totals") or {}


def events(s):
    for q in qps(s):
        for e in q.get("events") or []:
            yield q, e


def cmd_check(args):
    if len(args) < 3:
        return usage()
    scen_dir, host, job = args[:3]
    rest = args[3:]
    want_failover = False
    exprs = []
    while rest:
        if rest[0] == "--failover":
            want_failover = True
            rest = rest[1:]
        elif rest[0] == "--expect" and len(rest) > 1:
            exprs.append(rest[1])
            rest = rest[2:]
        else:
            return usage()
    files = stats_files(scen_dir, host, job)
    if not files:
        print("%s:%s: no stats file (%s/%s/stats.%s.%s.<pid>.json)" % (host, job, scen_dir, host, host, job))
        return 1
    loaded = []
    for _, path in files:
        try:
            loaded.append((path, load(path)))
        except (OSError, ValueError) as e:
            print("%s:%s: unreadable stats file %s: %s" % (host, job, os.path.basename(path), e))
            return 1
    if want_failover:
        failovers = sum(int(totals(s).get("failovers", 0) or 0) for _, s in loaded)
        if failovers < 1:
            print("%s:%s: no failover in the stats (totals.failovers=0 in %d file(s))" % (host, job, len(loaded)))
            return 1
        for path, s in loaded:
            for q in qps(s):
                evs = q.get("events") or []
                for i, e in enumerate(evs):
                    if int(e.get("resumed_unix_ns") or 0) > 0:
                        continue
                    # A failback onto a path that failed again before any completion there (a
                    # silent failure held down and retried) hands its work to the next failover,
                    # which must resume: only that one is waited for.
                    if e.get("kind") == "failback" and i + 1 < len(evs):
                        continue
                    print("%s:%s: qpn %s %s (%s) never resumed (resumed_unix_ns=0)" % (
                        host, job, q.get("qpn"), e.get("kind"), e.get("reason")))
                    return 1
    for expr in exprs:
        for path, s in loaded:
            try:
                ok = eval(expr, {"qps": qps, "dev": dev, "totals": totals, "all": all, "any": any,
                                 "len": len, "sum": sum}, {"s": s})
            except Exception as e:  # a missing key is a failed expectation, said so
                print("%s:%s: %s: %s: %s" % (host, job, expr, type(e).__name__, e))
                return 1
            if not ok:
                print("%s:%s: does not hold: %s (%s)" % (host, job, expr, os.path.basename(path)))
                return 1
    return 0


def read_faults(scen_dir, host):
    """fault_times lines: KIND HOST NET FAULT_UNIX_NS ERR_NS (guest clock of HOST)."""
    out = []
    try:
        with open(os.path.join(scen_dir, "fault_times"), encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 5 and parts[1] == host:
                    out.append((parts[0], parts[2], int(parts[3]), int(parts[4])))
    except OSError:
        pass
    return out


def cmd_times(args):
    if len(args) < 2:
        return usage()
    scen_dir, host = args[:2]
    jobs = args[2:]
    faults = read_faults(scen_dir, host)
    mine = []
    for job in jobs or [None]:
        for _, path in stats_files(scen_dir, host, job):
            try:
                s = load(path)
            except (OSError, ValueError):
                continue
            mine += [e for _, e in events(s) if e.get("kind") == "failover"]
    all_ms = []
    peer_ms = []
    for h in ("A", "B"):
        for _, path in stats_files(scen_dir, h):
            try:
                s = load(path)
            except (OSError, ValueError):
                continue
            timed = [e for _, e in events(s)
                     if e.get("kind") == "failover" and e.get("ms") is not None]
            all_ms += [float(e["ms"]) for e in timed]
            peer_ms += [float(e["ms"]) for e in timed if e.get("reason") == "peer_request"]
    print("faults %d" % len(faults))
    for i, (kind, net, t, err) in enumerate(faults):
        end = faults[i + 1][2] if i + 1 < len(faults) else None
        got = [e for e in mine
               if int(e.get("detected_unix_ns") or 0) >= t
               and (end is None or int(e.get("detected_unix_ns") or 0) < end)]
        resumed = [int(e.get("resumed_unix_ns") or 0) for e in got]
        line = "fault %d %s %s %s events=%d err_ms=%.1f" % (i + 1, kind, host, net, len(got), err / 1e6)
        if got and all(r > 0 for r in resumed):
            line += " first_ms=%.1f resume_ms=%.1f" % ((min(resumed) - t) / 1e6, (max(resumed) - t) / 1e6)
        print(line)
    if all_ms:
        print("failover_ms_median %.1f" % statistics.median(all_ms))
        print("failover_ms_max %.1f" % max(all_ms))
    if peer_ms:
        print("peer_request_ms_median %.1f" % statistics.median(peer_ms))
        print("peer_request_ms_max %.1f" % max(peer_ms))
    return 0


def usage():
    sys.stderr.write(__doc__)
    return 2


def main(argv):
    if len(argv) < 2:
        return usage()
    if argv[1] == "check":
        return cmd_check(argv[2:])
    if argv[1] == "times":
        return cmd_times(argv[2:])
    return usage()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
