"""The input rules of DESIGN §3: every record either becomes a canonical row or a quarantine row.

Readers produce a *parsed* frame (sources/parsed.py: PARSED_SERPS, PARSED_LABELS): the canonical columns (possibly null or
ill-formed) plus where the record came from (source, line or record locator,
raw text; sources without lines add an `ordinal` that sorts in file order) and,
when the reader itself could not parse it, parse_rule and parse_reason. The
rules below are Spark SQL expressions evaluated in one pass; the first rule a
record breaks is its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.config import SPLITS
from clickeval_spark.sources.files import RAW_MAX_CHARS, WHITESPACE_CHARS, truncate_raw

# rule codes, in the order they are checked
SERP_RULES = (
    "unparseable",
    "missing_id",
    "empty_result_list",
    "length_mismatch",
    "click_not_binary",
    "rank_out_of_range",
    "unknown_split",
    "duplicate_serp_id",
)
# checked after those only for an input whose location names its day (`check_serps`' day)
DAY_RULES = ("other_day",)
LABEL_RULES = ("unparseable", "missing_id", "empty_result_list", "length_mismatch", "relevance_not_integer", "duplicate_label")


@dataclass(frozen=True)
class Checked:
    accepted: DataFrame
    quarantined: DataFrame
    # every input record with its rule (null: accepted; for SERPs, raw text only where a rule is broken,
    # persisted when asked: `check_serps`' keep)
    ruled: DataFrame | None = None


def _ruled(records: DataFrame, rules: list[tuple[str, Column, Column]]) -> DataFrame:
    """`records` with `rule` (the first rule whose condition holds, else null) and `reason` (that rule's).

    The reason is picked by the rule's code, so each condition is evaluated once per record, not again
    to choose the reason (benchmarks/RESULTS.md)."""
    rule = F.when(rules[0][1], F.lit(rules[0][0]))
    for code, broken, _ in rules[1:]:
        rule = rule.when(broken, F.lit(code))
    reason = F.lit(None).cast("string")
    for code, _, why in reversed(rules):
        reason = F.when(F.col("rule") == code, why).otherwise(reason)
    return records.withColumn("rule", rule).withColumn("reason", reason)


def blank_text(text: Column) -> Column:
    """Null, empty, or only whitespace of any kind (tabs, newlines, Unicode spaces): not an id."""
    # A text whose first byte is printable ASCII other than space ("!" <= text < DEL, compared as bytes) is
    # not blank: that settles nearly every id without a copy. Only the rest is trimmed, since trimming a list of
    # characters scans the list for each character, and the regex ^WHITESPACE*$ first copies each id into a
    # Java string: either alone on every doc id is a measurable share of the ingest (benchmarks/RESULTS.md).
    printable_first = (text >= F.lit("!")) & (text < F.lit("\x7f"))
    return text.isNull() | (~printable_first & (F.btrim(text, F.lit(WHITESPACE_CHARS)) == ""))


def _blank(col: str) -> Column:
    return blank_text(F.col(col))


def check_serps(parsed: DataFrame, *, max_rank: int, keep: StorageLevel | None = None,
                numbered_ids: bool = False, day: date | None = None) -> Checked:
    """Apply every SERP rule; duplicates of a serp_id keep the first record in file order.

    ``keep``: persist the ruled records at that level (raw text only on the quarantined ones), so that
    the accepted rows, the quarantine and their counts share one evaluation of the parse, the rules and the
    duplicates' window, instead of one each. ``numbered_ids``: the reader made every serp_id from
    its session id and the record's position in it (`per_query_text`), so no two records share one and
    the duplicates' window is skipped. ``day``: the input holds that day's records only (its location names
    the day): a record whose log_date is another day breaks `other_day`."""
    n_docs = F.size("doc_ids")
    rules = [
        ("unparseable", F.col("parse_rule").isNotNull(), F.col("parse_reason")),
        ("missing_id",
         _blank("session_id") | _blank("query_id") | _blank("serp_id")
         | F.coalesce(F.exists("doc_ids", blank_text), F.lit(False)),
         F.lit("session id, query id, serp id and every doc id must be present")),
        ("empty_result_list", F.col("doc_ids").isNull() | (n_docs == 0), F.lit("the result list is empty")),
        ("length_mismatch",
         F.col("clicks").isNull() | (F.size("clicks") != n_docs)
         | (F.col("vtypes").isNotNull() & (F.size("vtypes") != n_docs)),
         F.format_string("%d docs, %d clicks, %d vtypes: lengths must match",
                         n_docs, F.size("clicks"), F.coalesce(F.size("vtypes"), n_docs))),
        ("click_not_binary", F.exists("clicks", lambda c: c.isNull() | ~c.isin(0, 1)),
         F.concat(F.lit("click values must be 0 or 1, got "), F.to_json("clicks"))),
        ("rank_out_of_range",
         (n_docs > max_rank)
         | F.coalesce(F.exists("result_ranks", lambda r: r.isNull() | (r < 1) | (r > max_rank)), F.lit(False))
         # result ranks, where the source names them, must be exactly 1..n
         | F.coalesce(F.col("result_ranks") != F.sequence(F.lit(1), F.greatest(n_docs, F.lit(1))), F.lit(False))
         | F.coalesce(F.exists("click_ranks", lambda r: r.isNull() | (r < 1) | (r > n_docs)), F.lit(False)),
         F.format_string("ranks must lie in 1..%d (list of %d results, result ranks %s, click ranks %s)",
                         F.least(F.lit(max_rank), n_docs), n_docs,
                         F.coalesce(F.to_json("result_ranks"), F.lit("-")),
                         F.coalesce(F.to_json("click_ranks"), F.lit("-")))),
        ("unknown_split", F.col("split").isNull() | ~F.col("split").isin(*SPLITS),
         F.format_string("split %s is not one of %s", F.coalesce(F.col("split"), F.lit("null")),
                         F.lit(", ".join(SPLITS)))),
    ]
    if day is not None:
        rules.append(("other_day", F.col("log_date") != F.lit(day),
                      F.format_string("the record's own time gives log_date %s; this input holds log_date %s's records "
                                      "(ingest.paths names the day)", F.col("log_date").cast("string"),
                                      F.lit(day.isoformat()))))
    ruled = _ruled(parsed, rules)
    if not numbered_ids:
        ruled = _flag_duplicates(ruled, "serp_id", "duplicate_serp_id", F.format_string("serp_id %s", F.col("serp_id")))
    # the raw text is read only by the quarantine: an accepted record's is dropped, so `keep` does not hold
    # every record's text for nothing
    ruled = ruled.withColumn("raw", F.when(F.col("rule").isNotNull(), F.col("raw")))
    if keep is not None:
        ruled = ruled.persist(keep)
    return Checked(accepted_serps(ruled), quarantine_rows(ruled, "serps"), ruled=ruled)


def accepted_serps(ruled: DataFrame) -> DataFrame:
    """The SERP records that broke no rule, as the serps table's rows (`check_serps`' accepted)."""
    return ruled.where(F.col("rule").isNull()).select(
        "dataset", "split", "session_id", "serp_id", F.col("serp_pos").cast("int").alias("serp_pos"),
        "query_id", "doc_ids", "vtypes", "clicks", "log_date",
    )


def check_labels(parsed: DataFrame) -> Checked:
    """Label rules, one record per input line (a labelled SERP, or one TianGong label line).

    Parsed label columns: source, line, record, raw, parse_rule, parse_reason, dataset,
    session_id, query_id, serp_id, label_key (what makes a label a duplicate),
    doc_ids array<string>, relevances array<string>. Accepted records are exploded
    to one relevance_labels row per doc, with its 1-based rank on the labelled SERP.
    """
    n_docs = F.size("doc_ids")
    rules = [
        ("unparseable", F.col("parse_rule").isNotNull(), F.col("parse_reason")),
        ("missing_id", _blank("query_id") | F.coalesce(F.exists("doc_ids", blank_text), F.lit(False)),
         F.lit("query id and doc ids must be present")),
        ("empty_result_list", F.col("doc_ids").isNull() | (n_docs == 0), F.lit("no judged documents")),
        ("length_mismatch", F.col("relevances").isNull() | (F.size("relevances") != n_docs),
         F.format_string("%d docs, %d relevance grades: lengths must match", n_docs, F.size("relevances"))),
        ("relevance_not_integer",
         F.exists("relevances", lambda r: r.isNull() | r.try_cast("int").isNull() | (r.try_cast("int").cast("string") != F.trim(r))),
         F.concat(F.lit("relevance grades must be integers, got "), F.to_json("relevances"))),
    ]
    ruled = _flag_duplicates(_ruled(parsed, rules),
                             "label_key", "duplicate_label", F.format_string("label %s", F.col("label_key")))
    passed = ruled.where(F.col("rule").isNull())
    accepted = (
        passed
        .select("dataset", "session_id", "query_id", "serp_id",
                F.posexplode(F.arrays_zip("doc_ids", "relevances")).alias("pos", "label"))
        .select(
            "dataset", "query_id",
            F.col("label.doc_ids").alias("doc_id"),
            F.trim(F.col("label.relevances")).try_cast("int").alias("relevance"),
            "serp_id",
            F.when(F.col("serp_id").isNotNull(), F.col("pos") + 1).cast("int").alias("rank"),
            "session_id",
        )
    )
    return Checked(accepted, quarantine_rows(ruled, "relevance_labels"), ruled=ruled)


def _flag_duplicates(ruled: DataFrame, key: str, code: str, what: Column) -> DataFrame:
    """Among records that broke no other rule, the first of each key in file order stays; later ones break `code`.

    Only valid records compete: a broken record never pushes out a good one with the same key.
    """
    valid = F.col("rule").isNull()
    # file order: line numbers, or an `ordinal` where a source has no lines (XML: split offset, row, position)
    order = [c for c in ("source", "line", "ordinal", "record") if c in ruled.columns]
    first_in_file = Window.partitionBy("dataset", key, valid).orderBy(*order)
    later = valid & (F.row_number().over(first_in_file) > 1)
    return ruled.select(
        *[c for c in ruled.columns if c not in ("rule", "reason")],
        F.when(later, F.lit(code)).otherwise(F.col("rule")).alias("rule"),
        F.when(later, F.concat(what, F.lit(" already seen earlier in the input"))).otherwise(F.col("reason"))
        .alias("reason"),
    )


def quarantine_rows(ruled: DataFrame, target: str) -> DataFrame:
    """The quarantine table's rows of the ruled records that broke a rule (`Checked.quarantined`). Reasons and
    locators quote input (click lists, ids, XML attributes): they are cut like the raw text."""
    return ruled.where(F.col("rule").isNotNull()).select(
        "dataset",
        F.lit(target).alias("target"),
        "source",
        F.col("line").cast(T.LongType()).alias("line"),
        truncate_raw("record").alias("record"),
        truncate_raw("raw").alias("raw"),
        "rule",
        F.when(F.length("reason") > RAW_MAX_CHARS,
               F.concat(F.substring("reason", 1, RAW_MAX_CHARS - 3), F.lit("...")))
        .otherwise(F.col("reason")).alias("reason"),
    )
