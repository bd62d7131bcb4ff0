"""Per-query text, as written by the NCM / AICM / GraphCM preprocessing.

    graphcm: sid <TAB> qid <TAB> [docs] <TAB> [vtypes] <TAB> [clicks]
    aicm:    sid <TAB> qid <TAB> 0 <TAB> 0 <TAB> [docs] <TAB> [vtypes] <TAB> [clicks]

Label files add a last field [relevances]. The bracketed fields are flat JSON
lists and are parsed as JSON, never evaluated: anything else in the field (text
after the closing bracket, nested lists or objects, Python syntax such as tuples
or True) makes the line unparseable. `auto` decides per line from its
number of fields. A SERP's id is "<session id>-<position in session>", its
position counted in file order.

One Arrow pass per file split (`text_batches`) splits the fields, decodes the lists written in the plain
form and numbers each session's records and the lines within the split, so the raw text is never shuffled
and the SERP log is read once; `settled_positions` then adds the records of earlier splits, for the few
sessions that span splits, and `settled_lines` the lines of earlier splits, for the quarantined records.
"""

from __future__ import annotations

from typing import Mapping

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.sources.parsed import to_parsed, to_parsed_labels
from clickeval_spark.sources.files import NOT_UTF8, numbered_lines, split_lines, strip
from clickeval_spark.sources.text_batches import parse_batches

# number of fields -> index of the docs field, per variant; labels have one more field
_LAYOUTS = {"graphcm": (5, 2), "aicm": (7, 4)}


def _layouts(variant: str, extra: int) -> tuple[list[tuple[int, int]], str]:
    """((number of fields, index of the docs field) allowed, the expectation as a reason names it)."""
    allowed = _LAYOUTS.items() if variant == "auto" else [(variant, _LAYOUTS[variant])]
    expected = " or ".join(f"{count + extra} ({name})" for name, (count, _) in allowed)
    return [(count + extra, docs_at) for _, (count, docs_at) in allowed], expected


def json_list(field: Column, element_type: str) -> Column:
    """The field parsed as a flat JSON list of `element_type`, or null when it is anything else.

    Spark's JSON parser stops after the first complete value ("[0,1]garbage" would give
    [0, 1]), so the field's shape is checked first: with backslash escapes and string
    literals blanked out, what is left must be one bracketed list with nothing nested in
    it and nothing after it. The regexes scan linearly, also on a line of megabytes.
    """
    no_escapes = F.regexp_replace(field, r"(?s)\\.", "_")
    skeleton = F.regexp_replace(no_escapes, r"\"[^\"]*\"|'[^']*'", "s")
    flat = skeleton.rlike(r"^\s*\[[^\[\]{}\"']*\]\s*$")
    return F.when(flat, F.from_json(field, f"array<{element_type}>"))


