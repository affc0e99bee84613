"""Draws mmtrain's figures with matplotlib; `mmtrain logs plot`, `logs compare --plot` and
`mmtrain ablate` run it. All numbers (parsing, smoothing, differences, noise floors) are computed
by mmtrain (src/tools/plots.cpp); this script only draws what it is given.

Usage: python -P -m mmtrain_py.plots.figures < SPEC.json, where SPEC is
  {"figure": "runs" | "compare" | "ablation", "out": "FILE.png|svg|pdf", "title": "...", ...}
(the fields of each figure are read in its function below). Prints nothing; exits non-zero with
a message on stderr if the figure cannot be drawn.
"""
import json
import math
import os
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402

# The runs panels: (series key, axis label, scale applied to the values).
RUN_PANELS = [
    ("loss", "loss", 1.0),
    ("grad_norm", "grad norm", 1.0),
    ("lr", "learning rate", 1.0),
    ("step_time_ms", "step time (ms)", 1.0),
    ("mfu", "MFU (%)", 100.0),
    ("peak_rss_mb", "peak RSS per rank (MiB)", 1.0),
    ("dp_compute_imbalance", "rank imbalance (max / mean)", 1.0),
    ("budget_fill", "token budget fill (%)", 100.0),
    # A preference objective's (TRL's names, docs/preference.md).
    ("rewards/accuracies", "reward accuracy (%)", 100.0),
    ("rewards/margins", "reward margin", 1.0),
    ("rewards/chosen", "reward of the chosen answers", 1.0),
    ("rewards/rejected", "reward of the rejected answers", 1.0),
    # GRPO's (TRL's names, docs/grpo.md).
    ("reward", "mean reward", 1.0),
    ("kl", "KL to the reference", 1.0),
    ("completions/mean_length", "completion length (tokens)", 1.0),
]


def points(xs, ys, scale=1.0):
    """The (x, y) pairs with a finite y (metrics.jsonl writes NaN losses as null)."""
    pairs = [(x, y * scale) for x, y in zip(xs, ys) if y is not None and math.isfinite(y)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def has(run, key):
    return any(v is not None for v in run["series"].get(key, []))


def draw_validation(ax, series, color, name, style="o--"):
    """A run's held-out eval_loss on a loss panel: markers at the evaluations."""
    if "eval_loss" in series:
        x, y = points(series["eval_iteration"], series["eval_loss"])
        ax.plot(x, y, style, color=color, linewidth=1.2, markersize=4, label=f"{name} validation")


def figure_runs(spec):
    runs = spec["runs"]
    panels = [p for p in RUN_PANELS if any(has(r, p[0]) for r in runs)]
    if any("eval_timesteps" in r["series"] for r in runs):
        panels.insert(1, ("eval_timesteps", "validation loss per timestep", 1.0))
    if not panels:
        raise SystemExit("plot: the runs have no loss, grad norm, lr, step time, MFU or memory to draw")
    # The first run's latest sample (a grid of decoded frames), as a panel of its own after the curves.
    sample = next(((r["name"], r["sample_grid"]) for r in runs if r.get("sample_grid")), None)
    if sample:
        panels.append(("sample_grid", "latest sample", 1.0))
    cols = 3 if len(panels) > 4 else 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, label, scale) in zip(axes.flat, panels):
        if key == "sample_grid":
            name, grid = sample
            ax.imshow(plt.imread(grid["path"]))
            ax.set_title(f"{name}: sample after iteration {grid['iteration']} (frames across the clip)", fontsize=10)
            ax.axis("off")
            continue
        for i, run in enumerate(runs):
            s = run["series"]
            color = colors[i % len(colors)]
            if key == "loss":
                draw_validation(ax, s, color, run["name"])
            if key not in s:
                continue
            if key == "eval_timesteps":
                # One line per fixed timestep (quantile of the training distribution), lighter to later.
                # One run: a color per timestep; several: the run's color, darker to later timesteps.
                names = list(s[key])
                for j, t in enumerate(names):
                    x, y = points(s["eval_iteration"], s[key][t])
                    own = len(runs) == 1
                    ax.plot(x, y, "o-", color=colors[j % len(colors)] if own else color,
                            alpha=1.0 if own else 0.35 + 0.65 * (j + 1) / len(names), markersize=3,
                            linewidth=1.2, label=t if own else f"{run['name']} {t}")
                continue
            x, y = points(s["iteration"], s[key], scale)
            if key == "loss" and "loss_smoothed" in s:
                ax.plot(x, y, color=color, alpha=0.3, linewidth=1)
                xs, ys = points(s["iteration"], s["loss_smoothed"])
                ax.plot(xs, ys, color=color, linewidth=1.8, label=run["name"])
            elif key == "dp_compute_imbalance":
                ax.plot(x, y, color=color, linewidth=1.5, label=run["name"])
                if "dp_work_imbalance" in s:
                    xs, ys = points(s["iteration"], s["dp_work_imbalance"])
                    ax.plot(xs, ys, color=color, linestyle="--", linewidth=1.2)
            elif key == "step_time_ms" and s.get("warmup", 0) > 0:
                warm = s["warmup"]
                # Dotted up to the first steady iteration, solid from there.
                ax.plot(x[:warm + 1], y[:warm + 1], color=color, linestyle=":", linewidth=1.2)
                ax.plot(x[warm:], y[warm:], color=color, linewidth=1.5, label=run["name"])
            else:
                ax.plot(x, y, color=color, linewidth=1.5, label=run["name"])
        ax.set_xlabel("iteration")
        ax.set_ylabel(label)
        title = label
        if key == "loss" and spec.get("smoothing"):
            title += f" (thin: raw, thick: EMA {spec['smoothing']:g})"
        if key == "loss" and any("eval_loss" in r["series"] for r in runs):
            title += "\n(markers: held-out validation loss)"
        if key == "eval_timesteps":
            ax.legend(fontsize=7)
        if key == "dp_compute_imbalance":
            title += " (solid: compute, dashed: work)"
        if key == "step_time_ms" and spec.get("skip_first"):
            title += f" (dotted: first {spec['skip_first']} warm-up)"
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        if key == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=9)
    finish(fig, spec)


