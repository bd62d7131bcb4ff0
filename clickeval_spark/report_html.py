"""A self-contained HTML report of one run, drawn from the result tables alone.

Reads the run's rows of `metrics` and `distributional_metrics` (a few hundred
global numbers, never per-SERP data) and writes one HTML page with the metrics
table and matplotlib figures (report_figures.py) inlined as PNG data URIs, so the
file can be mailed or attached to a ticket as it is.
"""

from __future__ import annotations

import html
import json
import math
from datetime import datetime, timezone

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from clickeval_spark.context import StageContext
from clickeval_spark.metrics.distributional import CROSS_FITTED, REAL_LOG
from clickeval_spark.metrics.summary import HEADLINE
from clickeval_spark.fitted.params_io import KIND_PREFIX, PRIOR_PREFIX, STRENGTH_PREFIX
from clickeval_spark.report_figures import coverage_figure, metric_row, ndcg_figure, ppl_by_rank_figure
from clickeval_spark.sources.synthetic import TRUTH_MODEL
from clickeval_spark.spark_internals import write_text_file


def _cell(r: dict | None) -> str:
    if r is None or r["value"] is None:
        return "<td>–</td>"
    if r["ci_low"] is None:
        return f"<td>{r['value']:.4f}</td>"
    return f"<td>{r['value']:.4f}<br><small>[{r['ci_low']:.4f}, {r['ci_high']:.4f}]</small></td>"


def metrics_html(rows: list[dict], models: list[str], split: str) -> str:
    head = "".join(f"<th>{m}{'@' + str(c) if c else ''}</th>" for m, c in HEADLINE)
    body = "".join(
        f"<tr><th>{html.escape(m)}</th>{''.join(_cell(metric_row(rows, m, split, metric, c)) for metric, c in HEADLINE)}</tr>"
        for m in models)
    return f"<table><tr><th>model</th>{head}</tr>{body}</table>"


def diffs_html(rows: list[dict], split: str) -> str:
    diffs = [r for r in rows if r["reference_model"] and r["split"] == split]
    if not diffs:
        return ""
    lines = "".join(
        f"<tr><td>{html.escape(r['model'])}</td><td>{html.escape(r['metric'])}{'@' + str(r['cutoff']) if r['cutoff'] else ''}</td>"
        f"<td>{r['value']:+.4f}</td><td>[{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]</td>"
        f"<td>{'yes' if r['ci_low'] > 0 or r['ci_high'] < 0 else 'no'}</td></tr>"
        for r in sorted(diffs, key=lambda r: (r["metric"], r["cutoff"] or 0, r["model"])) if r["value"] is not None)
    ref = html.escape(diffs[0]["reference_model"])
    return (f"<h2>Paired differences against {ref}</h2><p>model minus {ref} on the same SERPs, 95% paired "
            f"session-bootstrap interval; 'clear' when the interval excludes 0.</p>"
            f"<table><tr><th>model</th><th>metric</th><th>difference</th><th>95% interval</th><th>clear</th></tr>{lines}</table>")


def coverage_html(dist: list[dict]) -> str:
    lines = "".join(
        f"<tr><td>{html.escape(d['generator_model'])}</td><td>{d['variant']}</td><td>{_num(d['reverse_ppl'])}</td>"
        f"<td>{_num(d['forward_ppl'])}</td><td>{d['n_synthetic']}</td><td>{d['n_real']}</td></tr>"
        for d in sorted(dist, key=lambda d: (d["list_order"], d["click_mode"], d["generator_model"])))
    return ("<table><tr><th>generator</th><th>list order / click mode</th><th>Reverse PPL</th><th>Forward PPL</th>"
            f"<th>synthetic SERPs</th><th>real SERPs</th></tr>{lines}</table>")


