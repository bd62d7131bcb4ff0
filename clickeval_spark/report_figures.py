"""The report's figures (matplotlib, inlined as PNG data URIs): PPL by rank, NDCG@k, and the Reverse vs
Forward PPL coverage chart, from the collected rows of `metrics` and `distributional_metrics`."""

from __future__ import annotations

import base64
import io

import numpy as np

from clickeval_spark.metrics.distributional import A_ON_B, B_ON_A, CROSS_FITTED, IN_SAMPLE, REAL_LOG
from clickeval_spark.sources.synthetic import TRUTH_MODEL

ORDER_MARKERS = {"original": "o", "shuffled_all": "s", "shuffled_halves": "^"}


def pyplot():
    """matplotlib's pyplot on the Agg backend, imported when a figure is drawn: every stage's driver imports
    this module (through the CLI), and only the report draws; the import is most of a second of CPU."""
    import matplotlib

    matplotlib.use("Agg")  # no display on executors, CI or servers
    import matplotlib.pyplot as plt

    return plt


def inline_png(fig) -> str:
    """The figure as an <img> tag with the PNG inline (a data URI), closed after."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return f'<img alt="" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def metric_row(rows: list[dict], model: str, split: str, metric: str, cutoff: int | None) -> dict | None:
    """The row of one (model, split, metric, cutoff), not a paired difference; None when the run has none."""
    for r in rows:
        if (r["model"], r["split"], r["metric"], r["cutoff"], r["reference_model"]) == (model, split, metric, cutoff, None):
            return r
    return None


def ppl_by_rank_figure(rows: list[dict], models: list[str], split: str) -> str:
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, metric, title in ((axes[0], "PPL", "PPL@rank (p_click, unconditional)"),
                              (axes[1], "PPL_cond", "PPL@rank (p_click_cond, conditional)")):
        for model in models:
            points = sorted((r["cutoff"], r["value"], r["ci_low"], r["ci_high"]) for r in rows
                            if r["model"] == model and r["split"] == split and r["metric"] == metric
                            and r["cutoff"] is not None and r["reference_model"] is None)
            if not points:
                continue
            t, v, lo, hi = (np.array(x, dtype=float) for x in zip(*points))
            # the true model of a simulated log: the floor the fitted models approach, in black
            style = dict(color="black", ls="--") if model == TRUTH_MODEL else {}
            ax.plot(t, v, marker="o", ms=3, label=model, **style)
            ax.fill_between(t, lo, hi, alpha=0.12, **({"color": "black"} if style else {}))
        ax.set_title(title)
        ax.set_xlabel("rank")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("perplexity (lower is better)")
    # on the right panel, or the left when the right has no line (no conditional PPL in the run)
    legend_ax = next((ax for ax in axes[::-1] if ax.get_legend_handles_labels()[0]), None)
    if legend_ax is not None:
        legend_ax.legend(fontsize=8, ncol=2)
    return inline_png(fig)


def ndcg_figure(rows: list[dict], models: list[str], split: str, cutoffs: list[int]) -> str | None:
    ranked = [m for m in models if metric_row(rows, m, split, "NDCG", cutoffs[0])]
    if not ranked:
        return None
    fig, ax = pyplot().subplots(figsize=(11, 4))
    width = 0.8 / len(cutoffs)
    x = np.arange(len(ranked))
    for i, k in enumerate(cutoffs):
        cells = [metric_row(rows, m, split, "NDCG", k) for m in ranked]
        at = x + (i - (len(cutoffs) - 1) / 2) * width
        ax.bar(at, [c["value"] for c in cells], width, label=f"NDCG@{k}")
        # the interval as it is: a percentile bootstrap interval need not hold the point estimate (few
        # replicates, a skewed statistic), so it is not drawn as +- error around the bar
        ax.vlines(at, [c["ci_low"] for c in cells], [c["ci_high"] for c in cells], colors="black", linewidth=1)
    ax.set_xticks(x, ranked)
    ax.set_ylim(0, 1)
    ax.set_ylabel("NDCG (higher is better), 95% interval")
    ax.legend(fontsize=8, ncol=len(cutoffs), loc="upper center", bbox_to_anchor=(0.5, -0.08))
    ax.grid(axis="y", alpha=0.3)
    return inline_png(fig)


HALVES = (A_ON_B, B_ON_A)


def coverage_figure(dist: list[dict]) -> str | None:
    """The Reverse-vs-Forward PPL chart as an inline PNG (None without a generator's point)."""
    plot = coverage_plot(dist)
    return None if plot is None else inline_png(plot[0])


def coverage_plot(dist: list[dict]):
    """(figure, axes) of the coverage chart: a point per generator variant, the real log's out-of-sample
    reference as solid lines (and its two halves as points), the in-sample one dashed."""
    points = [d for d in dist if d["generator_model"] != REAL_LOG and d["reverse_ppl"] and d["forward_ppl"]]
    if not points:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 6))
    generators = sorted({d["generator_model"] for d in points})
    colours = {g: plt.cm.tab10(i % 10) for i, g in enumerate(generators)}
    for d in points:
        ax.scatter(d["forward_ppl"], d["reverse_ppl"], color=colours[d["generator_model"]],
                   marker=ORDER_MARKERS.get(d["list_order"], "x"), s=40,
                   facecolors="none" if d["click_mode"] == "deterministic" else None)
    for g in generators:
        ax.scatter([], [], color=colours[g], marker="o", label=g)
    for order, marker in ORDER_MARKERS.items():
        ax.scatter([], [], facecolors="none", edgecolors="black", marker=marker, label=order)
    real = {d["click_mode"]: d for d in dist if d["generator_model"] == REAL_LOG and d["reverse_ppl"]}
    cross = real.get(CROSS_FITTED)
    if cross:
        # the fair reference: every real SERP scored by a surrogate fitted on the other half of the sessions
        ax.axhline(cross["reverse_ppl"], color="black", lw=1.2, label="real log, out of sample (2 halves)")
        ax.axvline(cross["forward_ppl"], color="black", lw=1.2)
        halves = [real[m] for m in HALVES if m in real and real[m]["forward_ppl"]]
        if halves:
            ax.scatter([d["forward_ppl"] for d in halves], [d["reverse_ppl"] for d in halves], color="black",
                       marker="x", s=50, label="one real half as the generator")
    if IN_SAMPLE in real:
        ax.axhline(real[IN_SAMPLE]["reverse_ppl"], color="grey" if cross else "black", lw=0.8, ls="--",
                   label="real log, in sample" if cross else "surrogate on the real log")
        ax.axvline(real[IN_SAMPLE]["forward_ppl"], color="grey" if cross else "black", lw=0.8, ls="--")
    ax.set_xlabel("Forward PPL (surrogate fitted on real, scored on synthetic)")
    ax.set_ylabel("Reverse PPL (surrogate fitted on synthetic, scored on real)")
    ax.set_title(f"Distributional coverage, surrogate {points[0]['surrogate_model']} (lower-left is better)")
    ax.legend(fontsize=8, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    return fig, ax