def figure_compare(spec):
    a, b = spec["a"], spec["b"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    ax = axes[0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (run, style) in enumerate(((a, "-"), (b, "--"))):
        x, y = points(run["iteration"], run["loss"])
        ax.plot(x, y, style, color=colors[i], linewidth=1.5, label=run["name"])
        draw_validation(ax, run, colors[i], run["name"], "o" + style)
    ax.set_title("loss" + (" (markers: validation)" if "eval_loss" in a or "eval_loss" in b else ""), fontsize=10)
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss")
    ax.legend(fontsize=9)

    ax = axes[1]
    x, y = points(spec["common_iteration"], spec["loss_difference"])
    ax.plot(x, y, color="tab:red", linewidth=1.2)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_title(f"loss difference {a['name']} - {b['name']}\n(sum|a-b|/sum|b| = {spec['loss_rel_diff']})",
                 fontsize=10)
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss difference")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))

    ax = axes[2]
    for run, style in ((a, "-"), (b, "--")):
        x, y = points(run["steady_iteration"], run["steady_step_time_ms"])
        if x:
            ax.plot(x, y, style, linewidth=1.2, label=f"{run['name']} (median {run['step_time_median']:.1f} ms)")
    ax.set_title(f"step time after {spec['skip_first']} warm-up iterations", fontsize=10)
    ax.set_xlabel("iteration")
    ax.set_ylabel("step time (ms)")
    ax.legend(fontsize=9)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    finish(fig, spec)


def figure_ablation(spec):
    features = spec["features"]
    names = [f["name"] for f in features]
    panels = [("loss_rel_diff", "normalized loss difference vs control, sum|a-b|/sum|b|", False),
              ("allocated_change_pct", "allocated peak change vs control (%)", True),
              ("rss_change_pct", "peak RSS change vs control (%, not judged)", True),
              ("step_time_change_pct", "median step time change vs control (%)", True)]
    fig, axes = plt.subplots(2, 2, figsize=(14, 2.6 + 1.1 * max(2, len(names))), squeeze=False)
    for ax, (key, label, signed) in zip(axes.flat, panels):
        values = [f[key] for f in features]
        inside = [f["inside_noise"][key] for f in features]
        colors = ["lightsteelblue" if i is None else "tab:gray" if i else "tab:blue" for i in inside]
        ax.barh(names, values, color=colors)
        noise = spec["noise"][key]
        if noise is not None:
            low = -noise if signed else 0.0
            ax.axvspan(low, max(noise, 1e-300), color="tab:orange", alpha=0.2,
                       label=f"noise floor (control repeats): {noise:.3g}")
            ax.legend(fontsize=8, loc="best")
        if signed:
            ax.axvline(0, color="black", linewidth=0.8)
        ax.set_title(label, fontsize=10)
        ax.invert_yaxis()
        ax.grid(True, axis="x", alpha=0.3)
        for y, v in enumerate(values):
            ax.annotate(f"{v:.3g}", (v, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    axes.flat[0].set_xscale("symlog", linthresh=spec.get("loss_linthresh", 1e-6))
    fig.text(0.01, 0.005, "grey: inside the noise floor; blue: outside it; light blue: not judged (no floor)",
             fontsize=8)
    finish(fig, spec)


def finish(fig, spec):
    if spec.get("title"):
        fig.suptitle(spec["title"], fontsize=11)
    fig.tight_layout()
    save_no_follow(fig, spec["out"])


def save_no_follow(fig, out):
    """The figure goes to a file of its own, created new beside `out` (never through a link), then
    renamed over `out`; a symlink at `out` is refused (it would write where the link points)."""
    if os.path.islink(out):
        sys.exit(f"plot: refused: {out} is a symlink (figures are written in place, never through a link)")
    directory, name = os.path.split(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=os.path.splitext(name)[1], dir=directory)
    try:
        with os.fdopen(fd, "wb") as stream:
            fig.savefig(stream, dpi=110, format=os.path.splitext(name)[1][1:] or "png")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise


FIGURES = {"runs": figure_runs, "compare": figure_compare, "ablation": figure_ablation}


def main():
    spec = json.load(sys.stdin)
    if spec.get("figure") not in FIGURES:
        raise SystemExit(f"plot: unknown figure {spec.get('figure')!r}; known: {', '.join(FIGURES)}")
    FIGURES[spec["figure"]](spec)


if __name__ == "__main__":
    main()
