"""File access shared by every source: existence checks, input file listings and numbered text lines."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from clickeval_spark.errors import InputError
from clickeval_spark.spark_internals import glob, list_files

RAW_MAX_CHARS = 1000  # quarantine keeps this much of a bad record (and of its reason and locator)
# Java regex: what str.strip() / str.isspace() call whitespace (ASCII, the \x1c-\x1f separators, Unicode spaces)
WHITESPACE = r"[\p{javaWhitespace}\p{Z}\x{85}]"
# the same characters, listed (for Arrow's trim), rather than found at every import by a slow scan of all of
# Unicode: tests/sources/test_text_batches.py checks them against the Java class and str.isspace()
WHITESPACE_CHARS = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
                    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


def ensure_readable(spark: SparkSession, path: str, missing: str | None = None) -> None:
    """Fail with one line naming the file when it is missing (`missing`, else "<path>: cannot be read"),
    before Spark's deep stack traces."""
    try:
        matches = glob(spark, path)
    except Exception as exc:  # py4j wraps the Hadoop error: keep only its message
        raise InputError(f"{path}: cannot be read ({str(exc).splitlines()[0]})") from None
    if not matches:
        raise InputError(missing or f"{path}: cannot be read (no such file)")


def input_files(spark: SparkSession, path: str) -> list[str]:
    """The data files Spark reads for `path` (a file, a glob, or a folder of files), as URIs.

    Folders contribute the files directly inside them whose names do not start with
    '_' or '.' (what Spark skips too); nested folders are left out, so every file
    listed here is one Spark certainly reads.
    """
    return list_files(spark, path)


def same_file(uri: str) -> tuple[str, str, str]:
    """A key under which Spark's `_metadata.file_path` and a Hadoop listing name a file alike
    (file:///x and file:/x, percent-encoded or not)."""
    parts = urlsplit(uri)
    return parts.scheme or "file", parts.netloc, unquote(parts.path)


def shown(uri: str) -> str:
    """A file as a message names it: local files by their path, others by their URI."""
    scheme, netloc, path = same_file(uri)
    return path if scheme == "file" and not netloc else uri


def split_lines(spark: SparkSession, path: str) -> DataFrame:
    """Lines of text file(s) as Spark reads them: source, block_start (where the file split holding the line
    starts: one task reads a split's lines in file order) and raw. Not numbered: `numbered_lines` numbers
    them with a pass of its own over the input; a reader that counts each split's lines as it parses them
    (per_query_text) settles the numbers from its counts instead, and reads the input once."""
    ensure_readable(spark, path)
    return spark.read.text(path).select(
        F.col("value").alias("raw"),
        F.col("_metadata.file_path").alias("source"),
        F.col("_metadata.file_block_start").alias("block_start"),
    )


def numbered_lines(spark: SparkSession, path: str) -> DataFrame:
    """Lines of text file(s) with their 1-based line number: source, line, raw, and block_start
    (`split_lines`).

    Line numbers are computed without a Python pass over the data: Spark's hidden
    `_metadata` tells which file block each row came from, monotonically increasing
    ids are consecutive within a block, and only the per-block line counts (one row
    per input split, not per record) are combined with a small window.
    """
    rows = split_lines(spark, path).withColumn("row_id", F.monotonically_increasing_id())
    blocks = (
        rows.groupBy("source", "block_start")
        .agg(F.count(F.lit(1)).alias("n"), F.min("row_id").alias("first_row_id"))
        .withColumn(
            "lines_before",
            F.coalesce(
                F.sum("n").over(
                    Window.partitionBy("source").orderBy("block_start").rowsBetween(Window.unboundedPreceding, -1)
                ),
                F.lit(0),
            ),
        )
    )
    return (
        rows.join(F.broadcast(blocks), on=["source", "block_start"], how="inner")
        .select(
            "source",
            (F.col("lines_before") + F.col("row_id") - F.col("first_row_id") + 1).alias("line"),
            "raw",
            "block_start",
        )
    )


def whitespace_fields(spark: SparkSession, path: str, n_fields: int, layout: str) -> DataFrame:
    """Non-blank lines split on whitespace and checked for `n_fields` fields (label files).

    Columns: source, line, record (null), raw, f (the fields; null when the count is
    wrong), parse_rule and parse_reason (set when the count is wrong).
    """
    fields = F.split(strip(F.col("raw")), r"\s+")
    utf8 = F.is_valid_utf8("raw")
    ok = utf8 & (F.size(fields) == n_fields)
    return numbered_lines(spark, path).where(strip(F.col("raw")) != "").select(
        "source", "line", F.lit(None).cast("string").alias("record"), "raw",
        F.when(ok, fields).alias("f"),
        F.when(~ok, F.lit("unparseable")).alias("parse_rule"),
        F.when(~utf8, F.lit(NOT_UTF8))
        .when(~ok, F.format_string(f"expected {n_fields} whitespace-separated fields ({layout}), got %d",
                                   F.size(fields))).alias("parse_reason"),
    )


def strip(text: Column) -> Column:
    """`text` without leading and trailing whitespace of any kind (F.trim removes spaces only)."""
    return F.regexp_replace(text, f"^{WHITESPACE}+|{WHITESPACE}+$", "")


NOT_UTF8 = "the line is not valid UTF-8 text (binary data?)"


def truncate_raw(col: str = "raw"):
    """The first RAW_MAX_CHARS characters, made valid UTF-8 (Spark keeps a text line's bytes as they were)."""
    return F.substring(F.make_valid_utf8(F.col(col)), 1, RAW_MAX_CHARS)
