import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.config import IngestConfig
from clickeval_spark.sources import per_query_text
from clickeval_spark.validation import check_serps
from tests.sources.helpers import rules, run, write

GRAPHCM = (
    "7\t10\t[1, 2, 3]\t[0, 0, 1]\t[0, 1, 0]\n"
    "7\t11\t[4, 5, 6]\t[0, 0, 0]\t[1, 0, 0]\n"
    "8\t10\t[1, 3, 2]\t[0, 1, 0]\t[0, 0, 0]\n"
)
AICM = (
    "7\t10\t0\t0\t[1, 2, 3]\t[0, 0, 1]\t[0, 1, 0]\n"
    "7\t11\t0\t0\t[4, 5, 6]\t[0, 0, 0]\t[1, 0, 0]\n"
    "8\t10\t0\t0\t[1, 3, 2]\t[0, 1, 0]\t[0, 0, 0]\n"
)
EXPECTED_SCHEMA = T.StructType([
    T.StructField("serp_id", T.StringType()),
    T.StructField("session_id", T.StringType()),
    T.StructField("serp_pos", T.IntegerType()),
    T.StructField("query_id", T.StringType()),
    T.StructField("doc_ids", T.ArrayType(T.StringType())),
    T.StructField("vtypes", T.ArrayType(T.StringType())),
    T.StructField("clicks", T.ArrayType(T.IntegerType())),
    T.StructField("split", T.StringType()),
])
EXPECTED_ROWS = [
    ("7-1", "7", 1, "10", ["1", "2", "3"], ["0", "0", "1"], [0, 1, 0], "train"),
    ("7-2", "7", 2, "11", ["4", "5", "6"], ["0", "0", "0"], [1, 0, 0], "train"),
    ("8-1", "8", 1, "10", ["1", "3", "2"], ["0", "1", "0"], [0, 0, 0], "train"),
]


def _select(df):
    return df.select([F.col(f.name).cast(f.dataType) for f in EXPECTED_SCHEMA.fields]).orderBy("serp_id")


@pytest.mark.parametrize("variant,text", [("graphcm", GRAPHCM), ("aicm", AICM), ("auto", GRAPHCM), ("auto", AICM)])
def test_both_layouts_give_the_same_serps(spark, tmp_path, variant, text):
    path = write(tmp_path / "train.txt", text)
    out = run(spark, IngestConfig(dataset="t", format="per_query_text", paths={"train": path}, text_variant=variant))
    expected = spark.createDataFrame(EXPECTED_ROWS, EXPECTED_SCHEMA)
    assert_df_equality(_select(out.serps), expected, ignore_nullable=True)
    assert out.quarantine.count() == 0


def test_wrong_layout_for_declared_variant_is_quarantined_with_line(spark, tmp_path):
    path = write(tmp_path / "train.txt", AICM)
    out = run(spark, IngestConfig(dataset="t", format="per_query_text", paths={"train": path}, text_variant="graphcm"))
    assert out.serps.count() == 0
    assert rules(out) == [("1", "unparseable"), ("2", "unparseable"), ("3", "unparseable")]
    reason = out.quarantine.where("line = 1").first()["reason"]
    assert reason == "expected 5 (graphcm) tab-separated fields, got 7"


@pytest.mark.slow
def test_label_files_in_both_layouts(spark, tmp_path):
    graphcm = write(tmp_path / "g.txt", "9\t12\t[1, 2]\t[0, 0]\t[0, 0]\t[3, -2]\n")
    aicm = write(tmp_path / "a.txt", "9\t12\t0\t0\t[1, 2]\t[0, 0]\t[0, 0]\t[3, -2]\n")
    serps = write(tmp_path / "s.txt", GRAPHCM)
    got = []
    for labels in (graphcm, aicm):
        cfg = IngestConfig(dataset="t", format="per_query_text", paths={"train": serps}, labels=labels)
        out = run(spark, cfg)
        got.append(sorted(tuple(r) for r in out.labels.select("query_id", "doc_id", "relevance", "serp_id", "rank",
                                                              "session_id").collect()))
    expected = [("12", "1", 3, "label:9-1", 1, "9"), ("12", "2", -2, "label:9-1", 2, "9")]
    assert got == [expected, expected]


def test_unsplit_file_is_split_by_session(spark, tmp_path):
    path = write(tmp_path / "all.txt", GRAPHCM)
    out = run(spark, IngestConfig(dataset="t", format="per_query_text", paths={"all": path}))
    rows = out.serps.select("session_id", "split").collect()
    by_session = {}
    for r in rows:
        by_session.setdefault(r["session_id"], set()).add(r["split"])
    assert all(len(s) == 1 for s in by_session.values())  # a session never straddles splits
    assert {s for v in by_session.values() for s in v} <= {"train", "valid", "test"}


def test_numbered_serp_ids_never_collide_so_the_duplicates_window_is_skipped(spark, tmp_path):
    """A serp id is '<session>-<position>': sessions named like other sessions' ids ('a-1' beside 'a', '1-1'
    beside '1'), spread over two files, blank ones among them, still give each valid record its own id, so the
    duplicates' window check_serps skips for this reader would flag nothing."""
    sessions = ["a", "a-1", "a-1-1", "a-11", "1", "1-1", " ", "a "]
    lines = [f"{s}\t{q}\t[{q}, 2]\t[0, 0]\t[0, 1]" for i in range(12) for q, s in enumerate(sessions, 3)]
    paths = {"train": write(tmp_path / "train.txt", "\n".join(lines[:50]) + "\n"),
             "valid": write(tmp_path / "valid.txt", "\n".join(lines[50:]) + "\n")}
    read = per_query_text.read_serps(spark, paths, "t", "graphcm").withColumn("log_date", F.lit(None).cast("date"))
    parsed = per_query_text.settled_positions(read)
    skipped, windowed = (check_serps(parsed, max_rank=10, numbered_ids=n).ruled for n in (True, False))
    assert_df_equality(skipped, windowed, ignore_row_order=True)
    ids = [r["serp_id"] for r in skipped.where(F.col("rule").isNull()).collect()]
    assert len(ids) == 7 * 12 and len(set(ids)) == len(ids) and {"a-1-1", "a-1-11", "a-11-1", "1-1-1"} <= set(ids)
    assert skipped.where(F.col("rule").isNotNull()).select("rule").distinct().collect() == [("missing_id",)]