def priors_html(params: list[dict], fits: list[dict], models: list[str]) -> str:
    """One line per fitted model: the estimator (prior kind, k and m per family) and the k choice."""
    chosen = {}
    for f in fits:
        details = json.loads(f["details"] or "{}")
        sel = details.get("prior_selection")
        if sel:
            # a candidate successive halving stopped: its valid LL at that iteration
            grid = ", ".join(f"{_strength(g['k'], g.get('seen_means'))}: {_num(g['valid_ll'])}"
                             + (f" (out after iteration {g['dropped_at']})" if "dropped_at" in g else "")
                             for g in sel["grid"])
            strength = _strength(sel['chosen_k'], sel.get('chosen_seen_means'))
            reused = sel.get("reused")   # a daily run's reuse of a recent choice (fit.prior.reuse)
            chosen[f["job"].split(":", 1)[1]] = (
                f"{strength} reused from run {reused['run_id']} (valid LL {_num(reused['valid_ll_now'])}, "
                f"then {_num(reused['valid_ll_then'])})" if reused else f"{strength} of {{{grid}}}")
    by_model: dict[str, dict] = {}
    for r in params:
        spec = by_model.setdefault(r["model"], {"kind": "", "k": {}, "m": {}})
        param = r["param"]
        if param.startswith(KIND_PREFIX):
            spec["kind"] = param[len(KIND_PREFIX):]
        elif param.startswith(STRENGTH_PREFIX):
            spec["k"][param[len(STRENGTH_PREFIX):]] = r["value"]
        elif r["rank"] is None:
            spec["m"][param[len(PRIOR_PREFIX):]] = f"{r['value']:.4f}"
        else:   # a mean per rank (UBM's examination cells; a qd family's value for unseen pairs by rank)
            spec["m"].setdefault(param[len(PRIOR_PREFIX):], "its rank's mean")
    lines = []
    for m in [m for m in models if m in by_model] + sorted(set(by_model) - set(models)):
        spec = by_model[m]
        fams = ", ".join(f"{f}: k={spec['k'][f]:g}" + (f", m={spec['m'][f]}" if f in spec["m"] else "")
                         for f in sorted(spec["k"]))
        lines.append(f"<tr><td>{html.escape(m)}</td><td>{html.escape(spec['kind'])}</td><td>{html.escape(fams)}</td>"
                     f"<td>{html.escape(chosen.get(m, '–'))}</td></tr>")
    if not lines:
        return ""
    return ("<h2>Estimators</h2><p>Every M-step is the posterior mode (num + k·m) / (den + k) of the family's "
            "Beta prior (k = 0: the plain ratio); (query, doc) pairs unseen in training get their family's "
            "pooled mean at the rank they are shown at (eb: each family's strength by empirical Bayes).</p>"
            "<table><tr><th>model</th><th>prior</th><th>families (k, m)</th>"
            f"<th>strength chosen by valid LL per position</th></tr>{''.join(lines)}</table>")


def _strength(k: float | str, seen_means: str | None = None) -> str:
    """A candidate of the prior selection: its strength (or eb), and "/rank" when seen pairs shrank toward
    their ranks' means."""
    return (f"k = {k:g}" if isinstance(k, (int, float)) else str(k)) + ("/rank" if seen_means == "rank" else "")


def _num(v: float | None) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"


def run_windows(ctx: StageContext, run_id: str) -> dict[str, dict | None]:
    """{job: the log_date window it read (None: the whole dataset)} for the run's jobs after ingest,
    from their `runs` rows (a few dozen rows of one run)."""
    rows = ctx.collected("runs", F.col("run_id") == run_id, ["job", "details"])
    windows = {}
    for r in rows:
        details = json.loads(r["details"]) if r["details"] else {}
        if "window" in details and r["job"] != "report":
            windows[r["job"]] = details["window"]
    return windows


def window_html(windows: dict[str, dict | None]) -> str:
    """One line naming the log days the run's numbers come from; every window when the stages differ."""
    def shown(w: dict | None) -> str:
        return ("the whole dataset (every log_date)" if w is None else
                f"log_date {html.escape(str(w['start']))} to {html.escape(str(w['end']))} (both inclusive)")

    distinct = {json.dumps(w, sort_keys=True): w for w in windows.values()}
    if not distinct:
        return ""
    if len(distinct) == 1:
        return f"<p>Window: {shown(next(iter(distinct.values())))}.</p>"
    lines = "".join(f"<li>{html.escape(job)}: {shown(w)}</li>" for job, w in sorted(windows.items()))
    return f"<p><b>The stages of this run read different windows:</b></p><ul>{lines}</ul>"


