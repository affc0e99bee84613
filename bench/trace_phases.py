"""Per-step phase milliseconds from an mmtrain Kineto trace (tools.profile's
<output_dir>/profile/rank<R>.pt.trace.json): the mmtrain::<phase> spans, and the fsdp::wait_*
spans summed as comm_wait, averaged over the traced ProfilerStep spans. Works on traces of builds
older than metrics.jsonl's phases_ms, for before/after comparisons.
Usage: .venv/bin/python bench/trace_phases.py TRACE.json   (prints one JSON line)
"""
import collections
import json
import sys


def complete_spans(path: str) -> tuple[list, list]:
    """The trace's complete ("X") spans, and among them the ProfilerStep ones (at least one)."""
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    if not steps:
        raise SystemExit(f"{path}: no ProfilerStep spans (was tools.profile on?)")
    return events, steps


def phases(path: str) -> dict:
    events, steps = complete_spans(path)
    totals = collections.defaultdict(float)
    for e in events:
        if e["name"].startswith("mmtrain::"):
            totals[e["name"].split("::", 1)[1]] += e["dur"] / 1000
        elif e["name"].startswith("fsdp::wait_"):
            totals["comm_wait"] += e["dur"] / 1000
    n = len(steps)
    return {"steps": n, "step_ms": round(sum(s["dur"] for s in steps) / 1000 / n, 1),
            **{k: round(v / n, 1) for k, v in sorted(totals.items())}}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(json.dumps(phases(sys.argv[1])))