def parse_lines(lines: DataFrame, dataset: str, variant: str, extra: int) -> DataFrame:
    """Fields, lists, positions and line numbers within the file split (`text_batches.parse_batches`, one
    Arrow pass) of `lines` (source, line, block_start, raw; line may be null); list fields outside the plain
    form are decoded here by Spark's JSON parser."""
    layouts, expected = _layouts(variant, extra)
    lists = [("doc_ids", "string"), ("vtypes", "string"), ("clicks", "int")] + ([("relevances", "string")] if extra else [])
    utf8 = F.is_valid_utf8("raw")
    batches = lines.select(
        "source", "line", "block_start", F.col("raw").cast("binary").alias("raw"), utf8.alias("utf8"),
        # the session id of a line that is not UTF-8 (quarantined, but it counts in its session's positions)
        F.when(~utf8, strip(F.try_element_at(F.split("raw", "\t"), F.lit(1)))).alias("key"),
    ).mapInArrow(
        lambda it: parse_batches(it, layouts, [(name, kind == "int") for name, kind in lists]),
        _batch_schema(lists),
    )
    parsed = batches.select(
        "source", "line", "block_start", F.col("raw").cast("string").alias("raw"), "utf8",
        F.lit(dataset).alias("dataset"), "session_id", "query_id", "n_fields", "docs_at",
        *[F.when(F.col(f"{name}_text").isNotNull(), json_list(F.col(f"{name}_text"), kind))
          .otherwise(F.col(name)).alias(name) for name, kind in lists],
        F.col("local_pos").alias("serp_pos"), "block_line",
    )
    bad_list = F.lit(None).cast("string")
    for name, _ in reversed(lists):
        bad_list = F.when(F.col(name).isNull(), F.lit(name)).otherwise(bad_list)
    return parsed.select(
        "*",
        F.when(~F.col("utf8") | F.col("docs_at").isNull() | bad_list.isNotNull(), F.lit("unparseable")).alias("parse_rule"),
        F.when(~F.col("utf8"), F.lit(NOT_UTF8)).when(
            F.col("docs_at").isNull(),
            F.format_string("expected %s tab-separated fields, got %d", F.lit(expected), F.col("n_fields")),
        ).when(
            bad_list.isNotNull(),
            F.format_string("field %s is not a JSON list of %s", bad_list,
                            F.when(bad_list == "clicks", F.lit("integers")).otherwise(F.lit("ids"))),
        ).alias("parse_reason"),
    )


def _batch_schema(lists: list[tuple[str, str]]) -> T.StructType:
    """`text_batches.parse_batches`' output."""
    fields = [("source", T.StringType()), ("line", T.LongType()), ("block_start", T.LongType()),
              ("raw", T.BinaryType()), ("utf8", T.BooleanType()), ("session_id", T.StringType()),
              ("query_id", T.StringType()), ("n_fields", T.IntegerType()), ("docs_at", T.IntegerType())]
    for name, kind in lists:
        fields += [(name, T.ArrayType(T.IntegerType() if kind == "int" else T.StringType())), (f"{name}_text", T.StringType())]
    fields += [("local_pos", T.IntegerType()), ("block_line", T.LongType())]
    return T.StructType([T.StructField(name, dtype) for name, dtype in fields])


def _serp_id(pos: Column) -> Column:
    return F.concat_ws("-", "session_id", pos.cast("string"))


def _with_serp_ids(parsed: DataFrame) -> DataFrame:
    """serp_id '<session>-<position>': the position is the digits after the last dash, so two records never
    share one (`ingestion` skips the duplicates' window for this reader)."""
    order_in_session = Window.partitionBy("session_id").orderBy("source", "block_start", "block_line")
    return (
        parsed.withColumn("serp_pos", F.row_number().over(order_in_session))
        .withColumn("serp_id", _serp_id(F.col("serp_pos")))
    )


def read_serps(spark: SparkSession, paths: dict[str, str], dataset: str, variant: str) -> DataFrame:
    """Parsed SERP records (sources.parsed.PARSED_SERPS) with their file split (`block_start`) and their line
    in it (`block_line`); split from the path's key, or null for 'all'. serp_pos counts within the record's
    file split only: `settled_positions` makes it the position in the session (after the records are checked
    and kept). `line` is null: `settled_lines` numbers the records that need it (the quarantined)."""
    frames = []
    for split, path in paths.items():
        lines = split_lines(spark, path).withColumn("line", F.lit(None).cast("long"))
        frames.append(
            parse_lines(lines, dataset, variant, extra=0)
            .withColumn("split", F.lit(None if split == "all" else split).cast("string"))
        )
    parsed = frames[0]
    for frame in frames[1:]:
        parsed = parsed.unionByName(frame)
    return to_parsed(parsed.withColumn("serp_id", _serp_id(F.col("serp_pos"))), keep=["block_start", "block_line"])


