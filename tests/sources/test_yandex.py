from clickeval_spark.config import IngestConfig
from tests.sources.helpers import rules, run, write

LOG = (
    "10\t0\tQ\t100\t2\tu1\tu2\tu3\n"
    "10\t5\tC\tu2\n"
    "10\t9\tQ\t101\t2\tu4\tu2\tu5\n"
    "10\t12\tC\tu2\n"      # belongs to the latest query showing u2: the second SERP
    "10\t15\tC\tu1\n"      # u1 only on the first SERP: goes back to it
    "11\t0\tQ\t100\t2\tu3\tu1\tu2\n"
    "11\t3\tC\tu9\n"       # no query line shows u9
    "11\t4\tX\tfoo\n"      # unknown action type
    "11\n"                # truncated line
)


def test_clicks_attach_to_latest_query_showing_the_url(spark, tmp_path):
    path = write(tmp_path / "log.txt", LOG)
    labels = write(tmp_path / "labels.txt", "100\t2\tu1\t1\n100\t2\tu2\t0\n100\t2\n")
    out = run(spark, IngestConfig(dataset="y", format="yandex", paths={"all": path}, labels=labels))
    serps = sorted((r["serp_id"], r["query_id"], r["doc_ids"], r["clicks"]) for r in out.serps.collect())
    assert serps == [
        ("10-1", "100", ["u1", "u2", "u3"], [1, 1, 0]),
        ("10-2", "101", ["u4", "u2", "u5"], [0, 1, 0]),
        ("11-1", "100", ["u3", "u1", "u2"], [0, 0, 0]),
    ]
    assert rules(out) == [("3", "unparseable"), ("7", "unparseable"), ("8", "unparseable"), ("9", "unparseable")]
    assert out.counts["serps_read"] == out.serps.count() + out.quarantine.where("target = 'serps'").count()
    assert sorted(tuple(r) for r in out.labels.select("query_id", "doc_id", "relevance").collect()) == [
        ("100", "u1", 1), ("100", "u2", 0)]
