"""Report: the run's HTML page of tables and plots → <report.path>/<run_id>.html.

With report.trend (`clickeval report --trend`) also the dataset's trend page across its dated runs →
<report.path>/<dataset>-trend.html (clickeval_spark/trend.py)."""

from __future__ import annotations

from clickeval_spark.config import resolve_location
from clickeval_spark.context import StageContext
from clickeval_spark.report_html import build_report, write_text
from clickeval_spark.trend import build_trend


def run(ctx: StageContext) -> str:
    cfg = ctx.cfg
    root = resolve_location(cfg.report.path).rstrip('/')
    target = f"{root}/{ctx.run_id}.html"
    trend_target = f"{root}/{ctx.dataset}-trend.html" if cfg.report.trend else None
    with ctx.record("report") as run:
        page = build_report(ctx, ctx.run_id, ctx.dataset, list(cfg.evaluated_models), list(cfg.evaluate.ndcg_cutoffs))
        write_text(ctx.spark, target, page)
        run.details["path"] = target
        run.counts["bytes"] = len(page.encode("utf-8"))
        if trend_target is not None:
            trend = build_trend(ctx, ctx.dataset, list(cfg.evaluated_models))
            write_text(ctx.spark, trend_target, trend)
            run.details["trend_path"] = trend_target
            run.counts["trend_bytes"] = len(trend.encode("utf-8"))
    print(f"report: {target}")
    if trend_target is not None:
        print(f"trend: {trend_target}")
    return target
