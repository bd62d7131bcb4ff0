"""One bad record per DESIGN §3 rule; every good record survives; read = accepted + quarantined."""

from pyspark.sql import functions as F

from clickeval_spark.config import IngestConfig
from clickeval_spark.validation import SERP_RULES
from tests.sources.helpers import rules, run, write

GOOD = [
    "1\t10\t[1, 2, 3]\t[0, 0, 0]\t[0, 1, 0]",
    "1\t11\t[4, 5, 6]\t[0, 0, 0]\t[0, 0, 0]",
    "2\t10\t[1, 2, 3]\t[0, 0, 0]\t[1, 0, 1]",
]
BAD = {
    "unparseable": "3\t10\t[1, 2, 3\t[0, 0, 0]\t[0, 1, 0]",               # broken JSON list
    "missing_id": "\t10\t[1, 2, 3]\t[0, 0, 0]\t[0, 1, 0]",                # no session id
    "empty_result_list": "4\t10\t[]\t[]\t[]",
    "length_mismatch": "5\t10\t[1, 2, 3]\t[0, 0, 0]\t[0, 1]",
    "click_not_binary": "6\t10\t[1, 2, 3]\t[0, 0, 0]\t[0, 2, 0]",
    "rank_out_of_range": "7\t10\t[1, 2, 3, 4]\t[0, 0, 0, 0]\t[0, 0, 0, 1]",  # 4 results, max_rank 3
}


def test_each_rule_quarantines_its_record_and_keeps_every_good_one(spark, tmp_path):
    lines = GOOD + list(BAD.values())
    path = write(tmp_path / "train.txt", "\n".join(lines) + "\n")
    out = run(spark, IngestConfig(dataset="t", format="per_query_text", paths={"train": path}, max_rank=3))
    expected = sorted((str(len(GOOD) + i + 1), rule) for i, rule in enumerate(BAD))
    assert rules(out) == expected
    assert sorted(r["serp_id"] for r in out.serps.select("serp_id").collect()) == ["1-1", "1-2", "2-1"]
    assert out.counts["serps_read"] == len(lines) == out.serps.count() + out.quarantine.count()
    q = out.quarantine.where(F.col("rule") == "length_mismatch").first()
    assert q["raw"] == BAD["length_mismatch"] and q["source"].endswith("train.txt")
    assert q["reason"] == "3 docs, 2 clicks, 3 vtypes: lengths must match"


def test_duplicate_serp_id_keeps_the_first(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "session_id": ["s1", "s1", "s2"],
        "serp_id": ["a", "a", "b"],
        "query_id": ["q", "q", "q"],
        "doc_ids": [["d1", "d2"], ["d1", "d2"], ["d2", "d1"]],
        "clicks": [[1, 0], [0, 0], [0, 1]],
        "split": ["train", "train", "holdout"],
    })
    path = str(tmp_path / "serps.parquet")
    pq.write_table(table, path)
    out = run(spark, IngestConfig(dataset="t", format="parquet", paths={"all": path}))
    assert sorted(r["rule"] for r in out.quarantine.collect()) == ["duplicate_serp_id", "unknown_split"]
    kept = out.serps.collect()
    assert [(r["serp_id"], r["clicks"]) for r in kept] == [("a", [1, 0])]  # the first row of the file wins
    dup = out.quarantine.where("rule = 'duplicate_serp_id'").first()
    assert dup["line"] == 2 and '"clicks":[0,0]' in dup["raw"]
    unknown = out.quarantine.where("rule = 'unknown_split'").first()
    assert "holdout" in unknown["reason"] and unknown["record"] == "serp_id=b"


def test_every_serp_rule_is_exercised():
    covered = set(BAD) | {"duplicate_serp_id", "unknown_split"}
    assert covered == set(SERP_RULES)
