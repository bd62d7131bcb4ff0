"""Yandex Relevance Prediction Challenge click log.

    query line: SessionID TimePassed Q QueryID RegionID URL1 ... URLn
    click line: SessionID TimePassed C URLID

A click belongs to the latest earlier query line of the same session that shows
the clicked URL (the usual reading of this log, as in PyClick's parser). A record
is a SERP (its query line with the click lines it absorbed), or a line that
could not become part of one (unparseable, or a click no query line shows).
Relevance labels (`QueryID RegionID URLID Relevance`) are pooled per query.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from clickeval_spark.sources.parsed import to_parsed, to_parsed_labels
from clickeval_spark.sources.files import NOT_UTF8, numbered_lines, strip, whitespace_fields


def read_serps(spark: SparkSession, path: str, dataset: str) -> DataFrame:
    lines = numbered_lines(spark, path).select(
        "source", "line", "raw", F.split(strip(F.col("raw")), r"\s+").alias("f"),
    )
    field = lambda i: F.try_element_at("f", F.lit(i + 1))  # noqa: E731 (short lines give null, not an error)
    kind = field(2)
    utf8 = F.is_valid_utf8("raw")
    is_query = utf8 & (kind == "Q") & (F.size("f") >= 6)
    is_click = utf8 & (kind == "C") & (F.size("f") == 4)
    queries = lines.where(is_query).select(
        "source", "line", "raw",
        field(0).alias("session_id"),
        field(3).alias("query_id"),
        F.slice("f", 6, F.size("f") - 5).alias("doc_ids"),
    ).withColumn("serp_pos", F.row_number().over(Window.partitionBy("session_id").orderBy("source", "line")))
    clicks = lines.where(is_click).select(
        "source", F.col("line").alias("click_line"), F.col("raw").alias("click_raw"),
        field(0).alias("session_id"), field(3).alias("url"),
    )
    # each click joins the query lines before it that show its URL; the latest one wins
    candidates = clicks.join(
        queries.select("source", "session_id", F.col("line").alias("query_line"), "doc_ids"),
        on=["source", "session_id"],
        how="left",
    ).withColumn(
        "match",
        F.coalesce((F.col("query_line") < F.col("click_line")) & F.array_contains("doc_ids", F.col("url")),
                   F.lit(False)),
    )
    latest = Window.partitionBy("source", "click_line").orderBy(F.col("match").desc(), F.col("query_line").desc())
    attributed = (
        candidates.withColumn("k", F.row_number().over(latest)).where("k = 1")
        .select("source", "click_line", "click_raw", "session_id", "url",
                F.when(F.col("match"), F.col("query_line")).alias("query_line"))
    )
    clicked_urls = (
        attributed.where(F.col("query_line").isNotNull())
        .groupBy("source", F.col("query_line").alias("line"))
        .agg(F.collect_set("url").alias("clicked_urls"), F.count(F.lit(1)).alias("n_click_lines"))
    )
    serps = queries.join(clicked_urls, on=["source", "line"], how="left").select(
        "source", "line",
        F.concat_ws("\n", "raw", F.concat(F.lit("+ "), F.coalesce("n_click_lines", F.lit(0)).cast("string"),
                                          F.lit(" click line(s)"))).alias("raw"),
        F.lit(dataset).alias("dataset"), "session_id", "serp_pos",
        F.concat_ws("-", "session_id", F.col("serp_pos").cast("string")).alias("serp_id"),
        "query_id", "doc_ids",
        F.transform("doc_ids", lambda d: F.when(F.array_contains(F.coalesce("clicked_urls", F.array()), d), 1)
                    .otherwise(0)).alias("clicks"),
    )
    orphans = attributed.where(F.col("query_line").isNull()).select(
        "source", F.col("click_line").alias("line"), F.col("click_raw").alias("raw"),
        F.lit("unparseable").alias("parse_rule"),
        F.format_string("click on URL %s matches no earlier query line of session %s that shows it",
                        "url", "session_id").alias("parse_reason"),
        "session_id",
    )
    bad_lines = lines.where(~F.coalesce(is_query | is_click, F.lit(False))).select(
        "source", "line", "raw", F.lit("unparseable").alias("parse_rule"),
        F.when(~utf8, F.lit(NOT_UTF8))
        .otherwise(F.lit("expected a query line 'SessionID TimePassed Q QueryID RegionID URL...' "
                         "or a click line 'SessionID TimePassed C URLID'")).alias("parse_reason"),
    )
    rejects = orphans.unionByName(bad_lines, allowMissingColumns=True).select(
        "source", "line", "raw", "parse_rule", "parse_reason", F.lit(dataset).alias("dataset"), "session_id",
        F.concat(F.lit("line-"), F.col("line").cast("string")).alias("serp_id"),
    )
    return to_parsed(serps).unionByName(to_parsed(rejects))


def read_labels(spark: SparkSession, path: str, dataset: str) -> DataFrame:
    """Pooled labels `QueryID RegionID URLID Relevance`, not tied to a SERP."""
    f = F.col("f")
    return to_parsed_labels(whitespace_fields(spark, path, 4, "QueryID RegionID URLID Relevance").select(
        "source", "line", "record", "raw", "parse_rule", "parse_reason",
        F.lit(dataset).alias("dataset"),
        f[0].alias("query_id"),
        F.concat_ws("|", f[0], f[1], f[2]).alias("label_key"),
        F.array(f[2]).alias("doc_ids"),
        F.array(f[3]).alias("relevances"),
    ))
