"""A dataset's trend page: how each model's LL, PPL and NDCG@10 move across its daily runs.

Scheduled runs evaluate one log_date window each; the run page shows one run, so nothing shows a model
getting worse from one day to the next. This page places every run at the end of its window (from its
`evaluate` row in `runs`) and plots each model's numbers with their 95% intervals day by day, marking a day
whose interval does not overlap the previous run's. It reads only the small `metrics` and `runs` tables.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Iterable, Mapping, Sequence

from pyspark.sql import functions as F

from clickeval_spark.context import StageContext
from clickeval_spark.report_figures import inline_png, pyplot
from clickeval_spark.report_html import STYLE

# (metric, cutoff, label) of each panel, in panel order; NDCG@10's panel is left out when a model has none
PANELS = (("LL", None, "LL"), ("PPL", None, "PPL"), ("NDCG", 10, "NDCG@10"))
DIRECTION = {"LL": "higher is better", "PPL": "total PPL, lower is better", "NDCG@10": "higher is better"}
# the split plotted when none is asked for: test if the runs have it, else the first present in this order
SPLIT_PREFERENCE = ("test", "valid", "train")


@dataclass(frozen=True)
class Point:
    """One run's value of one (model, metric), with its 95% interval; `shifted`: the interval does not
    overlap the one of the previous point of the same series."""
    window_end: date
    run_id: str
    value: float
    ci_low: float | None
    ci_high: float | None
    shifted: bool = False


@dataclass(frozen=True)
class DatedRun:
    window_end: date
    run_id: str
    finished_at: datetime


@dataclass
class Trend:
    """What the page shows, from the collected rows (trend_series)."""
    split: str | None
    runs: list[DatedRun]                              # the plotted runs, by window end
    series: dict[tuple[str, str], list[Point]]        # (model, panel label) -> points by window end
    missing_days: list[date]                          # days between the first and last window end without a run
    undated: list[str] = field(default_factory=list)  # evaluated the whole dataset: no day to place them at
    superseded: list[tuple[date, str, str]] = field(default_factory=list)  # (window end, dropped, kept)
    unrecorded: list[str] = field(default_factory=list)  # metrics rows but no succeeded evaluate of the dataset


def intervals_disjoint(a: Point, b: Point) -> bool:
    """True when both intervals are known and do not overlap (touching endpoints overlap)."""
    if None in (a.ci_low, a.ci_high, b.ci_low, b.ci_high):
        return False
    return b.ci_low > a.ci_high or b.ci_high < a.ci_low


def days_without_run(ends: Iterable[date]) -> list[date]:
    """Every calendar day from the first to the last window end that no run ends on."""
    have = set(ends)
    if not have:
        return []
    first, last = min(have), max(have)
    return [first + timedelta(days=i) for i in range((last - first).days + 1)
            if first + timedelta(days=i) not in have]


def choose_split(splits: Iterable[str]) -> str | None:
    present = set(splits)
    return next((s for s in SPLIT_PREFERENCE if s in present), min(present, default=None))


def _window_end(details: str | Mapping | None) -> date | None:
    """The end of the window an evaluate job read; None: the whole dataset (or no window recorded)."""
    parsed = json.loads(details) if isinstance(details, str) else (details or {})
    window = parsed.get("window")
    return date.fromisoformat(str(window["end"])[:10]) if window else None


def _marked(points: list[Point]) -> list[Point]:
    """The points with `shifted` set against their predecessor in the series."""
    out: list[Point] = []
    for p in points:
        out.append(Point(p.window_end, p.run_id, p.value, p.ci_low, p.ci_high,
                         bool(out) and intervals_disjoint(out[-1], p)))
    return out


def trend_series(metric_rows: Iterable[Mapping], run_rows: Iterable[Mapping], split: str | None = None) -> Trend:
    """Collected `metrics` rows of one dataset and its `runs` rows of job `evaluate` → the Trend.

    A run is plotted when it has metrics rows on `split` (default: choose_split of the rows' splits) and a
    succeeded evaluate whose details carry a window; two runs with one window end: the later finished_at."""
    metric_rows = [r for r in metric_rows if r.get("reference_model") is None]
    split = split or choose_split(r["split"] for r in metric_rows)
    rows = [r for r in metric_rows if r["split"] == split]
    with_metrics = {r["run_id"] for r in rows}
    evaluated = {r["run_id"]: r for r in run_rows if r["status"] == "succeeded" and r["run_id"] in with_metrics}

    by_end: dict[date, list[DatedRun]] = {}
    undated = []
    for run_id, r in sorted(evaluated.items()):
        end = _window_end(r["details"])
        if end is None:
            undated.append(run_id)
        else:
            by_end.setdefault(end, []).append(DatedRun(end, run_id, r["finished_at"]))
    runs, superseded = [], []
    for end in sorted(by_end):
        keep = max(by_end[end], key=lambda run: (run.finished_at, run.run_id))
        runs.append(keep)
        superseded += [(end, run.run_id, keep.run_id) for run in by_end[end] if run is not keep]

    at = {run.run_id: run.window_end for run in runs}
    series: dict[tuple[str, str], list[Point]] = {}
    for metric, cutoff, label in PANELS:
        for r in rows:
            if r["run_id"] in at and r["metric"] == metric and r["cutoff"] == cutoff and r["value"] is not None:
                series.setdefault((r["model"], label), []).append(
                    Point(at[r["run_id"]], r["run_id"], r["value"], r["ci_low"], r["ci_high"]))
    series = {key: _marked(sorted(points, key=lambda p: p.window_end)) for key, points in sorted(series.items())}
    return Trend(split=split, runs=runs, series=series, missing_days=days_without_run(at.values()),
                 undated=sorted(undated), superseded=sorted(superseded),
                 unrecorded=sorted(with_metrics - set(evaluated)))


def trend_figure(model: str, panels: Mapping[str, list[Point]], missing_days: Sequence[date] = ()) -> str:
    """One model's panels side by side (LL, PPL, NDCG@10 when present): value per window end, its 95%
    interval as a bar, shifted days in red, days without a run as dotted lines. An <img> with the PNG inlined."""
    from matplotlib import dates as mdates

    labels = [label for _, _, label in PANELS if panels.get(label)]
    fig, axes = pyplot().subplots(1, len(labels), figsize=(4.2 * len(labels), 3.4), squeeze=False)
    for ax, label in zip(axes[0], labels):
        points = panels[label]
        x = [p.window_end for p in points]
        ax.plot(x, [p.value for p in points], color="tab:blue", marker="o", ms=4, lw=1)
        bars = [p for p in points if p.ci_low is not None and p.ci_high is not None]
        # the percentile interval as it is (it need not hold the value): a bar from ci_low to ci_high
        ax.vlines([p.window_end for p in bars], [p.ci_low for p in bars], [p.ci_high for p in bars],
                  colors="tab:blue", alpha=0.5, lw=3, label="95% interval")
        for i, day in enumerate(missing_days):
            ax.axvline(day, color="grey", lw=0.8, ls=":", label="no run" if i == 0 else None)
        shifted = [p for p in points if p.shifted]
        if shifted:
            ax.scatter([p.window_end for p in shifted], [p.value for p in shifted], color="red", s=60, zorder=3,
                       label="shift: no overlap with the previous run")
        ax.set_title(f"{model}: {label} ({DIRECTION[label]})", fontsize=10)
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d"))
        if len(set(x)) <= 12:
            ax.set_xticks(sorted(set(x)))
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        ax.set_xlabel("window end")
        ax.grid(alpha=0.3)
    legend = {}   # one legend under the panels, each entry once
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.tight_layout()
    fig.legend(legend.values(), legend.keys(), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(legend),
               fontsize=8, frameon=False)
    return inline_png(fig)


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:.4f}"


def _interval(p: Point) -> str:
    return "–" if p.ci_low is None or p.ci_high is None else f"[{_num(p.ci_low)}, {_num(p.ci_high)}]"


def _numbers_html(model: str, panels: Mapping[str, list[Point]]) -> str:
    lines = "".join(
        f"<tr><td>{label}</td><td>{p.window_end.isoformat()}</td><td>{html.escape(p.run_id)}</td>"
        f"<td>{_num(p.value)}</td><td>{_interval(p)}</td>"
        f"<td>{'<b class=shift>shift</b>' if p.shifted else '–'}</td></tr>"
        for _, _, label in PANELS for p in panels.get(label, []))
    return (f"<table><tr><th>metric</th><th>window end</th><th>run_id</th><th>value</th><th>95% interval</th>"
            f"<th>marked</th></tr>{lines}</table>")


def _shifts_html(trend: Trend, models: Sequence[str]) -> str:
    items = []
    for model in models:
        for _, _, label in PANELS:
            points = trend.series.get((model, label), [])
            for prev, p in zip(points, points[1:]):
                if p.shifted:
                    items.append(
                        f"<li>{p.window_end.isoformat()}: <b>{html.escape(model)} {label}</b> {_num(p.value)} "
                        f"{_interval(p)} ({html.escape(p.run_id)}), previous run {prev.window_end.isoformat()}: "
                        f"{_num(prev.value)} {_interval(prev)} ({html.escape(prev.run_id)})</li>")
    if not items:
        return "<h2>Marked days</h2><p>None: every interval overlaps the previous run's.</p>"
    return ("<h2>Marked days</h2><p>The 95% interval does not overlap the previous plotted run's interval of "
            f"the same model and metric.</p><ul>{''.join(items)}</ul>")


def _notes_html(trend: Trend) -> str:
    notes = []
    if trend.undated:
        notes.append("Runs that evaluated the whole dataset (no window), listed but not plotted (they belong to "
                     f"no day): {html.escape(', '.join(trend.undated))}.")
    for end, dropped, kept in trend.superseded:
        notes.append(f"{html.escape(dropped)} and {html.escape(kept)} both end on {end.isoformat()}: "
                     f"{html.escape(kept)} (its evaluate finished later) is plotted, {html.escape(dropped)} is not.")
    if trend.unrecorded:
        notes.append("Runs with metrics rows but no succeeded evaluate of this dataset in <code>runs</code>, not "
                     f"plotted: {html.escape(', '.join(trend.unrecorded))}.")
    return "".join(f"<p class=note>{n}</p>" for n in notes)


def trend_page(trend: Trend, dataset: str, models: Sequence[str] = ()) -> str:
    """The HTML page of a Trend: runs, notes, days without a run, marked days, then per model its figure
    and its numbers (models in the order given, then any other by name)."""
    present = {model for model, _ in trend.series}
    models = [m for m in models if m in present] + sorted(present - set(models))
    split = html.escape(trend.split or "–")
    sections = [f"<h1>clickeval-spark trend: {html.escape(dataset)}</h1><p>Every run of dataset "
                f"<b>{html.escape(dataset)}</b> with a window, placed at its window end, {split} split; generated "
                f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC from the <code>metrics</code> and <code>runs</code> "
                "tables. Each value carries its 95% session-bootstrap interval; a day is marked (red) when its "
                "interval does not overlap the previous run's.</p>"]
    runs = "".join(f"<li>{r.window_end.isoformat()}: {html.escape(r.run_id)}</li>" for r in trend.runs)
    sections.append(f"<h2>Runs by window end</h2><ul>{runs}</ul>" if runs else "")
    sections.append(_notes_html(trend))
    if len(trend.runs) < 2:
        sections.append(f"<p><b>Fewer than two dated runs of dataset {html.escape(dataset)} ({len(trend.runs)} "
                        "found): there is no trend to show yet.</b> A run counts once its evaluate succeeded on a "
                        "log_date window (a run over the whole dataset belongs to no day).</p>")
    missing = "".join(f"<li>{d.isoformat()}</li>" for d in trend.missing_days)
    sections.append(f"<h2>Days without a run</h2><ul>{missing}</ul>" if missing else
                    "<h2>Days without a run</h2><p>None between the first and the last window end.</p>")
    if len(trend.runs) >= 2:
        sections.append(_shifts_html(trend, models))
    for model in models:
        panels = {label: trend.series.get((model, label), []) for _, _, label in PANELS}
        sections.append(f"<h2>{html.escape(model)}</h2>")
        if len(trend.runs) >= 2:
            sections.append(trend_figure(model, panels, trend.missing_days))
        sections.append(_numbers_html(model, panels))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>clickeval trend {html.escape(dataset)}</title>"
            f"<style>{STYLE}.shift{{color:#c00}}.note{{color:#555}}</style></head><body>{''.join(sections)}"
            "</body></html>")


def read_trend_rows(ctx: StageContext, dataset: str) -> tuple[list[dict], list[dict]]:
    """The dataset's metrics rows of the plotted metrics (no paired differences) and its `evaluate` rows of
    `runs`, collected: both tables hold a few rows per run. Missing tables give no rows."""
    def rows(name: str, condition, columns: list[str]) -> list[dict]:
        return ctx.collected(name, (F.col("dataset") == dataset) & condition, columns)

    panel = F.lit(False)
    for metric, cutoff, _ in PANELS:
        panel |= (F.col("metric") == metric) & (F.col("cutoff").isNull() if cutoff is None else F.col("cutoff") == cutoff)
    metrics = rows("metrics", panel & F.col("reference_model").isNull(),
                   ["run_id", "model", "split", "metric", "cutoff", "value", "ci_low", "ci_high", "reference_model"])
    runs = rows("runs", F.col("job") == "evaluate", ["run_id", "status", "finished_at", "details"])
    return metrics, runs


def build_trend(ctx: StageContext, dataset: str, models: Sequence[str] = (), split: str | None = None) -> str:
    """The trend page of one dataset, from the metrics and runs tables."""
    metrics, runs = read_trend_rows(ctx, dataset)
    return trend_page(trend_series(metrics, runs, split), dataset, models)
