#!/usr/bin/env python3
"""Sums up a GOLDEN_PATCH_STATS file (tests/policy/golden.rs): per golden case with a patch, the
operation count and size in bytes of the recorded patch and of the patch now.

    rm -f /tmp/stats.jsonl
    GOLDEN_PATCH_STATS=/tmp/stats.jsonl cargo test --test policy
    scripts/golden-patch-stats.py /tmp/stats.jsonl
"""
import json
import sys

cases = {}
for line in open(sys.argv[1]):
    record = json.loads(line)
    if record["before"] is None and record["after"] is None:
        continue
    cases[(record["kind"], record["key"])] = record
print("kind     key           ops before  ops after  bytes before  bytes after")
totals = {"ob": 0, "oa": 0, "bb": 0, "ba": 0}
for (kind, key), r in sorted(cases.items()):
    b, a = r["before"] or {"ops": 0, "bytes": 0}, r["after"] or {"ops": 0, "bytes": 0}
    totals["ob"] += b["ops"]; totals["oa"] += a["ops"]
    totals["bb"] += b["bytes"]; totals["ba"] += a["bytes"]
    if "--all" in sys.argv:
        print(f"{kind:8} {key[:12]}  {b['ops']:10}  {a['ops']:9}  {b['bytes']:12}  {a['bytes']:11}")
n = len(cases)
print(f"{n} cases with a patch; total ops {totals['ob']} -> {totals['oa']}, "
      f"total bytes {totals['bb']} -> {totals['ba']}")
for kind in sorted({k for k, _ in cases}):
    rs = [r for (k, _), r in cases.items() if k == kind]
    ob = sum((r["before"] or {"ops": 0})["ops"] for r in rs)
    oa = sum((r["after"] or {"ops": 0})["ops"] for r in rs)
    bb = sum((r["before"] or {"bytes": 0})["bytes"] for r in rs)
    ba = sum((r["after"] or {"bytes": 0})["bytes"] for r in rs)
    more = sum(1 for r in rs if (r["after"] or {"ops": 0})["ops"] > (r["before"] or {"ops": 0})["ops"])
    print(f"{kind}: {len(rs)} cases, ops {ob} -> {oa} (mean {ob/len(rs):.1f} -> {oa/len(rs):.1f}), "
          f"bytes {bb} -> {ba} (mean {bb/len(rs):.0f} -> {ba/len(rs):.0f}), {more} cases with more ops")
