#!/usr/bin/env python3
"""Prints the slowest tests from JUnit XML reports (cargo-nextest's, pytest's): the N longest by
the runner's own time, and per report the number of tests and their summed time.

    slowest.py [-n N] REPORT.xml...
"""
import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def cases(path):
    """(name, seconds, outcome) of every test case in one JUnit report."""
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        cls = case.get("classname", "")
        name = case.get("name", "")
        full = f"{cls} {name}".strip() if cls and not name.startswith(cls) else name
        if case.find("skipped") is not None:
            outcome = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            outcome = "FAILED"
        else:
            outcome = "passed"
        yield full, float(case.get("time") or 0.0), outcome


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument("reports", nargs="+", type=Path)
    args = ap.parse_args(argv)
    rows = []
    for report in args.reports:
        if not report.is_file():
            print(f"slowest: no report {report}", file=sys.stderr)
            continue
        found = [(n, t, o, report.stem) for n, t, o in cases(report)]
        total = sum(t for _, t, _, _ in found)
        print(f"{report.stem}: {len(found)} tests, {total:.0f} s summed")
        rows.extend(found)
    rows.sort(key=lambda r: r[1], reverse=True)
    print(f"the {min(args.n, len(rows))} slowest tests (runner's time):")
    for name, secs, outcome, suite in rows[: args.n]:
        mark = "" if outcome == "passed" else f"  [{outcome}]"
        print(f"  {secs:8.1f} s  {suite}: {name}{mark}")


if __name__ == "__main__":
    main(sys.argv[1:])
