"""Canonical `serps` rows stored as Parquet or Delta (e.g. exported by another pipeline)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from clickeval_spark.errors import InputError
from clickeval_spark.sources.files import ensure_readable
from clickeval_spark.sources.parsed import to_parsed

REQUIRED = ("session_id", "query_id", "doc_ids", "clicks")


def read_serps(spark: SparkSession, path: str, dataset: str, fmt: str) -> DataFrame:
    ensure_readable(spark, path)
    try:
        rows = spark.read.format(fmt).load(path)
    except Exception as exc:  # Spark's AnalysisException: keep its first line only
        raise InputError(f"{path}: cannot be read as {fmt} ({str(exc).splitlines()[0]})") from None
    missing = [c for c in REQUIRED if c not in rows.columns]
    if missing:
        raise InputError(f"{path}: not canonical serps rows, missing column(s) {missing}")
    if "serp_id" not in rows.columns and "serp_pos" not in rows.columns:
        raise InputError(f"{path}: not canonical serps rows, needs a serp_id or a serp_pos column")
    optional = {
        "split": "string", "serp_id": "string", "serp_pos": "int", "vtypes": "array<string>", "log_date": "date",
    }
    for name, dtype in optional.items():
        if name not in rows.columns:
            rows = rows.withColumn(name, F.lit(None).cast(dtype))
    bad_date = F.col("log_date").isNotNull() & F.col("log_date").try_cast("date").isNull()
    if fmt == "parquet":  # Parquet knows each row's file and position: "line" is the 1-based row number
        where = [F.col("_metadata.file_path").alias("source"), (F.col("_metadata.row_index") + 1).alias("line")]
    else:
        where = [F.lit(path).alias("source"), F.lit(None).cast("long").alias("line")]
    return to_parsed(rows.select(
        *where,
        F.concat(F.lit("serp_id="), F.coalesce(F.col("serp_id").cast("string"), F.lit("null"))).alias("record"),
        F.to_json(F.struct(*[F.col(c) for c in rows.columns])).alias("raw"),
        # a log_date that is not a date would otherwise become null (or ingest.log_date) unnoticed
        F.when(bad_date, F.lit("unparseable")).alias("parse_rule"),
        F.when(bad_date, F.format_string("log_date %s is not a date", F.col("log_date").cast("string")))
        .alias("parse_reason"),
        F.lit(dataset).alias("dataset"),
        F.col("split").cast("string").alias("split"),
        F.col("session_id").cast("string").alias("session_id"),
        F.col("serp_pos").try_cast("int").alias("serp_pos"),
        # a row without serp_id is named after its session and position (null position: missing_id)
        F.coalesce(F.col("serp_id").cast("string"),
                   F.concat(F.col("session_id").cast("string"), F.lit("-"), F.col("serp_pos").cast("string")))
        .alias("serp_id"),
        F.col("query_id").cast("string").alias("query_id"),
        F.col("doc_ids").try_cast("array<string>").alias("doc_ids"),
        F.col("vtypes").try_cast("array<string>").alias("vtypes"),
        F.col("clicks").try_cast("array<int>").alias("clicks"),
        F.col("log_date").try_cast("date").alias("log_date"),
    ))

