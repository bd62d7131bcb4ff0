"""validation.check_serps / check_labels on literal parsed rows (sources.parsed.PARSED_SERPS / PARSED_LABELS):
each record is accepted exactly as expected or quarantined with the rule and reason the contract names."""

import datetime

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.sources.parsed import PARSED_LABELS, PARSED_SERPS, to_parsed
from clickeval_spark.validation import blank_text, check_labels, check_serps

D = datetime.date(2026, 11, 30)
# source, line, record, raw, parse_rule, parse_reason, dataset, split, session_id, serp_pos, serp_id, query_id,
# doc_ids, vtypes, clicks, click_ranks, result_ranks, log_date
SERPS = [
    ("f", 1, None, "r1", None, None, "d", "train", "s1", 1, "s1-1", "q1", ["a", "b"], None, [0, 1], None, None, D),
    ("f", 2, None, "r2", "unparseable", "broken JSON", "d", "train", None, None, None, None, None, None, None, None,
     None, None),
    ("f", 3, None, "r3", None, None, "d", "train", "s2", 1, "s2-1", " ", ["a"], None, [0], None, None, None),
    ("f", 4, None, "r4", None, None, "d", "test", "s3", 1, "s3-1", "q1", [], None, [], None, None, None),
    ("f", 5, None, "r5", None, None, "d", "test", "s4", 1, "s4-1", "q1", ["a", "b"], ["x"], [0, 1], None, None, None),
    ("f", 6, None, "r6", None, None, "d", "test", "s5", 1, "s5-1", "q1", ["a"], None, [2], None, None, None),
    ("f", 7, None, "r7", None, None, "d", "test", "s6", 1, "s6-1", "q1", ["a", "b", "c"], None, [0, 0, 1], None,
     None, None),
    ("f", 8, None, "r8", None, None, "d", "dev", "s7", 1, "s7-1", "q1", ["a"], None, [1], None, None, None),
    ("f", 9, None, "r9", None, None, "d", "test", "s1", 1, "s1-1", "q2", ["c"], None, [1], None, None, None),
    ("f", 10, None, "r10", None, None, "d", "valid", "s8", 2, "s8-2", "q2", ["c", "a"], ["1", "2"], [1, 0],
     [1], [1, 2], None),
]


def test_check_serps_accepts_the_good_records_and_names_each_broken_rule(spark):
    checked = check_serps(spark.createDataFrame(SERPS, PARSED_SERPS), max_rank=2)
    accepted_schema = T.StructType([PARSED_SERPS[c] for c in ("dataset", "split", "session_id", "serp_id",
                                                              "serp_pos", "query_id", "doc_ids", "vtypes",
                                                              "clicks", "log_date")])
    expected = spark.createDataFrame([
        ("d", "train", "s1", "s1-1", 1, "q1", ["a", "b"], None, [0, 1], D),
        ("d", "valid", "s8", "s8-2", 2, "q2", ["c", "a"], ["1", "2"], [1, 0], None),
    ], accepted_schema)
    assert_df_equality(checked.accepted, expected, ignore_row_order=True, ignore_nullable=True)
    got = {(r["line"], r["rule"], r["reason"]) for r in checked.quarantined.collect()}
    assert got == {
        (2, "unparseable", "broken JSON"),
        (3, "missing_id", "session id, query id, serp id and every doc id must be present"),
        (4, "empty_result_list", "the result list is empty"),
        (5, "length_mismatch", "2 docs, 2 clicks, 1 vtypes: lengths must match"),
        (6, "click_not_binary", "click values must be 0 or 1, got [2]"),
        (7, "rank_out_of_range", "ranks must lie in 1..2 (list of 3 results, result ranks -, click ranks -)"),
        (8, "unknown_split", "split dev is not one of train, valid, test"),
        (9, "duplicate_serp_id", "serp_id s1-1 already seen earlier in the input"),
    }
    assert {r["target"] for r in checked.quarantined.collect()} == {"serps"}


def test_check_labels_explodes_a_labelled_serp_and_quarantines_bad_grades(spark):
    # source, line, record, raw, parse_rule, parse_reason, dataset, session_id, query_id, serp_id, label_key,
    # doc_ids, relevances
    rows = [
        ("l", 1, None, "x1", None, None, "d", "s1", "q1", "s1-1", "s1-1", ["a", "b"], ["2", " 0"]),
        ("l", 2, None, "x2", None, None, "d", None, "q1", None, "q1|c", ["c"], ["3"]),
        ("l", 3, None, "x3", None, None, "d", None, "q1", None, "q1|d", ["d"], ["high"]),
        ("l", 4, None, "x4", None, None, "d", None, "q1", None, "q1|e", ["e", "f"], ["1"]),
        ("l", 5, None, "x5", None, None, "d", None, "q1", None, "q1|c", ["c"], ["1"]),
    ]
    checked = check_labels(spark.createDataFrame(rows, PARSED_LABELS))
    schema = "dataset string, query_id string, doc_id string, relevance int, serp_id string, rank int, session_id string"
    expected = spark.createDataFrame([
        ("d", "q1", "a", 2, "s1-1", 1, "s1"),
        ("d", "q1", "b", 0, "s1-1", 2, "s1"),
        ("d", "q1", "c", 3, None, None, None),
    ], schema)
    assert_df_equality(checked.accepted, expected, ignore_row_order=True, ignore_nullable=True)
    got = {(r["line"], r["rule"]) for r in checked.quarantined.collect()}
    assert got == {(3, "relevance_not_integer"), (4, "length_mismatch"), (5, "duplicate_label")}


def test_to_parsed_fills_missing_columns_with_typed_nulls_and_casts_the_rest(spark):
    df = spark.createDataFrame([("f", 7, "s", "q", ["a"], [1])],
                               "source string, line int, session_id string, query_id string, doc_ids array<string>, "
                               "clicks array<bigint>")
    out = to_parsed(df)
    assert out.schema.fieldNames() == PARSED_SERPS.fieldNames()
    assert [f.dataType for f in out.schema] == [f.dataType for f in PARSED_SERPS]
    row = out.first()
    assert (row["line"], row["clicks"], row["serp_id"], row["log_date"]) == (7, [1], None, None)


@pytest.mark.parametrize("doc, blank", [("!", False), ("~", False), ("\x7f", False), ("\x00", False), ("é", False),
                                        ("\u3000x", False), (" x ", False), ("", True), (" ", True),
                                        ("\u3000\u2003", True), ("\x1c\x85\xa0", True), ("\t\x0b", True)])
def test_a_doc_id_is_blank_when_it_is_empty_or_only_whitespace_of_any_kind(spark, doc, blank):
    """`blank_text` settles ids by their first byte when it is printable ASCII other than space, and trims the
    rest: the boundaries of that shortcut ('!', '~', DEL) and ids that only start or end with whitespace."""
    assert blank == (doc.strip() == "")   # the contract: Python's str.isspace() whitespace
    [got] = spark.createDataFrame([([doc],)], "doc_ids array<string>").select(
        F.exists("doc_ids", blank_text).alias("blank")).collect()
    assert got["blank"] is blank
