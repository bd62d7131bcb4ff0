"""Label rules, and ingest results that must not depend on how the input is split into partitions."""


import pytest
from clickeval_spark.config import IngestConfig
from clickeval_spark.validation import LABEL_RULES
from tests.sources.helpers import rules, run, write

SERPS = "1\t10\t[1, 2, 3]\t[0, 0, 0]\t[0, 1, 0]\n2\t11\t[4, 5]\t[0, 0]\t[0, 0]\n"
LABELS = [
    "9\t10\t[1, 2, 3]\t[0, 0, 0]\t[0, 0, 0]\t[2, 0, 1]",     # good
    "9\t11\t[4, 5]\t[0, 0]\t[0, 0]\t[1, 0]",                 # good
    "8\t10\t[1, 2]\t[0, 0]\t[0, 0]\t[1, 2, 3]",              # length_mismatch
    "8\t\t[1, 2]\t[0, 0]\t[0, 0]\t[1, 2]",                   # missing_id
    "8\t12\t[]\t[]\t[]\t[]",                                 # empty_result_list
    "8\t10\t[1, 2]\t[0, 0]\t[0, 0]\t[1, 2.5]",               # relevance_not_integer
    "9\t10\t[1, 2, 3]",                                      # unparseable
]


def test_label_rules_one_bad_record_each(spark, tmp_path):
    cfg = IngestConfig(dataset="t", format="per_query_text", paths={"train": write(tmp_path / "s.txt", SERPS)},
                       labels=write(tmp_path / "l.txt", "\n".join(LABELS) + "\n"))
    out = run(spark, cfg)
    assert rules(out) == [("3", "length_mismatch"), ("4", "missing_id"), ("5", "empty_result_list"),
                          ("6", "relevance_not_integer"), ("7", "unparseable")]
    assert out.counts["labels_read"] == 7 and out.counts["labels_accepted"] == 2
    got = sorted(tuple(r) for r in out.labels.select("serp_id", "query_id", "doc_id", "relevance", "rank").collect())
    assert got == [("label:9-1", "10", "1", 2, 1), ("label:9-1", "10", "2", 0, 2), ("label:9-1", "10", "3", 1, 3),
                   ("label:9-2", "11", "4", 1, 1), ("label:9-2", "11", "5", 0, 2)]


def test_duplicate_label_after_id_mapping_is_quarantined_not_lost(spark, tmp_path):
    xml = write(tmp_path / "s.xml", '<root><session num="1"><interaction num="1"><query_id>q5</query_id>'
                '<results><result rank="1"><docid>d7</docid></result></results><clicked/></interaction>'
                "</session></root>\n")
    labels = write(tmp_path / "l.txt", "1 1 5 7 2\n2 1 q5 d7 3\n3 1 5 7 x\n")
    out = run(spark, IngestConfig(dataset="tg", format="tiangong_xml", paths={"all": xml}, labels=labels,
                                  label_query_prefix="q", label_doc_prefix="d"))
    assert rules(out) == [("2", "duplicate_label"), ("3", "relevance_not_integer")]
    assert [tuple(r) for r in out.labels.select("query_id", "doc_id", "relevance", "serp_id", "rank").collect()] == [
        ("q5", "d7", 2, "1-1", 1)]


def test_broken_record_never_pushes_out_a_valid_one(spark, tmp_path):
    text = ("1\t10\t[1, 2]\t[0, 0]\t[0, 5]\n"    # serp 1-1, click_not_binary
            "1\t10\t[1, 2]\t[0, 0]\t[0, 1]\n")   # serp 1-2: valid
    out = run(spark, IngestConfig(dataset="t", format="per_query_text", paths={"train": write(tmp_path / "a", text)}))
    assert [r["serp_id"] for r in out.serps.collect()] == ["1-2"]
    assert rules(out) == [("1", "click_not_binary")]


def test_null_doc_id_is_quarantined(spark, tmp_path):
    text = "1\t10\t[1, null, 3]\t[0, 0, 0]\t[0, 0, 0]\n1\t10\t[1, 2, 3]\t[0, 0, 0]\t[0, 0, 0]\n"
    out = run(spark, IngestConfig(dataset="t", format="per_query_text", paths={"train": write(tmp_path / "a", text)}))
    assert rules(out) == [("1", "missing_id")] and out.serps.count() == 1


@pytest.mark.slow
def test_ingest_is_the_same_for_1_and_many_input_partitions(spark, tmp_path):
    lines = []
    for s in range(60):
        for q in range(4):
            clicks = [(s + q + r) % 3 == 0 for r in range(5)]
            lines.append(f"{s}\t{q}\t[{', '.join(str(10 * q + r) for r in range(5))}]\t[0, 0, 0, 0, 0]\t"
                         f"[{', '.join(str(int(c)) for c in clicks)}]")
    lines[17] = lines[17].replace("[0, 0, 0, 0, 0]", "[0, 0]", 1)  # one bad record somewhere in the middle
    cfg = IngestConfig(dataset="t", format="per_query_text",
                       paths={"all": write(tmp_path / "all.txt", "\n".join(lines) + "\n")})
    results, n_splits = [], []
    # one split vs ~20 splits of the same file (a high open cost stops Spark from splitting per core)
    for max_bytes, open_cost in (("128MB", "128MB"), ("700", "0")):
        spark.conf.set("spark.sql.files.maxPartitionBytes", max_bytes)
        spark.conf.set("spark.sql.files.openCostInBytes", open_cost)
        out = run(spark, cfg)
        results.append((
            sorted(tuple(r) for r in out.serps.select("serp_id", "split", "serp_pos", "clicks").collect()),
            rules(out),
            out.counts["serps_read"],
        ))
        n_splits.append(spark.read.text(str(tmp_path / "all.txt")).rdd.getNumPartitions())
    spark.conf.unset("spark.sql.files.maxPartitionBytes")
    spark.conf.unset("spark.sql.files.openCostInBytes")
    assert n_splits[0] == 1 and n_splits[1] > 10
    assert results[0] == results[1]
    assert results[0][1] == [("18", "length_mismatch")] and results[0][2] == 240


def test_every_label_rule_has_a_case():
    # the rules exercised above, by name: a new rule without a test shows up here
    assert set(LABEL_RULES) == {"unparseable", "missing_id", "empty_result_list", "length_mismatch",
                                "relevance_not_integer", "duplicate_label"}
