#!/usr/bin/env python3
"""Prints the slowest tests from JUnit XML reports (cargo-nextest's, pytest's): the N longest by
the runner's own time, and per report the number of tests and their summed time; then, for each
failed test, the end of what it printed, so a failure is readable from the end of a long log.

    slowest.py [-n N] [--tail LINES] REPORT.xml...
"""
import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def failure_text(case):
    """What a failed case printed: the failure's message and text, then its stderr."""
    parts = []
    for tag in ("failure", "error"):
        for f in case.findall(tag):
            parts += [f.get("message") or "", f.text or ""]
    for tag in ("system-out", "system-err"):
        for f in case.findall(tag):
            parts.append(f.text or "")
    return "\n".join(p for p in parts if p.strip())


def cases(path):
    """(name, seconds, outcome, failure text) of every test case in one JUnit report."""
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
        text = failure_text(case) if outcome == "FAILED" else ""
        yield full, float(case.get("time") or 0.0), outcome, text


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument("--tail", type=int, default=40, help="lines of each failure (default 40)")
    ap.add_argument("reports", nargs="+", type=Path)
    args = ap.parse_args(argv)
    rows = []
    for report in args.reports:
        if not report.is_file():
            print(f"slowest: no report {report}", file=sys.stderr)
            continue
        found = [(n, t, o, report.stem, x) for n, t, o, x in cases(report)]
        total = sum(r[1] for r in found)
        print(f"{report.stem}: {len(found)} tests, {total:.0f} s summed")
        rows.extend(found)
    rows.sort(key=lambda r: r[1], reverse=True)
    print(f"the {min(args.n, len(rows))} slowest tests (runner's time):")
    for name, secs, outcome, suite, _ in rows[: args.n]:
        mark = "" if outcome == "passed" else f"  [{outcome}]"
        print(f"  {secs:8.1f} s  {suite}: {name}{mark}")
    for name, _, outcome, suite, text in rows:
        if outcome != "FAILED":
            continue
        lines = text.splitlines()
        # From the panic (or assertion) on, where there is one: its message, not the backtrace's end.
        start = next((i for i, l in enumerate(lines) if "panicked at" in l or "AssertionError" in l or l.startswith("E ")), max(0, len(lines) - args.tail))
        shown = lines[start:start + args.tail]
        print(f"--- failed: {suite}: {name} ({len(shown)} of {len(lines)} lines)")
        for line in shown:
            print(f"    {line}")


if __name__ == "__main__":
    main(sys.argv[1:])