STYLE = """body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right;font-size:13px}th{background:#f4f4f4}
small{color:#666}img{max-width:100%}"""


def build_report(ctx: StageContext, run_id: str, dataset: str, models: list[str], cutoffs: list[int]) -> str:
    """The HTML page for one run and dataset, from the tables `ctx` reads."""
    def rows_of(name: str, condition=None) -> list[dict]:
        condition = F.col("dataset") == dataset if condition is None else condition
        return ctx.collected(name, (F.col("run_id") == run_id) & condition)

    rows, dist = rows_of("metrics"), rows_of("distributional_metrics")

    # the prior rows only: a few per model, never the per-(query, doc) values
    params = rows_of("model_params", F.col("param").startswith(PRIOR_PREFIX) & F.col("query_id").isNull())
    fits = rows_of("runs", F.col("job").startswith("fit:") & (F.col("dataset") == dataset))
    present = {r["model"] for r in rows}
    models = [m for m in models if m in present] + sorted(present - set(models))
    sections = [f"<h1>clickeval-spark report</h1><p>run <b>{html.escape(run_id)}</b>, dataset "
                f"<b>{html.escape(dataset)}</b>, generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC from the "
                f"<code>metrics</code> and <code>distributional_metrics</code> tables.</p>",
                window_html(run_windows(ctx, run_id))]
    for split in sorted({r["split"] for r in rows}):
        sections.append(f"<h2>Click prediction and relevance estimation ({html.escape(split)} split)</h2>"
                        "<p>Value and 95% session-bootstrap interval. LL: mean per-position log-likelihood "
                        "(higher is better); PPL: mean of PPL@rank (lower is better).</p>")
        sections.append(metrics_html(rows, models, split))
        if TRUTH_MODEL in models:
            sections.append(f"<p><b>{TRUTH_MODEL}</b>: the click model this log was simulated from, with its true "
                            f"parameters (<code>model_params</code> run <code>truth-{html.escape(dataset)}</code>): "
                            "the numbers a perfect fit would get on these SERPs.</p>")
        sections.append(ppl_by_rank_figure(rows, models, split))
        ndcg = ndcg_figure(rows, models, split, cutoffs)
        if ndcg:
            sections.append(f"<h3>NDCG@k against the labels ({html.escape(split)})</h3>{ndcg}")
        sections.append(diffs_html(rows, split))
    sections.append(priors_html(params, fits, models))
    if dist:
        sections.append("<h2>Distributional coverage (Reverse / Forward PPL)</h2>")
        if any(d["generator_model"] == REAL_LOG and d["click_mode"] == CROSS_FITTED for d in dist):
            sections.append("<p>The real log's reference is out of sample: the surrogate fitted on one half of the "
                            "real sessions (a seeded hash) and scored on the other half, and the reverse "
                            "(<code>real_log</code> rows <code>fit_a_score_b</code>, <code>fit_b_score_a</code>; "
                            "<code>cross_fitted</code> pools both, the solid lines). <code>observed</code> is "
                            "the surrogate fitted and scored on the same real SERPs (in sample, dashed).</p>")
        figure = coverage_figure(dist)
        if figure:
            sections.append(figure)
        sections.append(coverage_html(dist))
    if not rows and not dist:
        sections.append("<p>No metrics for this run yet: run evaluate (and generate, surrogate) first.</p>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>clickeval {html.escape(run_id)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(sections)}</body></html>")


def write_text(spark: SparkSession, uri: str, text: str) -> None:
    """Write a small text file to any Hadoop file system URI (local path, file:, s3a:, abfss:, ...)."""
    write_text_file(spark, uri, text)
