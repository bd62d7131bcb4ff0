"""The parsed record: what every source reader returns and validation checks.

A reader sets the columns its format has and ends with `to_parsed`, which adds the
others as nulls and casts every column to the schema's type, so the readers differ
only in what they parse.
"""

from __future__ import annotations

from typing import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

_S, _I, _L = T.StringType(), T.IntegerType(), T.LongType()
_STRINGS, _INTS = T.ArrayType(_S), T.ArrayType(_I)

# where the record came from and whether it parsed: every parsed row, SERP or label
_ORIGIN = [
    T.StructField("source", _S),         # the file (or generator) it was read from
    T.StructField("line", _L),           # 1-based line or row number; null where the format has none
    T.StructField("record", _S),         # how a person finds the record (e.g. "session 7 interaction 2")
    T.StructField("raw", _S),            # the record's text, kept for quarantine
    T.StructField("parse_rule", _S),     # "unparseable" when the reader could not parse it
    T.StructField("parse_reason", _S),
    T.StructField("dataset", _S),
]

#: one row per SERP record (validation.check_serps' input)
PARSED_SERPS = T.StructType(_ORIGIN + [
    T.StructField("split", _S),
    T.StructField("session_id", _S),
    T.StructField("serp_pos", _I),
    T.StructField("serp_id", _S),
    T.StructField("query_id", _S),
    T.StructField("doc_ids", _STRINGS),
    T.StructField("vtypes", _STRINGS),
    T.StructField("clicks", _INTS),
    T.StructField("click_ranks", _INTS),   # where the source lists clicks by rank (TianGong-ST)
    T.StructField("result_ranks", _INTS),  # where the source numbers its results (TianGong-ST)
    T.StructField("log_date", T.DateType()),
])

#: one row per label record: a labelled SERP or one label line (validation.check_labels' input)
PARSED_LABELS = T.StructType(_ORIGIN + [
    T.StructField("session_id", _S),
    T.StructField("query_id", _S),
    T.StructField("serp_id", _S),
    T.StructField("label_key", _S),        # what makes two label records duplicates
    T.StructField("doc_ids", _STRINGS),
    T.StructField("relevances", _STRINGS),
])


def to_parsed(df: DataFrame, schema: T.StructType = PARSED_SERPS, keep: Sequence[str] = ()) -> DataFrame:
    """`df` in the layout of `schema`: its columns in order and cast to their types, missing ones null;
    `keep` names reader-specific columns carried after them (e.g. TianGong's file ordinal)."""
    present = set(df.columns)   # one schema request: `df.columns` asks the JVM each time
    return df.select(
        *[(F.col(f.name) if f.name in present else F.lit(None)).cast(f.dataType).alias(f.name) for f in schema],
        *keep,
    )


def to_parsed_labels(df: DataFrame) -> DataFrame:
    return to_parsed(df, PARSED_LABELS)
