"""TianGong-ST raw XML and its human-label file.

XML: <session num> -> <interaction num> -> <query_id>, <query>, <results> ->
<result rank="1..10"> with <docid>, <url>, <title>, <vtype>; and <clicked> ->
<click> -> <rank> (clicks name results by rank). A `starttime` attribute (Unix
seconds) on the interaction, else on its session, gives the SERP's log_date
(its UTC day). Read with Spark's native XML
source, one row per <session>; a session that does not parse is quarantined
whole, with its raw text.

Labels: whitespace-separated `id session query doc relevance`. Label ids may be
bare numbers where the XML has prefixed ids (q123 / d456); the configured
prefixes map them explicitly.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.sources.parsed import to_parsed, to_parsed_labels
from clickeval_spark.sources.files import ensure_readable, whitespace_fields

_CORRUPT = "_corrupt_record"
MAX_UNIX_SECONDS = 253402300799.0  # 9999-12-31T23:59:59Z

SESSION_SCHEMA = T.StructType([
    T.StructField("_num", T.StringType()),
    T.StructField("_starttime", T.StringType()),
    T.StructField("interaction", T.ArrayType(T.StructType([
        T.StructField("_num", T.StringType()),
        T.StructField("_starttime", T.StringType()),
        T.StructField("query_id", T.StringType()),
        T.StructField("query", T.StringType()),
        T.StructField("results", T.StructType([
            T.StructField("result", T.ArrayType(T.StructType([
                T.StructField("_rank", T.StringType()),
                T.StructField("docid", T.StringType()),
                T.StructField("url", T.StringType()),
                T.StructField("title", T.StringType()),
                T.StructField("vtype", T.StringType()),
            ]))),
        ])),
        T.StructField("clicked", T.StructType([
            T.StructField("click", T.ArrayType(T.StructType([
                T.StructField("_num", T.StringType()),
                T.StructField("rank", T.StringType()),
                T.StructField("docid", T.StringType()),
            ]))),
        ])),
    ]))),
    T.StructField(_CORRUPT, T.StringType()),
])


def read_serps(spark: SparkSession, path: str, dataset: str) -> DataFrame:
    """Parsed SERP records (sources.parsed.PARSED_SERPS), one per <interaction>."""
    ensure_readable(spark, path)
    sessions = (
        spark.read.format("xml")
        .option("rowTag", "session")
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", _CORRUPT)
        .schema(SESSION_SCHEMA)
        .load(path)
        # file order without line numbers: the split's offset, then the row's place within the split
        .select(F.col("_metadata.file_path").alias("source"), F.col("_metadata.file_block_start").alias("block"),
                F.monotonically_increasing_id().alias("row_in_block"), "*")
    )
    broken = sessions.where(F.col(_CORRUPT).isNotNull()).select(
        "source",
        F.array("block", "row_in_block", F.lit(0).cast("long")).alias("ordinal"),
        F.concat(F.lit("session "), F.coalesce(F.col("_num"), F.lit("?"))).alias("record"),
        F.col(_CORRUPT).alias("raw"),
        F.lit("unparseable").alias("parse_rule"),
        F.lit("the <session> element is not well-formed XML in the TianGong-ST layout").alias("parse_reason"),
    )
    interactions = (
        sessions.where(F.col(_CORRUPT).isNull())
        .select("source", "block", "row_in_block", F.col("_num").alias("session_id"),
                F.col("_starttime").alias("session_starttime"), F.posexplode_outer("interaction").alias("pos", "it"))
        .select(
            "source", "session_id",
            F.array("block", "row_in_block", F.coalesce("pos", F.lit(0)).cast("long")).alias("ordinal"),
            F.col("it._num").alias("interaction"),
            F.col("it.query_id").alias("query_id"),
            F.array_sort(
                F.transform(F.coalesce(F.col("it.results.result"), F.array()),
                            lambda r: F.struct(r["_rank"].try_cast("int").alias("rank"), r.alias("r"))),
            ).alias("results"),
            F.transform(F.coalesce(F.col("it.clicked.click"), F.array()),
                        lambda c: F.trim(c["rank"]).try_cast("int")).alias("click_ranks"),
            F.to_json("it").alias("raw"),
            # the interaction's own start time, else its session's (Unix seconds)
            F.trim(F.coalesce(F.col("it._starttime"), F.col("session_starttime"))).alias("starttime"),
        )
    )
    no_num = F.col("interaction").isNull() | F.col("interaction").try_cast("int").isNull()
    seconds = F.col("starttime").try_cast("double")
    # NaN, infinities and times past year 9999 would overflow the day number: a bad starttime, not a day
    bad_start = F.col("starttime").isNotNull() & ~F.coalesce(seconds.between(0.0, MAX_UNIX_SECONDS), F.lit(False))
    parsed = interactions.select(
        "source", "ordinal",
        F.format_string("session %s interaction %s", F.coalesce("session_id", F.lit("?")),
                        F.coalesce("interaction", F.lit("?"))).alias("record"),
        "raw",
        F.when(no_num | bad_start, F.lit("unparseable")).alias("parse_rule"),
        F.when(no_num, F.lit("<interaction> has no numeric num attribute"))
        .when(bad_start, F.format_string("starttime %s is not Unix seconds", F.col("starttime")))
        .alias("parse_reason"),
        "session_id",
        F.col("interaction").try_cast("int").alias("serp_pos"),
        F.concat_ws("-", "session_id", "interaction").alias("serp_id"),
        "query_id",
        F.transform("results", lambda x: F.trim(x["r"]["docid"])).alias("doc_ids"),
        F.transform("results", lambda x: F.trim(x["r"]["vtype"])).alias("vtypes"),
        F.transform("results", lambda x: F.when(F.array_contains("click_ranks", x["rank"]), 1).otherwise(0))
        .alias("clicks"),
        "click_ranks",
        F.transform("results", lambda x: x["rank"]).alias("result_ranks"),
        # the UTC day of the start time; null without one (ingest.log_date then applies)
        F.when(~bad_start, F.date_from_unix_date(F.floor(seconds / 86400).cast("int"))).alias("log_date"),
    )
    # no line numbers in XML: "ordinal" keeps the file order instead
    return to_parsed(parsed.unionByName(broken, allowMissingColumns=True).withColumn("dataset", F.lit(dataset)),
                     keep=("ordinal",))


def read_labels(spark: SparkSession, path: str, dataset: str, query_prefix: str, doc_prefix: str) -> DataFrame:
    """Parsed label records, one per line; serp_id and rank are resolved later against serps."""
    with_prefix = lambda value, prefix: (  # noqa: E731
        F.when(value.rlike(r"^[0-9]+$"), F.concat(F.lit(prefix), value)).otherwise(value)
    )
    f = F.col("f")
    query, doc = with_prefix(f[2], query_prefix), with_prefix(f[3], doc_prefix)
    return to_parsed_labels(whitespace_fields(spark, path, 5, "id session query doc relevance").select(
        "source", "line", "record", "raw", "parse_rule", "parse_reason",
        F.lit(dataset).alias("dataset"),
        f[1].alias("session_id"),
        query.alias("query_id"),
        # the key uses the mapped ids: "q5" and a bare "5" name the same query
        F.concat_ws("|", f[1], query, doc).alias("label_key"),
        F.array(doc).alias("doc_ids"),
        F.array(f[4]).alias("relevances"),
    ))
