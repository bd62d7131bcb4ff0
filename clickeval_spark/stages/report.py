"""Report: the run's HTML page of tables and plots → <report.path>/<run_id>.html."""

from __future__ import annotations

from clickeval_spark.config import resolve_location
from clickeval_spark.context import StageContext
from clickeval_spark.report import build_report, write_text


def run(ctx: StageContext) -> str:
    cfg = ctx.cfg
    target = f"{resolve_location(cfg.report.path).rstrip('/')}/{ctx.run_id}.html"
    with ctx.record("report") as run:
        page = build_report(ctx.spark, ctx.warehouse, ctx.run_id, ctx.dataset, list(cfg.evaluated_models),
                            list(cfg.evaluate.ndcg_cutoffs))
        write_text(ctx.spark, target, page)
        run.details["path"] = target
        run.counts["bytes"] = len(page.encode("utf-8"))
    print(f"report: {target}")
    return target