# sessions whose records lie in more than one file split, up to which their offsets are joined from the driver;
# a log with more (a file not grouped by session) numbers its records with the session window instead
SPANNING_BROADCAST_MAX = 100_000
_OFFSETS = T.StructType([T.StructField("session_id", T.StringType()), T.StructField("source", T.StringType()),
                         T.StructField("block_start", T.LongType()), T.StructField("offset", T.LongType())])


def settled_positions(records: DataFrame, spanning_max: int = SPANNING_BROADCAST_MAX) -> DataFrame:
    """`read_serps`' records (any later frame of them with session_id, source, line, block_start, serp_pos)
    with serp_pos and serp_id their position in the session, counted in file order over every input file.

    A session's records in earlier file splits are counted once per (session, split), a small aggregate;
    only the sessions that span splits get an offset (in a log grouped by session, at most one per split
    boundary), collected, at most `spanning_max` of them, and broadcast back to the records."""
    per_split = records.groupBy("session_id", "source", "block_start").agg(F.count(F.lit(1)).alias("n"))
    earlier = Window.partitionBy("session_id").orderBy("source", "block_start").rowsBetween(Window.unboundedPreceding, -1)
    spanning = (
        per_split.select("session_id", "source", "block_start", F.sum("n").over(earlier).alias("offset"))
        .where(F.col("offset") > 0)
        .limit(spanning_max + 1)
        .collect()
    )
    if len(spanning) > spanning_max:
        return _with_serp_ids(records)
    if not spanning:   # no session spans two splits: the positions within the splits are the positions
        return records
    offsets = records.sparkSession.createDataFrame(spanning, _OFFSETS)
    settled = records.join(F.broadcast(offsets), on=["session_id", "source", "block_start"], how="left")
    pos = (F.col("serp_pos") + F.coalesce(F.col("offset"), F.lit(0))).cast("int")
    return settled.withColumn("serp_pos", pos).withColumn("serp_id", _serp_id(F.col("serp_pos"))).drop("offset")


_LINE_OFFSETS = T.StructType([T.StructField("source", T.StringType()), T.StructField("block_start", T.LongType()),
                              T.StructField("lines_before", T.LongType())])


def settled_lines(records: DataFrame, lines_per_split: Mapping[tuple[str, int], int]) -> DataFrame:
    """`read_serps`' records (any later frame of them with source, block_start, block_line) with `line`, the
    record's line number in its file: the lines of the file's earlier splits plus its line in its split.

    `lines_per_split`: {(source, block_start): lines}, every file split's line count, which is its count of
    records (each line is one); the ingest's tally gives it, so the input is not read again to count lines.
    One row per file split is broadcast, and only to the records given (the ingest gives the quarantined)."""
    rows, before = [], {}
    for (source, block_start), n in sorted(lines_per_split.items()):
        rows.append((source, block_start, before.get(source, 0)))
        before[source] = before.get(source, 0) + n
    offsets = records.sparkSession.createDataFrame(rows, _LINE_OFFSETS)
    return (records.join(F.broadcast(offsets), on=["source", "block_start"], how="left")
            .withColumn("line", F.col("lines_before") + F.col("block_line")).drop("lines_before"))


def read_labels(spark: SparkSession, path: str, dataset: str, variant: str) -> DataFrame:
    """Parsed label records: each line is a labelled SERP with one grade per document.

    Labelled SERPs get ids "label:<session>-<position>", their own namespace, since
    label files are separate samples that may repeat sessions of the click log.
    """
    parsed = _with_serp_ids(parse_lines(numbered_lines(spark, path), dataset, variant, extra=1))
    return to_parsed_labels(parsed.select(
        "source", "line", "raw", "parse_rule", "parse_reason", "dataset", "session_id", "query_id",
        F.concat(F.lit("label:"), F.col("serp_id")).alias("serp_id"),
        F.concat(F.lit("label:"), F.col("serp_id")).alias("label_key"),
        "doc_ids", "relevances",
    ))
