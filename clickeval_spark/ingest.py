"""The ingest stage: any source format -> validated serps, relevance_labels and quarantine."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from clickeval_spark import tables
from clickeval_spark.config import IngestConfig
from clickeval_spark.errors import ConfigError
from clickeval_spark.sources import canonical, per_query_text, tiangong, yandex
from clickeval_spark.splits import assign_splits
from clickeval_spark.validation import check_labels, check_serps


@dataclass(frozen=True)
class IngestOutput:
    serps: DataFrame
    labels: DataFrame | None
    quarantine: DataFrame
    counts: dict[str, int]


def parse_serps(spark: SparkSession, cfg: IngestConfig) -> DataFrame:
    """The configured source as parsed SERP records (validation.PARSED_SERP_COLUMNS)."""
    if cfg.format == "per_query_text":
        return per_query_text.read_serps(spark, cfg.paths, cfg.dataset, cfg.text_variant)
    single = _single_path(cfg)
    if cfg.format == "tiangong_xml":
        return tiangong.read_serps(spark, single, cfg.dataset)
    if cfg.format == "yandex":
        return yandex.read_serps(spark, single, cfg.dataset)
    if cfg.format in ("parquet", "delta"):
        return canonical.read_serps(spark, single, cfg.dataset, cfg.format)
    raise ConfigError(f"ingest.format: parse_serps does not read format {cfg.format!r}")  # synthetic has its own path


def parse_labels(spark: SparkSession, cfg: IngestConfig) -> DataFrame | None:
    if cfg.labels is None:
        return None
    if cfg.format == "per_query_text":
        return per_query_text.read_labels(spark, cfg.labels, cfg.dataset, cfg.text_variant)
    if cfg.format == "tiangong_xml":
        return tiangong.read_labels(spark, cfg.labels, cfg.dataset, cfg.label_query_prefix, cfg.label_doc_prefix)
    if cfg.format == "yandex":
        return yandex.read_labels(spark, cfg.labels, cfg.dataset)
    raise ConfigError(f"ingest.labels is not supported for format {cfg.format!r}")


def _single_path(cfg: IngestConfig) -> str:
    if set(cfg.paths) != {"all"}:
        raise ConfigError(f"ingest.paths: format {cfg.format!r} reads one input, give it as 'all'")
    return cfg.paths["all"]


def attach_labels_to_serps(labels: DataFrame, serps: DataFrame) -> DataFrame:
    """Tie session-level labels (serp_id null, session_id known) to the SERP that shows the doc.

    TianGong-ST labels name a session and a query; the SERP is that session's
    first interaction with the query showing the document. Labels that match no
    SERP keep serp_id null and are counted, not dropped.
    """
    shown = serps.select(
        "session_id", "query_id", "serp_id", "serp_pos", F.posexplode("doc_ids").alias("pos", "doc_id"),
    )
    candidates = labels.where(F.col("serp_id").isNull() & F.col("session_id").isNotNull()).join(
        shown.withColumnRenamed("serp_id", "matched_serp_id"),
        on=["session_id", "query_id", "doc_id"],
        how="left",
    )
    first = Window.partitionBy("dataset", "session_id", "query_id", "doc_id").orderBy(
        F.col("serp_pos").asc_nulls_last(), "pos"
    )
    resolved = (
        candidates.withColumn("k", F.row_number().over(first)).where("k = 1")
        .select("dataset", "query_id", "doc_id", "relevance",
                F.col("matched_serp_id").alias("serp_id"),
                (F.col("pos") + 1).cast("int").alias("rank"), "session_id")
    )
    untouched = labels.where(F.col("serp_id").isNotNull() | F.col("session_id").isNull())
    return untouched.unionByName(resolved)


def run_ingest(spark: SparkSession, cfg: IngestConfig, serps_parsed: DataFrame,
               labels_parsed: DataFrame | None, run_id: str) -> IngestOutput:
    """Validate parsed records and split the sessions; returns the frames to write and their counts.

    The parsed input is persisted once, since counts and both outputs read it.
    """
    parsed = assign_splits(serps_parsed, cfg.split).persist(StorageLevel.MEMORY_AND_DISK)
    checked = check_serps(parsed, max_rank=cfg.max_rank)
    serps = checked.accepted.withColumn("ingest_run_id", F.lit(run_id))
    quarantine = checked.quarantined
    counts = {"serps_read": parsed.count()}

    labels = None
    if labels_parsed is not None:
        labels_parsed = labels_parsed.persist(StorageLevel.MEMORY_AND_DISK)
        label_check = check_labels(labels_parsed)
        labels = attach_labels_to_serps(label_check.accepted, checked.accepted).withColumn(
            "ingest_run_id", F.lit(run_id)
        )
        quarantine = quarantine.unionByName(label_check.quarantined)
        counts["labels_read"] = labels_parsed.count()
        counts["labels_accepted"] = label_check.accepted_records.count()

    return IngestOutput(serps=serps, labels=labels, quarantine=quarantine.withColumn("run_id", F.lit(run_id)),
                        counts=counts)


def write_ingest(spark: SparkSession, out: IngestOutput, warehouse: str, dataset: str, run_id: str) -> dict[str, int]:
    """Write the three tables, then reconcile read = accepted + quarantined from what was written."""
    tables.replace_slice(out.serps, warehouse, "serps", {"dataset": dataset}, run_id)
    tables.replace_slice(out.quarantine, warehouse, "quarantine", {"run_id": run_id, "dataset": dataset}, run_id)
    counts = dict(out.counts)
    serps = tables.read_table(spark, warehouse, "serps").where(F.col("dataset") == dataset)
    quarantine = tables.read_table(spark, warehouse, "quarantine").where(
        (F.col("run_id") == run_id) & (F.col("dataset") == dataset))
    q_counts = {r["target"]: r["n"] for r in quarantine.groupBy("target").agg(F.count(F.lit(1)).alias("n")).collect()}
    counts["serps_accepted"] = serps.count()
    counts["serps_quarantined"] = q_counts.get("serps", 0)
    for split, n in serps.groupBy("split").agg(F.count(F.lit(1)).alias("n")).collect():
        counts[f"serps_{split}"] = n
    if out.labels is not None:
        tables.replace_slice(out.labels, warehouse, "relevance_labels", {"dataset": dataset}, run_id)
        labels = tables.read_table(spark, warehouse, "relevance_labels").where(F.col("dataset") == dataset)
        counts["labels_quarantined"] = q_counts.get("relevance_labels", 0)
        counts["label_rows"] = labels.count()
        counts["label_rows_without_serp"] = labels.where(F.col("serp_id").isNull()).count()
        counts["label_pairs_not_in_serps"] = labels.join(
            serps.select("query_id", F.explode("doc_ids").alias("doc_id")).distinct(),
            on=["query_id", "doc_id"], how="left_anti",
        ).count()
    counts["read"] = counts["serps_read"] + counts.get("labels_read", 0)
    counts["quarantined"] = counts["serps_quarantined"] + counts.get("labels_quarantined", 0)
    counts["accepted"] = counts["serps_accepted"] + counts.get("labels_accepted", 0)
    if counts["read"] != counts["accepted"] + counts["quarantined"]:
        raise RuntimeError(f"ingest lost records: {counts}")  # a bug, never expected: fail loudly
    return counts
