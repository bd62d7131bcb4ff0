"""Ingest: parse, validate and quarantine the input log (or simulate one) → serps, relevance_labels.

An ingest replaces only the (dataset, log_date) slices it read; bad records go to quarantine."""

from __future__ import annotations

from datetime import date

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from clickeval_spark import ingestion, tables
from clickeval_spark.config import SPLITS
from clickeval_spark.context import StageContext
from clickeval_spark.errors import InputError
from clickeval_spark.sources import synthetic


def run(ctx: StageContext) -> dict[str, int]:
    icfg = ctx.cfg.ingest
    with ctx.record("ingest") as run:
        if icfg.format == "synthetic":
            parsed_serps, labels, truth = synthetic.generate(ctx.spark, icfg)
        else:
            # the locations read, a daily input's {log_date} filled (recorded also when one is missing)
            run.details["inputs"] = {**{f"paths.{key}": path for key, path in icfg.input_paths.items()},
                                     **({"labels": icfg.input_labels} if icfg.labels else {})}
            parsed_serps, labels = ingestion.parse_serps(ctx.spark, icfg), ingestion.parse_labels(ctx.spark, icfg)
            truth = None
        out = ingestion.run_ingest(ctx.spark, icfg, parsed_serps, labels, ctx.run_id)
        try:
            if icfg.reads_inputs:   # the files its records came from: a daily ingest's are that day's only
                run.details["input_files"] = list(out.files)
            counts, refused = ingestion.quarantine_check(out, icfg)
            run.counts.update(out.counts, **counts)
            if refused:
                raise InputError(refused)
            # the (dataset, log_date) slices this ingest replaced; null: the undated slice
            run.details["log_dates"] = sorted(out.log_dates, key=lambda d: (d is None, d or date.min))
            run.counts.update(write_ingest(ctx, out))
            if truth is not None:  # a simulated log's true parameters, beside the fitted ones
                ctx.write(truth, "model_params", {"run_id": synthetic.truth_run_id(icfg.dataset)})
        finally:
            out.release()
    print(f"ingest {icfg.dataset} run_id={ctx.run_id}: " + ", ".join(f"{k}={v}" for k, v in sorted(run.counts.items())))
    return run.counts


def write_ingest(ctx: StageContext, out: ingestion.IngestOutput) -> dict[str, int]:
    """Write the three tables of the context's dataset, then reconcile read = accepted + quarantined from
    what was written."""
    with ingestion.reading_inputs():
        return _write_ingest(ctx, out)


def _counted(df: DataFrame, what: str, **counts: Column) -> tuple[DataFrame, Observation]:
    """`tables.observed` with row counts: name -> condition."""
    return tables.observed(df, f"ingest-{what}", *[F.count(F.when(cond, 1)).alias(name) for name, cond in counts.items()])


def _write_ingest(ctx: StageContext, out: ingestion.IngestOutput) -> dict[str, int]:
    dataset = ctx.dataset
    serps, serps_seen = _counted(out.serps, "serps", **{split: F.col("split") == split for split in SPLITS})
    quarantine, quarantine_seen = _counted(out.quarantine, "quarantine",
                                            **{t: F.col("target") == t for t in ("serps", "relevance_labels")})
    ctx.write(serps, "serps", {"dataset": dataset}, out.log_dates)
    # rows an earlier attempt of this run left in its quarantine slice must be replaced, even by none
    earlier = ctx.exists("quarantine") and bool(ctx.this_run("quarantine", dataset=dataset).limit(1).count())
    if out.rule_counts or earlier:
        ctx.write(quarantine, "quarantine", {"run_id": ctx.run_id, "dataset": dataset})
        quarantined = quarantine_seen.get
    else:   # nothing to write and nothing to replace: no commit (the table exists for those who query it)
        tables.ensure_table(ctx.spark, ctx.warehouse, "quarantine")
        quarantined = {"serps": 0, "relevance_labels": 0}
    counts = dict(out.counts)
    # a split outside SPLITS is counted nowhere: the reconciliation below fails on it
    per_split = {split: n for split, n in serps_seen.get.items() if n}
    counts["serps_accepted"] = sum(per_split.values())
    counts["serps_quarantined"] = quarantined["serps"]
    for split, n in per_split.items():
        counts[f"serps_{split}"] = n
    if out.labels is not None:
        labels, labels_seen = _counted(out.labels, "labels", rows=F.lit(True), without_serp=F.col("serp_id").isNull())
        ctx.write(labels, "relevance_labels", {"dataset": dataset}, out.label_log_dates)
        counts["labels_quarantined"] = quarantined["relevance_labels"]
        counts["label_rows"], counts["label_rows_without_serp"] = labels_seen.get["rows"], labels_seen.get["without_serp"]
        # the labels' days as written (they may reach beyond this input's SERP days), against the SERPs written
        labels_written = ctx.dataset_days("relevance_labels", out.label_log_dates)
        pairs_written = (ctx.dataset_days("serps", out.log_dates)
                         .select("query_id", F.explode("doc_ids").alias("doc_id")).distinct())
        counts["label_pairs_not_in_serps"] = labels_written.join(pairs_written, on=["query_id", "doc_id"],
                                                                 how="left_anti").count()
    counts["read"] = counts["serps_read"] + counts.get("labels_read", 0)
    counts["quarantined"] = counts["serps_quarantined"] + counts.get("labels_quarantined", 0)
    counts["accepted"] = counts["serps_accepted"] + counts.get("labels_accepted", 0)
    if counts["read"] != counts["accepted"] + counts["quarantined"]:
        raise RuntimeError(f"ingest lost records: {counts}")  # a bug, never expected: fail loudly
    return counts
