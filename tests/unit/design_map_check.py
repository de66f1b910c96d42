#!/usr/bin/env python3
"""Holds docs/design.md's map of the failover engine (§5, "Map of the engine") against the code.

Every file of core/failover/ (and core/failover_engine.*) must have a row; every row must name a
file that exists; no file under core/ includes a shim/ header; and each .cc may include only the room headers its row lists under "may call"
(the shared state, engine_state.h, protection.h and limits.h, is open to every room). Exit 1 with
one line per disagreement.
"""
import os
import re
import sys

repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
design = open(os.path.join(repo, "docs", "design.md"), encoding="utf-8").read()
shared = {"engine_state", "protection", "limits"}
rows = {}
for line in design.splitlines():
    m = re.match(r"\| `core/(failover/)?(\w+)(?:\.\{h,cc\}|\.h)` \|[^|]*\|([^|]*)\|\s*$", line)
    if m:
        rows[m.group(2)] = (m.group(1) or "", set(re.findall(r"`(\w+)`", m.group(3))))
problems = []
if not rows:
    problems.append("docs/design.md: no map rows found (| `core/failover/x.{h,cc}` | owns | may call |)")
folder = os.path.join(repo, "core", "failover")
present = {os.path.splitext(f)[0] for f in os.listdir(folder) if f.endswith((".h", ".cc"))}
present.add("failover_engine")
for name in sorted(present - set(rows)):
    problems.append(f"core/failover/{name}: in the code, missing from the map in docs/design.md")
for name in sorted(set(rows) - present):
    problems.append(f"docs/design.md: the map names {name}, which is not in core/failover/")
for name, (sub, may_call) in sorted(rows.items()):
    for room in sorted(may_call - present):
        problems.append(f"docs/design.md: {name} may call {room}, which does not exist")
    source = os.path.join(repo, "core", sub, name + ".cc")
    if not os.path.exists(source):
        continue
    included = set(re.findall(r'#include "core/failover/(\w+)\.h"', open(source).read()))
    for room in sorted(included - may_call - shared - {name}):
        problems.append(f"core/{sub}{name}.cc includes {room}.h, not in its 'may call' in docs/design.md")
    for room in sorted(may_call - included):
        problems.append(f"docs/design.md: {name} may call {room}, but core/{sub}{name}.cc does not include it")
# core/ reaches the provider only through the VerbsApi table: no file of it includes a shim/ header.
for root, _, files in os.walk(os.path.join(repo, "core")):
    for f in files:
        if f.endswith((".h", ".cc")):
            path = os.path.join(root, f)
            for n, line in enumerate(open(path, encoding="utf-8"), 1):
                if re.match(r'\s*#\s*include\s*"shim/', line):
                    problems.append(f"{os.path.relpath(path, repo)}:{n}: includes a shim/ header; core/ must not")
for problem in problems:
    print(problem)
print(f"design map: {len(rows)} rows, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
