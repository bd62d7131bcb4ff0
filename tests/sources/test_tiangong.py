from clickeval_spark.config import IngestConfig
from tests.sources.helpers import interaction, rules, run, write


XML = (
    "<root>\n"
    f'<session num="1">{interaction(1, "q1", ["d1", "d2", "d3"], [2])}'
    f'{interaction(2, "q2", ["d4", "d5", "d6"], [1, 3])}</session>\n'
    f'<session num="2">{interaction(1, "q1", ["d2", "d1", "d3"], [])}</session>\n'
    f'<session num="3">{interaction(1, "q3", ["d7", "d8"], [5])}</session>\n'          # click rank 5 of 2 results
    f'<session num="4">{interaction(1, "q3", ["d7", "d8"], [], ranks=[1, 3])}</session>\n'  # result ranks 1,3
    "</root>\n"
)
LABELS = (
    "1 1 1 1 3\n"      # numeric ids: session 1, query q1, doc d1
    "2 1 1 2 1\n"
    "3 2 1 3 0\n"
    "4 1 2 4 2\n"
    "5 9 9 9 4\n"      # matches no SERP: kept, serp_id null
    "6 1 1 x\n"        # 4 fields: unparseable
    "7 1 1 3 high\n"   # grade not an integer
)


def test_xml_sessions_labels_and_rank_rules(spark, tmp_path):
    xml = write(tmp_path / "sessions.xml", XML)
    labels = write(tmp_path / "labels.txt", LABELS)
    cfg = IngestConfig(dataset="tg", format="tiangong_xml", paths={"all": xml}, labels=labels,
                       label_query_prefix="q", label_doc_prefix="d")
    out = run(spark, cfg)
    serps = sorted((r["serp_id"], r["session_id"], r["serp_pos"], r["query_id"], r["doc_ids"], r["vtypes"], r["clicks"])
                   for r in out.serps.collect())
    assert serps == [
        ("1-1", "1", 1, "q1", ["d1", "d2", "d3"], ["1", "1", "1"], [0, 1, 0]),
        ("1-2", "1", 2, "q2", ["d4", "d5", "d6"], ["1", "1", "1"], [1, 0, 1]),
        ("2-1", "2", 1, "q1", ["d2", "d1", "d3"], ["1", "1", "1"], [0, 0, 0]),
    ]
    assert rules(out) == [
        ("6", "unparseable"), ("7", "relevance_not_integer"),
        ("session 3 interaction 1", "rank_out_of_range"), ("session 4 interaction 1", "rank_out_of_range"),
    ]
    got = sorted(tuple(r) for r in out.labels.select("query_id", "doc_id", "relevance", "serp_id", "rank").collect())
    assert got == [
        ("q1", "d1", 3, "1-1", 1), ("q1", "d2", 1, "1-1", 2), ("q1", "d3", 0, "2-1", 3),
        ("q2", "d4", 2, "1-2", 1), ("q9", "d9", 4, None, None),
    ]


def test_malformed_session_is_quarantined_whole(spark, tmp_path):
    broken = XML.replace('<session num="2">', '<session num="2"><interaction num="1"><query_id>q1</bad>')
    xml = write(tmp_path / "sessions.xml", broken)
    out = run(spark, IngestConfig(dataset="tg", format="tiangong_xml", paths={"all": xml}))
    assert out.counts["serps_read"] == out.serps.count() + out.quarantine.count()
    assert sorted(r["serp_id"] for r in out.serps.collect()) == ["1-1", "1-2"]
    bad = out.quarantine.where("rule = 'unparseable'").collect()
    assert len(bad) == 1 and "</bad>" in bad[0]["raw"] and bad[0]["record"].startswith("session")
