"""Summary of a bench run's arms (bench/fsdp_vs_torch.sh, bench/magihuman_vs_torch.sh).

Layout read: D/bench_meta.json (its WARMUP), D/gemm.json (`mmtrain measure gemm` output) and
D/runs/ARM_rK/metrics.jsonl for every arm ARM and round K. Arms are "mmtrain", optionally
"mmtrain_preload", and one or more "torch_*"; the first torch arm is the one `torch_step_ms` and
`ratio` refer to. step_ms = median step_time_ms over the iterations after WARMUP, all rounds
pooled; rss_mb = max peak_rss_mb (each record's is already the max over ranks). Fields: bench/README.md.
"""
from __future__ import annotations

import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "parity"))

import mmtrain_util as mu  # noqa: E402


def _measured(metrics: list[dict], warmup: int) -> list[dict]:
    measured = [m for m in metrics if m["iteration"] > warmup]
    if not measured:
        raise ValueError("no measured steps after warm-up")
    return measured


def _arm_runs(d: str, arm: str) -> list[list[dict]]:
    """metrics.jsonl of every round of one arm (D/runs/ARM_rK), in round order."""
    runs_dir = os.path.join(d, "runs")
    rounds = sorted(int(n.rsplit("_r", 1)[1]) for n in os.listdir(runs_dir)
                    if n.startswith(arm + "_r") and n[len(arm) + 2:].isdigit())
    runs = [mu.read_metrics(os.path.join(runs_dir, f"{arm}_r{r}", "metrics.jsonl")) for r in rounds]
    if not runs:
        raise ValueError(f"no runs of arm {arm!r} under {runs_dir}")
    return runs


def _phase_medians(records: list[dict], key: str) -> dict | None:
    """Median per phase of mmtrain's per-step phase times (metrics field `key`)."""
    if not all(key in m for m in records):
        return None
    return {phase: round(statistics.median(m[key][phase] for m in records), 1) for phase in records[0][key]}


def summarize(d: str, arms: list[str]) -> dict:
    """The bench JSON of the arms' runs under d (module doc)."""
    k = json.load(open(os.path.join(d, "bench_meta.json")))
    step_ms, rss_mb, measured = {}, {}, {}
    for arm in arms:
        runs = _arm_runs(d, arm)
        measured[arm] = [m for run in runs for m in _measured(run, k["WARMUP"])]
        step_ms[arm] = statistics.median(m["step_time_ms"] for m in measured[arm])
        rss_mb[arm] = max(m["peak_rss_mb"] for run in runs for m in run)
    torch_arms = [a for a in arms if a.startswith("torch_")]
    best = min(torch_arms, key=lambda a: step_ms[a])
    first = torch_arms[0]
    out = {"mmtrain_step_ms": None, "torch_step_ms": round(step_ms[first], 3), "ratio": None,
           "mmtrain_rss_mb": None, "torch_rss_mb": round(rss_mb[first], 1), "loss_rel_diff": None,
           "torch_arm": first}
    for arm in torch_arms[1:]:
        out[f"{arm}_step_ms"] = round(step_ms[arm], 3)
        out[f"{arm}_rss_mb"] = round(rss_mb[arm], 1)
    out.update(torch_best=best, torch_best_step_ms=round(step_ms[best], 3),
               torch_best_rss_mb=round(rss_mb[best], 1), ratio_vs_best=None, gemm_peak_flops=None,
               flops_per_rank_step=None, ideal_step_ms=None, ideal_fraction=None)
    if "mmtrain" in arms:
        mm = measured["mmtrain"]
        mm_ms = step_ms["mmtrain"]
        # Loss parity of the first rounds, iteration by iteration (warm-up included).
        mm_loss = {m["iteration"]: m["loss"] for m in _arm_runs(d, "mmtrain")[0]}
        torch_first = _arm_runs(d, best)[0]
        common = [m for m in torch_first if m["iteration"] in mm_loss]
        gemm = json.load(open(os.path.join(d, "gemm.json")))["gemm_flops"]
        # tflops_per_device = the model's FLOPs per rank over the step's wall time.
        flops = statistics.median(m["tflops_per_device"] * 1e12 * m["step_time_ms"] / 1000.0 for m in mm)
        ideal_ms = flops / gemm * 1000.0
        out.update(mmtrain_step_ms=round(mm_ms, 3), ratio=round(mm_ms / step_ms[first], 4),
                   mmtrain_rss_mb=round(rss_mb["mmtrain"], 1),
                   loss_rel_diff=mu.curve_rel_diff([mm_loss[m["iteration"]] for m in common],
                                                   [m["loss"] for m in common]),
                   ratio_vs_best=round(mm_ms / step_ms[best], 4), gemm_peak_flops=gemm,
                   flops_per_rank_step=round(flops), ideal_step_ms=round(ideal_ms, 1),
                   ideal_fraction=round(ideal_ms / mm_ms, 4),
                   mmtrain_phases_ms=_phase_medians(mm, "phases_ms"),
                   mmtrain_phases_max_ms=_phase_medians(mm, "phases_max_ms"))
    if "mmtrain_preload" in arms:
        out.update(mmtrain_preload_step_ms=round(step_ms["mmtrain_preload"], 3),
                   mmtrain_preload_rss_mb=round(rss_mb["mmtrain_preload"], 1))
    out["rounds"] = {arm: len(_arm_runs(d, arm)) for arm in arms}
    return out


def main() -> int:
    import argparse
    parser = argparse.ArgumentParser(description="print a bench run's summary JSON line")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--arms", nargs="+", required=True)
    args = parser.parse_args()
    print(json.dumps(summarize(os.path.abspath(args.dir), args.arms), separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
