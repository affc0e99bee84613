"""Where a step's time goes, op by op, from an mmtrain Kineto trace (tools.profile's
<output_dir>/profile/rank<R>.pt.trace.json): each op's self time (its span less the spans nested in
it on the same thread), averaged over the traced ProfilerStep spans, as ms and % of the step.
The phase spans (mmtrain::*, fsdp::wait_*) are left out (bench/trace_phases.py reports them), and
so are the communication threads' spans (gloo:*), which overlap compute, and the profiler's own span.
Usage: .venv/bin/python bench/trace_ops.py TRACE.json [TOP]   (a table, then one JSON line)
"""
import collections
import json
import sys

from trace_phases import complete_spans


def op_self_ms(path: str) -> tuple[float, dict]:
    events, steps = complete_spans(path)
    by_thread = collections.defaultdict(list)
    for e in events:
        if not e["name"].startswith("ProfilerStep#"):
            by_thread[e["tid"]].append(e)
    self_us = collections.Counter()
    for spans in by_thread.values():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_spans = []
        for e in spans:
            while open_spans and open_spans[-1]["ts"] + open_spans[-1]["dur"] <= e["ts"]:
                open_spans.pop()
            if open_spans:
                self_us[open_spans[-1]["name"]] -= e["dur"]
            self_us[e["name"]] += e["dur"]
            open_spans.append(e)
    n = len(steps)
    step_ms = sum(s["dur"] for s in steps) / 1000 / n
    ops = {name: us / 1000 / n for name, us in self_us.items()
           if not name.startswith(("mmtrain::", "fsdp::", "gloo:", "PyTorch Profiler"))}
    return step_ms, ops


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    step_ms, ops = op_self_ms(sys.argv[1])
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:int(sys.argv[2]) if len(sys.argv) == 3 else 15]
    print(f"step {step_ms:.1f} ms")
    for name, ms in top:
        print(f"{ms:9.1f} ms {100 * ms / step_ms:5.1f} %  {name}")
    print(json.dumps({"step_ms": round(step_ms, 1), "ops_ms": {name: round(ms, 1) for name, ms in top}}))
