"""Per-query text, as written by the NCM / AICM / GraphCM preprocessing.

    graphcm: sid <TAB> qid <TAB> [docs] <TAB> [vtypes] <TAB> [clicks]
    aicm:    sid <TAB> qid <TAB> 0 <TAB> 0 <TAB> [docs] <TAB> [vtypes] <TAB> [clicks]

Label files add a last field [relevances]. The bracketed fields are flat JSON
lists and are parsed as JSON, never evaluated: anything else in the field (text
after the closing bracket, nested lists or objects, Python syntax such as tuples
or True) makes the line unparseable. `auto` decides per line from its
number of fields. A SERP's id is "<session id>-<position in session>", its
position counted in file order.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from clickeval_spark.sources.parsed import to_parsed, to_parsed_labels
from clickeval_spark.sources.files import NOT_UTF8, numbered_lines, strip

# number of fields -> index of the docs field, per variant; labels have one more field
_LAYOUTS = {"graphcm": (5, 2), "aicm": (7, 4)}


def _layout(fields: Column, variant: str, extra: int) -> tuple[Column, Column]:
    """(docs field index or null when the field count fits no allowed layout, expectation text)."""
    n = F.size(fields)
    allowed = _LAYOUTS.items() if variant == "auto" else [(variant, _LAYOUTS[variant])]
    index = F.lit(None).cast("int")
    for _, (count, docs_at) in allowed:
        index = F.when(n == count + extra, F.lit(docs_at)).otherwise(index)
    expected = " or ".join(f"{count + extra} ({name})" for name, (count, _) in allowed)
    return index, F.lit(expected)


def _json_list(field: Column, element_type: str) -> Column:
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


def _parse(lines: DataFrame, dataset: str, variant: str, extra: int) -> DataFrame:
    fields = F.split(F.col("raw"), "\t")
    docs_at, expected = _layout(fields, variant, extra)
    field = lambda offset: F.try_element_at(fields, docs_at + 1 + offset)  # noqa: E731 (1-based)
    parsed = lines.select(
        "source", "line", "raw",
        F.lit(dataset).alias("dataset"),
        strip(F.try_element_at(fields, F.lit(1))).alias("session_id"),
        strip(F.try_element_at(fields, F.lit(2))).alias("query_id"),
        F.size(fields).alias("n_fields"),
        docs_at.alias("docs_at"),
        expected.alias("expected"),
        _json_list(field(0), "string").alias("doc_ids"),
        _json_list(field(1), "string").alias("vtypes"),
        _json_list(field(2), "int").alias("clicks"),
        _json_list(field(3), "string").alias("relevances"),
    )
    list_names = ["doc_ids", "vtypes", "clicks"] + (["relevances"] if extra else [])
    bad_list = F.lit(None).cast("string")
    for name in reversed(list_names):
        bad_list = F.when(F.col(name).isNull(), F.lit(name)).otherwise(bad_list)
    utf8 = F.is_valid_utf8("raw")
    return parsed.select(
        "*",
        F.when(~utf8 | F.col("docs_at").isNull() | bad_list.isNotNull(), F.lit("unparseable")).alias("parse_rule"),
        F.when(~utf8, F.lit(NOT_UTF8)).when(
            F.col("docs_at").isNull(),
            F.format_string("expected %s tab-separated fields, got %d", F.col("expected"), F.col("n_fields")),
        ).when(
            bad_list.isNotNull(),
            F.format_string("field %s is not a JSON list of %s", bad_list,
                            F.when(bad_list == "clicks", F.lit("integers")).otherwise(F.lit("ids"))),
        ).alias("parse_reason"),
    )


def _with_serp_ids(parsed: DataFrame) -> DataFrame:
    """serp_id '<session>-<position>': the position is the digits after the last dash, so two records never
    share one (`ingestion` skips the duplicates' window for this reader)."""
    order_in_session = Window.partitionBy("session_id").orderBy("source", "line")
    return (
        parsed.withColumn("serp_pos", F.row_number().over(order_in_session))
        .withColumn("serp_id", F.concat_ws("-", "session_id", F.col("serp_pos").cast("string")))
    )


def read_serps(spark: SparkSession, paths: dict[str, str], dataset: str, variant: str) -> DataFrame:
    """Parsed SERP records (sources.parsed.PARSED_SERPS); split from the path's key, or null for 'all'."""
    frames = []
    for split, path in paths.items():
        lines = numbered_lines(spark, path)
        frames.append(
            _parse(lines, dataset, variant, extra=0)
            .withColumn("split", F.lit(None if split == "all" else split).cast("string"))
        )
    parsed = frames[0]
    for frame in frames[1:]:
        parsed = parsed.unionByName(frame)
    return to_parsed(_with_serp_ids(parsed))


def read_labels(spark: SparkSession, path: str, dataset: str, variant: str) -> DataFrame:
    """Parsed label records: each line is a labelled SERP with one grade per document.

    Labelled SERPs get ids "label:<session>-<position>", their own namespace, since
    label files are separate samples that may repeat sessions of the click log.
    """
    parsed = _with_serp_ids(_parse(numbered_lines(spark, path), dataset, variant, extra=1))
    return to_parsed_labels(parsed.select(
        "source", "line", "raw", "parse_rule", "parse_reason", "dataset", "session_id", "query_id",
        F.concat(F.lit("label:"), F.col("serp_id")).alias("serp_id"),
        F.concat(F.lit("label:"), F.col("serp_id")).alias("label_key"),
        "doc_ids", "relevances",
    ))
