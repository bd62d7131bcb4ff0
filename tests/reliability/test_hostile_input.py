"""Hostile input (issue 7, points 4 and 5).

Point 4: every hostile record lands in `quarantine` with its rule and reason, or the ingest job fails
with one line naming the file and the rule; nothing else is lost and the ingest's counts reconcile
read = accepted + quarantined (read from its `runs` row for per-query text; for XML and Yandex from
stages.ingest.write_ingest, which computes what the stage records). One input file per source format carries
all its cases, so each format costs one ingest.

Point 5: input text is never evaluated as code (list fields are JSON), and user-given names reach no
SQL predicate or path before they are checked against a safe pattern.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
import yaml
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from clickeval_spark import ingestion, tables
from clickeval_spark.context import StageContext
from clickeval_spark.stages import STAGES
from clickeval_spark.stages.ingest import write_ingest
from clickeval_spark.config import AppConfig, IngestConfig, load_config
from clickeval_spark.errors import ConfigError, InputError
from clickeval_spark.report_html import build_report
from clickeval_spark.sources.files import RAW_MAX_CHARS
from jobs import ingest as ingest_job
from tests.sources.helpers import interaction, rules, run, write

# minutes of Spark: `make test-fast` leaves it out (docs/development.md)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------------
# helpers


def _ingest(spark, warehouse, cfg: IngestConfig, run_id: str, *, stage: bool = True):
    """Ingest into Delta tables; returns (serps rows, quarantine rows, counts).

    stage=True runs the real ingest stage and returns the counts its `runs` row recorded (with status);
    stage=False runs the same parse, validate and write (ingestion.run_ingest + write_ingest) without the
    `runs` row, and returns the counts the stage would record: cheaper, for tests beyond the first.
    """
    if stage:
        STAGES["ingest"](StageContext(spark, AppConfig(ingest=cfg), warehouse, run_id))
        row = _run_row(spark, warehouse, run_id)
        assert row["status"] == "succeeded"
        counts = row["counts"]
    else:
        out = ingestion.run_ingest(spark, cfg, ingestion.parse_serps(spark, cfg), ingestion.parse_labels(spark, cfg),
                                   run_id)
        counts = write_ingest(StageContext(spark, AppConfig(ingest=cfg), warehouse, run_id), out)
    serps = tables.read_table(spark, warehouse, "serps").where(F.col("dataset") == cfg.dataset).collect()
    quarantine = tables.read_table(spark, warehouse, "quarantine").where(F.col("run_id") == run_id).collect()
    return serps, quarantine, counts


def _run_row(spark, warehouse, run_id):
    rows = tables.read_table(spark, warehouse, "runs").where(
        (F.col("run_id") == run_id) & (F.col("job") == "ingest")).collect()
    assert len(rows) == 1, rows
    return rows[0]


def _assert_reconciles(c, *, serp_records: int, label_records: int = 0) -> None:
    """Ingest counts: every record read is either accepted or quarantined, and read is what the files held."""
    assert c["serps_read"] == serp_records and c.get("labels_read", 0) == label_records
    assert c["read"] == serp_records + label_records
    assert c["read"] == c["accepted"] + c["quarantined"]
    assert c["serps_read"] == c["serps_accepted"] + c["serps_quarantined"]


def _assert_quarantine_rows_bounded(quarantine) -> None:
    for q in quarantine:
        assert q["rule"] and q["reason"], q
        assert len(q["raw"] or "") <= RAW_MAX_CHARS and len(q["reason"]) <= RAW_MAX_CHARS
        assert len(q["record"] or "") <= RAW_MAX_CHARS


# --------------------------------------------------------------------------------------------------
# point 4: per-query text


def _line(text, rule, end="\n"):
    return text, rule, end


# (physical line as Spark reads it, expected rule or None for accepted, what ends it)
PER_QUERY_LINES = [
    _line("s1\tq1\t[1, 2, 3]\t[0, 0, 0]\t[0, 1, 0]", None),
    # unicode and emoji ids, quotes and SQL in ids, escaped tab / newline / CR inside a doc id: kept verbatim
    _line('😀会话\t查询🔍\t["文档1", "d😀"]\t["1", "2"]\t[1, 0]', None),
    _line("'; DROP TABLE serps; --\tx' OR '1'='1\t[\"d'1\", \"d\\\"2\", \"d\\\\3\"]\t[0, 0, 0]\t[0, 0, 1]", None),
    _line('s2\tq2\t["tab\\there", "new\\nline", "cr\\rx"]\t[0, 0, 0]\t[1, 1, 0]', None),
    # click values NaN, negative, 2, fractional, null, out of int range
    _line("h1\tq\t[1, 2, 3]\t[0, 0, 0]\t[0, NaN, 1]", "unparseable"),
    _line("h2\tq\t[1, 2, 3]\t[0, 0, 0]\t[0, -1, 1]", "click_not_binary"),
    _line("h3\tq\t[1, 2, 3]\t[0, 0, 0]\t[2, 0, 1]", "click_not_binary"),
    _line("h4\tq\t[1, 2, 3]\t[0, 0, 0]\t[0, 0.5, 1]", "unparseable"),
    _line("h5\tq\t[1, 2, 3]\t[0, 0, 0]\t[0, null, 1]", "click_not_binary"),
    _line("h6\tq\t[1, 2, 3]\t[0, 0, 0]\t[0, 99999999999, 1]", "unparseable"),
    # click / vtype lists of the wrong length
    _line("h7\tq\t[1, 2, 3]\t[0, 0, 0]\t[0, 1, 0, 1]", "length_mismatch"),
    _line("h8\tq\t[1, 2, 3]\t[0, 0]\t[0, 1, 0]", "length_mismatch"),
    # text after a list, nested values: Spark's JSON parser alone would accept these
    _line("h9\tq\t[1, 2, 3]\t[0, 0, 0]\t[0, 1, 0]garbage", "unparseable"),
    _line("h10\tq\t[1, 2, 3]\t[0, 0, 0]\t[0, 1, 0][1]", "unparseable"),
    _line("h11\tq\t[1, [2], 3]\t[0, 0, 0]\t[0, 1, 0]", "unparseable"),
    _line('h12\tq\t[1, {"a": 2}, 3]\t[0, 0, 0]\t[0, 1, 0]', "unparseable"),
    # ids that are only whitespace (ideographic space, no-break space, an escaped tab) are missing ids
    _line("\u3000\tq\t[1]\t[0]\t[1]", "missing_id"),
    _line("h13\t\u00a0\t[1]\t[0]\t[1]", "missing_id"),
    _line('h14\tq\t["d1", "\\t"]\t[0, 0]\t[0, 1]', "missing_id"),
    # a raw tab inside an id shifts the fields; a raw newline or CR ends the line: each half is quarantined
    _line("h\t15\tq\t[1]\t[0]\t[1]", "unparseable"),
    _line('h16\tq\t["a', "unparseable"),
    _line('b"]\t[0]\t[1]', "unparseable"),
    _line("h17\tq\t[1]", "unparseable", end="\r"),
    _line("\t[0]\t[1]", "unparseable"),
]
BIG_DOCS = 400_000  # a line of ~6 MB: every list of the right length, every click a 2


def _per_query_file(tmp_path) -> tuple[str, list[tuple[str, str | None]]]:
    lines = list(PER_QUERY_LINES)
    docs = ", ".join(f'"d{i}"' for i in range(BIG_DOCS))
    lines.append(_line(f"big\tq\t[{docs}]\t[{', '.join(['0'] * BIG_DOCS)}]\t[{', '.join(['2'] * BIG_DOCS)}]",
                       "click_not_binary"))
    lines.append(_line("x" * 5_000_000, "unparseable"))  # several MB of one field
    lines.append(_line("s3\tq3\t[7]\t[0]\t[0]", None))  # a good line after the big ones
    body = "".join(text + end for text, _, end in lines).encode("utf-8")
    garbage = bytes(b for b in range(256) if b not in b"\r\n") * 4  # binary garbage, not UTF-8
    body += garbage + b"\n"
    path = tmp_path / "train.txt"
    path.write_bytes(body)
    expected = [(text, rule) for text, rule, _ in lines] + [(garbage.decode("utf-8", "replace"), "unparseable")]
    return str(path), expected


def test_per_query_text_hostile_lines_are_quarantined_and_reconciled(spark, warehouse, tmp_path):
    path, expected = _per_query_file(tmp_path)
    # 5 good lines of 29: the stage's quarantine-share guard is lifted to see them all land
    cfg = IngestConfig(dataset="hostile", format="per_query_text", paths={"train": path}, max_quarantine_share=1.0)
    serps, quarantine, counts = _ingest(spark, warehouse, cfg, "hostile-pq")  # counts: from its `runs` row

    got = {q["line"]: q["rule"] for q in quarantine}
    want = {i + 1: rule for i, (_, rule) in enumerate(expected) if rule is not None}
    assert got == want
    _assert_quarantine_rows_bounded(quarantine)
    for q in quarantine:  # each quarantined line keeps its text (cut) and names its file
        assert q["source"].endswith("train.txt")
        if q["line"] < len(expected):  # (the last line is binary: Java and Python replace bad bytes differently)
            assert q["raw"] == expected[q["line"] - 1][0][:RAW_MAX_CHARS]
    by_line = {q["line"]: q for q in quarantine}
    assert by_line[6]["reason"] == "click values must be 0 or 1, got [0,-1,1]"
    assert by_line[5]["reason"] == "field clicks is not a JSON list of integers"
    assert by_line[13]["reason"] == "field clicks is not a JSON list of integers"
    assert by_line[len(PER_QUERY_LINES) + 1]["reason"].startswith("click values must be 0 or 1, got [2,2,")

    accepted = {r["serp_id"]: r for r in serps}
    assert set(accepted) == {"s1-1", "😀会话-1", "'; DROP TABLE serps; ---1", "s2-1", "s3-1"}
    emoji = accepted["😀会话-1"]
    assert (emoji["session_id"], emoji["query_id"], emoji["doc_ids"], emoji["clicks"]) == (
        "😀会话", "查询🔍", ["文档1", "d😀"], [1, 0])
    sql = accepted["'; DROP TABLE serps; ---1"]
    assert (sql["session_id"], sql["query_id"], sql["doc_ids"]) == (
        "'; DROP TABLE serps; --", "x' OR '1'='1", ["d'1", 'd"2', "d\\3"])
    assert accepted["s2-1"]["doc_ids"] == ["tab\there", "new\nline", "cr\rx"]
    _assert_reconciles(counts, serp_records=len(expected))
    assert counts["serps_accepted"] == 5
    # the id "'; DROP TABLE serps; --" was data, nothing more: the table is there and answers by value
    view = tables.read_table(spark, warehouse, "serps")
    view.createOrReplaceTempView("hostile_serps")
    n = spark.sql("SELECT count(*) AS n FROM hostile_serps WHERE session_id = :sid",
                  args={"sid": "'; DROP TABLE serps; --"}).first()["n"]
    assert n == 1


# --------------------------------------------------------------------------------------------------
# point 4: TianGong-ST XML and its labels


def _session(num, *interactions, attrs=None):
    head = f'<session num="{num}">' if attrs is None else f"<session{attrs}>"
    return head + "".join(interactions) + "</session>\n"


TG_SESSIONS = [
    # unicode, quotes and SQL in ids (XML escapes, CDATA with a tab inside): accepted verbatim
    ("ok", _session("😀", '<interaction num="1"><query_id>q&apos;&quot;; DROP TABLE serps; --</query_id>'
                    '<results><result rank="1"><docid>d&lt;1&gt;</docid></result>'
                    '<result rank="2"><docid><![CDATA[d "2"\tx]]></docid></result></results>'
                    '<clicked><click num="1"><rank>2</rank></click></clicked></interaction>')),
    ("ok", _session("7", interaction(1, "q7", ["d71", "d72"], [1]))),
    ("ok", _session("11", interaction(1, "查询😀", ["文档😀", "d2"], []))),
    # invalid XML inside one session: an undefined entity, an external entity, a control character
    ("bad-entity", _session("2", interaction(1, "q&bogus;", ["d1"], []))),
    ("xxe", _session("3", interaction(1, "&xxe;", ["d1"], []))),
    ("control-char", _session("4", interaction(1, "q4", ["d\x01"], []))),
    # duplicate serp ids: a repeated session, a repeated interaction within a session
    ("dup-session", _session("7", interaction(1, "q7", ["d72", "d71"], [2]))),
    ("ok", _session("8", interaction(1, "q8", ["d1", "d2"], [1]), interaction(1, "q8", ["d2"], []))),
    # click ranks NaN, negative, 0 (clicks refer to results by rank)
    ("ok", _session("9", interaction(1, "q9", ["d1", "d2"], ["NaN"]), interaction(2, "q9", ["d1", "d2"], [-1]),
                    interaction(3, "q9", ["d1", "d2"], [0]))),
    # no results; no session num
    ("ok", _session("10", '<interaction num="1"><query_id>q10</query_id><results></results></interaction>')),
    ("ok", _session(None, interaction(1, "q12", ["d1"], []), attrs="")),
]
TG_EXPECTED_RULES = {
    "session 2": "unparseable", "session 3": "unparseable", "session 4": "unparseable",
    "session 7 interaction 1": "duplicate_serp_id", "session 8 interaction 1": "duplicate_serp_id",
    "session 9 interaction 1": "rank_out_of_range", "session 9 interaction 2": "rank_out_of_range",
    "session 9 interaction 3": "rank_out_of_range", "session 10 interaction 1": "empty_result_list",
    "session ? interaction 1": "missing_id",
    "session ?": "unparseable",  # the last session, cut short by the end of the file
}
TG_LABELS = [
    ("1 7 q7 d71 2", None),
    ("2 11 查询😀 文档😀 4", None),
    ("3 7 q7 d72 -1", None),           # a negative grade is an integer: kept (NDCG counts it as 0)
    ("4 99 q99 d99 1", None),          # matches no SERP: kept with serp_id null, counted
    ("5 7 q7 d71 0", "duplicate_label"),
    ("6 7 q7 d72 NaN", "relevance_not_integer"),
    ("7 7 q7 d72 2.5", "relevance_not_integer"),
    ("8 7 q7 d72", "unparseable"),
    ("9 7 q7 d'72;--\t1", None),       # quotes and SQL in a doc id: data
]


def test_tiangong_xml_hostile_sessions_and_labels(spark, warehouse, tmp_path):
    truncated = _session("13", interaction(1, "q13", ["d1", "d2"], [1]))[:70]
    xml = ('<?xml version="1.0"?>\n<!DOCTYPE root [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>\n<root>\n'
           + "".join(s for _, s in TG_SESSIONS) + truncated)
    xml_path = tmp_path / "sessions.xml"
    xml_path.write_text(xml, encoding="utf-8")
    label_lines = [text for text, _ in TG_LABELS]
    labels = tmp_path / "labels.txt"
    labels.write_bytes(("\n".join(label_lines) + "\n").encode("utf-8") + b"\xff\xfe\x00 \x01garbage\n")
    cfg = IngestConfig(dataset="hostile-tg", format="tiangong_xml", paths={"all": str(xml_path)},
                       labels=str(labels))
    serps, quarantine, c = _ingest(spark, warehouse, cfg, "hostile-tg", stage=False)

    serp_q = {q["record"]: q["rule"] for q in quarantine if q["target"] == "serps"}
    assert serp_q == TG_EXPECTED_RULES
    label_q = {q["line"]: q["rule"] for q in quarantine if q["target"] == "relevance_labels"}
    assert label_q == {**{i + 1: r for i, (_, r) in enumerate(TG_LABELS) if r}, len(TG_LABELS) + 1: "unparseable"}
    _assert_quarantine_rows_bounded(quarantine)
    xxe = next(q for q in quarantine if q["record"] == "session 3")
    assert "root:" not in xxe["raw"]  # the external entity was not resolved

    assert len([q for q in quarantine if q["target"] == "serps"]) == len(TG_EXPECTED_RULES)
    accepted = {r["serp_id"]: r for r in serps}
    assert set(accepted) == {"😀-1", "7-1", "11-1", "8-1"}
    emoji = accepted["😀-1"]
    assert (emoji["query_id"], emoji["doc_ids"], emoji["clicks"]) == (
        "q'\"; DROP TABLE serps; --", ["d<1>", 'd "2"\tx'], [0, 1])
    # duplicates: the first record in file order stays (session 7's first copy, session 8's first interaction)
    assert (accepted["7-1"]["doc_ids"], accepted["7-1"]["clicks"]) == (["d71", "d72"], [1, 0])
    assert accepted["8-1"]["doc_ids"] == ["d1", "d2"]

    labels_rows = tables.read_table(spark, warehouse, "relevance_labels").where(
        F.col("dataset") == "hostile-tg").collect()
    got = sorted((r["query_id"], r["doc_id"], r["relevance"], r["serp_id"]) for r in labels_rows)
    assert got == sorted([("q7", "d71", 2, "7-1"), ("查询😀", "文档😀", 4, "11-1"), ("q7", "d72", -1, "7-1"),
                          ("q99", "d99", 1, None), ("q7", "d'72;--", 1, None)])
    serp_records = len(accepted) + len(serp_q)
    _assert_reconciles(c, serp_records=serp_records, label_records=len(TG_LABELS) + 1)
    assert c["labels_accepted"] == 5 and c["labels_quarantined"] == 5
    # labels that match no SERP are kept and reported, not dropped
    assert c["label_rows_without_serp"] == 2 and c["label_pairs_not_in_serps"] == 2


# --------------------------------------------------------------------------------------------------
# point 4: Yandex log


def test_yandex_hostile_lines(spark, warehouse, tmp_path):
    many = "\t".join(f"u{i}" for i in range(300_000))  # a query line of a few MB
    text_lines = [
        ("😀\t0\tQ\tq'\";--\t2\tu'1\tu\"2\tu;3", None),      # 1: SERP 😀-1
        ("😀\t5\tC\tu\"2", "click"),                          # 2: clicks u"2
        ("😀\t6\tC\tu\"2", "click"),                          # 3: the same click again: still one click
        ("😀\t7\tC\tu9", "unparseable"),                      # 4: no query line shows u9
        ("7\t0\tC\tu1", "unparseable"),                       # 5: a click before any query of its session
        ("7\t1\tQ\t100\t2\tu1\tu2\t", None),                  # 6: trailing tab: SERP 7-1
        ("7\t2\tC\tu1 \t", "click"),                          # 7: trailing whitespace: clicks u1
        ("8\t0\tQ\t101\t2\t" + "\t".join(f"v{i}" for i in range(11)), "rank_out_of_range"),  # 8: 11 results
        ("8\t1\tQ\t101\t2\t" + many, "rank_out_of_range"),   # 9
        ("9\t0\tQ\t102", "unparseable"),                      # 10: truncated
        ("10\t0\tQ\t\u3000\t2\tu1", "missing_id"),             # 11: the query id is a space character
    ]
    body = "".join(t + "\n" for t, _ in text_lines).encode("utf-8") + b"\x00\xff\x80garbage\tbytes\n"  # 12
    path = tmp_path / "log.txt"
    path.write_bytes(body)
    labels = write(tmp_path / "labels.txt", "q'\";--\t2\tu'1\t1\nnope\t2\tuX\t3\n100\t2\tu1\tNaN\n")
    cfg = IngestConfig(dataset="hostile-y", format="yandex", paths={"all": str(path)}, labels=labels)
    serps, quarantine, counts = _ingest(spark, warehouse, cfg, "hostile-y", stage=False)

    want = {i + 1: r for i, (_, r) in enumerate(text_lines) if r not in (None, "click")}
    want[len(text_lines) + 1] = "unparseable"
    assert {q["line"]: q["rule"] for q in quarantine if q["target"] == "serps"} == want
    assert {q["line"]: q["rule"] for q in quarantine if q["target"] == "relevance_labels"} == {
        3: "relevance_not_integer"}
    _assert_quarantine_rows_bounded(quarantine)
    assert sorted((r["serp_id"], r["query_id"], r["doc_ids"], r["clicks"]) for r in serps) == [
        ("7-1", "100", ["u1", "u2"], [1, 0]),
        ("😀-1", "q'\";--", ["u'1", 'u"2', "u;3"], [0, 1, 0]),
    ]
    # records: query lines (SERPs) and the lines that could not join one; absorbed click lines are not records
    _assert_reconciles(counts, serp_records=2 + len(want), label_records=3)
    assert counts["label_pairs_not_in_serps"] == 1


# --------------------------------------------------------------------------------------------------
# point 4: files that hold no records or cannot be read fail the job with one line


def _job_conf(tmp_path, warehouse) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"spark": {"warehouse": warehouse, "conf": {}}}))
    return str(path)


def _main(conf, run_id, **settings) -> int:
    argv = ["--conf", conf, "--run-id", run_id]
    for key, value in settings.items():
        argv += ["--set", f"ingest.{key}={json.dumps(value)}"]
    return ingest_job.main(argv)


def test_unusable_files_fail_naming_file_and_rule(spark, tmp_path):
    good = write(tmp_path / "good.txt", "s1\tq1\t[1, 2]\t[0, 0]\t[0, 1]\n")
    empty = write(tmp_path / "empty.txt", "")
    folder = tmp_path / "folder"
    folder.mkdir()
    write(folder / "part-1.txt", "s2\tq1\t[1]\t[0]\t[1]\n")
    write(folder / "part-2.txt", "")
    write(folder / "_SUCCESS", "")  # a marker Spark skips: not an input
    garbage_gz = tmp_path / "log.txt.gz"
    garbage_gz.write_bytes(os.urandom(4096))
    garbage_xml = tmp_path / "garbage.xml"
    garbage_xml.write_bytes(os.urandom(4096).replace(b"<", b"."))
    no_session = write(tmp_path / "cut.xml", '<?xml version="1.0"?>\n<root>\n<sess')
    empty_xml = write(tmp_path / "empty.xml", "")
    empty_yandex = write(tmp_path / "empty-log.txt", "")
    good_log = write(tmp_path / "good-log.txt", "1\t0\tQ\t5\t2\tu1\tu2\n")
    blank_labels = write(tmp_path / "labels.txt", "\n  \n\t\n")  # blank lines are no label records
    cases = [
        ({"format": "per_query_text", "paths": {"train": good, "valid": empty}}, empty, "empty_input"),
        ({"format": "per_query_text", "paths": {"all": str(folder)}}, str(folder / "part-2.txt"), "empty_input"),
        ({"format": "per_query_text", "paths": {"train": str(garbage_gz)}}, str(garbage_gz), "unreadable_file"),
        ({"format": "tiangong_xml", "paths": {"all": str(garbage_xml)}}, str(garbage_xml), "empty_input"),
        ({"format": "tiangong_xml", "paths": {"all": no_session}}, no_session, "empty_input"),
        ({"format": "tiangong_xml", "paths": {"all": empty_xml}}, empty_xml, "empty_input"),
        ({"format": "yandex", "paths": {"all": empty_yandex}}, empty_yandex, "empty_input"),
        ({"format": "yandex", "paths": {"all": good_log}, "labels": blank_labels}, blank_labels, "empty_input"),
    ]
    for settings, culprit, rule in cases:
        with pytest.raises(InputError) as err:
            run(spark, IngestConfig(dataset="files", **settings))
        message = str(err.value)
        assert message.startswith(f"{culprit}: breaks rule {rule}: ") and "\n" not in message, message


def test_failed_ingest_job_prints_one_line_and_loses_nothing(spark, warehouse, tmp_path, capsys):
    conf = _job_conf(tmp_path, warehouse)
    good = write(tmp_path / "good.txt", "s1\tq1\t[1, 2]\t[0, 0]\t[0, 1]\n")
    assert _main(conf, "files-ok", dataset="files", format="per_query_text", paths={"train": good}) == 0
    serps_version = DeltaTable.forPath(spark, tables.table_path(warehouse, "serps")).history(1).first()["version"]
    capsys.readouterr()
    garbage_gz = tmp_path / "log.txt.gz"
    garbage_gz.write_bytes(os.urandom(4096))
    # a corrupt file next to a good one: the job stops at the first read, before any write
    rc = _main(conf, "corrupt-gz", dataset="files", format="per_query_text",
               paths={"train": good, "valid": str(garbage_gz)})
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith(f"clickeval ingest: error: {garbage_gz}: breaks rule unreadable_file: ")
    failed = _run_row(spark, warehouse, "corrupt-gz")
    assert failed["status"] == "failed" and str(garbage_gz) in json.loads(failed["details"])["error"]
    # nothing else lost: the dataset's serps are those of the last good ingest, untouched by the failures
    history = DeltaTable.forPath(spark, tables.table_path(warehouse, "serps")).history(1).first()
    assert history["version"] == serps_version
    kept = tables.read_table(spark, warehouse, "serps").where(F.col("dataset") == "files").collect()
    assert [(r["serp_id"], r["ingest_run_id"]) for r in kept] == [("s1-1", "files-ok")]


# --------------------------------------------------------------------------------------------------
# point 5: no input is evaluated as code


EVAL_BUILTINS = {"eval", "exec", "compile", "__import__", "literal_eval"}
UNPICKLERS = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "jsonpickle"}
UNSAFE_YAML = {"load", "load_all", "full_load", "full_load_all", "unsafe_load", "unsafe_load_all"}


def _code_evaluating_calls(tree: ast.AST) -> list[str]:
    """Calls that run text as code or rebuild objects from bytes: eval/exec/compile/literal_eval,
    unpicklers, YAML's object-building loaders, shell commands."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
        if ((name in EVAL_BUILTINS and owner in (None, "ast", "builtins"))
                or owner in UNPICKLERS
                or (owner == "yaml" and name in UNSAFE_YAML)
                or (owner == "os" and name in {"system", "popen"}) or owner == "subprocess"):
            found.append(f"{owner + '.' if owner else ''}{name}() line {node.lineno}")
    return found


def test_no_code_path_evaluates_text():
    """No eval/exec/literal_eval/pickle/marshal/unsafe YAML/os.system in the package, the jobs or the DAG:
    input text and config values are only ever parsed as data (JSON, safe YAML, Spark readers)."""
    offenders = {}
    for folder in ("clickeval_spark", "jobs", "deploy"):
        for path in (ROOT / folder).rglob("*.py"):
            calls = _code_evaluating_calls(ast.parse(path.read_text(), filename=str(path)))
            if calls:
                offenders[str(path.relative_to(ROOT))] = calls
    assert offenders == {}
    # the scanner itself sees what it looks for
    sample = ("ast.literal_eval(x)\neval(x)\npickle.loads(b)\nyaml.load(s)\n"
              "json.loads(s)\nyaml.safe_load(s)\nre.compile(p)\nF.from_json(c, t)\n")
    assert len(_code_evaluating_calls(ast.parse(sample))) == 4


def test_list_fields_are_json_never_code(spark, tmp_path):
    marker = tmp_path / "pwned"
    lines = [
        f"1\tq\t[1, 2]\t[0, 0]\t__import__('os').system('touch {marker}')",
        f"2\tq\t__import__('os').system('touch {marker}')\t[0, 0]\t[0, 1]",
        "3\tq\t[1, 2]\t[0, 0]\t(0, 1)",                 # a Python tuple
        "4\tq\t[1, 2]\t[0, 0]\t[True, False]",          # Python booleans
        "5\tq\t[1, 2]\t[0, 0]\t[0, 1,]",                # Python's trailing comma
        "6\tq\t[1, 2]\t[0, 0]\t[0, 1 if True else 0]",  # an expression
        "7\tq\t[1, 2]\t[0, 0]\t[0, 1]",                 # JSON: the one good line
    ]
    path = write(tmp_path / "train.txt", "\n".join(lines) + "\n")
    out = run(spark, IngestConfig(dataset="t", format="per_query_text", paths={"train": path}))
    assert rules(out) == [(str(i), "unparseable") for i in range(1, 7)]
    assert [r["serp_id"] for r in out.serps.collect()] == ["7-1"]
    assert not marker.exists()
    reasons = {r["line"]: r["reason"] for r in out.quarantine.collect()}
    assert reasons[1] == "field clicks is not a JSON list of integers"
    assert reasons[2] == "field doc_ids is not a JSON list of ids"


def test_set_overrides_are_yaml_data_never_objects(tmp_path, capsys):
    conf = tmp_path / "c.yaml"
    conf.write_text("ingest: {dataset: d}\n")
    marker = tmp_path / "pwned"
    rc = ingest_job.main(["--conf", str(conf),
                          "--set", f"ingest.dataset=!!python/object/apply:os.system ['touch {marker}']"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("clickeval ingest: error: --set ingest.dataset: not a YAML value")
    assert not marker.exists()
    rc = ingest_job.main(["--conf", str(conf), "--set", "ingest.dataset.name=x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["clickeval ingest: error: ingest.dataset: is 'd', not a section; "
                               "cannot set ingest.dataset.name"]


# --------------------------------------------------------------------------------------------------
# point 5: names that reach predicates and paths are checked first

HOSTILE_NAMES = ["x' OR '1'='1", "x'; DROP TABLE serps; --", "../../etc", "a/b", "_x", ".hidden", "-x", "",
                 "😀", "a b", "x" * 65]


@pytest.mark.parametrize("key", ["ingest.dataset", "evaluate.reference_model", "env"])
@pytest.mark.parametrize("value", HOSTILE_NAMES)
def test_hostile_names_are_rejected_naming_key_and_pattern(tmp_path, key, value):
    conf = tmp_path / "c.yaml"
    conf.write_text("{}")
    with pytest.raises(ConfigError) as err:
        load_config(conf, {key: value})
    assert str(err.value).startswith(f"{key}: {value!r} is not allowed: must match ^[A-Za-z0-9][A-Za-z0-9_.-]{{0,63}}$")


@pytest.mark.parametrize("section,entry", [
    ("evaluate", {"name": "x' OR '1'='1", "predictions": "p"}),
    ("generate", {"name": "../x", "path": "p"}),
])
def test_external_model_names_are_checked(tmp_path, section, entry):
    conf = tmp_path / "c.yaml"
    conf.write_text(yaml.safe_dump({section: {"external": [entry]}}))
    with pytest.raises(ConfigError, match=rf"^{section}\.external\.name: .* is not allowed: must match"):
        load_config(conf)


def test_hostile_dataset_is_rejected_before_any_write(tmp_path, capsys):
    warehouse = tmp_path / "wh"
    conf = _job_conf(tmp_path, str(warehouse))
    good = write(tmp_path / "good.txt", "s1\tq1\t[1, 2]\t[0, 0]\t[0, 1]\n")
    rc = _main(conf, "inject-1", dataset="x' OR '1'='1", format="per_query_text", paths={"train": good})
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("clickeval ingest: error: ingest.dataset: \"x' OR '1'='1\" is not allowed: must match")
    assert not warehouse.exists()  # no table, not even a `runs` row: it failed at start-up
    rc = ingest_job.main(["--conf", conf, "--run-id", "x' OR '1'='1"])
    assert rc == 2 and "run_id \"x' OR '1'='1\" is not allowed" in capsys.readouterr().err
    assert not warehouse.exists()


def test_slice_writes_refuse_hostile_values(spark, warehouse):
    """Library callers that bypass the config still cannot put a quote into a replaceWhere predicate."""
    df = spark.createDataFrame([], tables.SERPS)
    for keys in ({"dataset": "x' OR '1'='1"}, {"dataset": "ok", "run_id": "1' OR '1'='1"}):
        with pytest.raises(ConfigError):
            tables.replace_slice(df, warehouse, "serps", keys, "r1")
    with pytest.raises(ConfigError):
        tables.replace_slice(df, warehouse, "serps", {"dataset": "ok"}, "r1' OR '1'='1")
    assert not DeltaTable.isDeltaTable(spark, tables.table_path(warehouse, "serps"))


def test_report_reads_its_run_by_value_not_by_sql_text(spark, warehouse):
    row = {"run_id": "r1", "model": "pbm", "dataset": "d", "split": "test", "metric": "LL", "cutoff": None,
           "value": -0.25, "n": 10, "ci_low": -0.3, "ci_high": -0.2, "reference_model": None}
    spark.createDataFrame([row], tables.METRICS).write.format("delta").save(tables.table_path(warehouse, "metrics"))
    ctx = StageContext(spark, AppConfig(), warehouse, "r1")
    assert "No metrics for this run yet" not in build_report(ctx, "r1", "d", ["pbm"], [1])
    # spliced into SQL text this dataset would read `... AND dataset = 'x' OR '1'='1'`: every row
    page = build_report(ctx, "r1", "x' OR '1'='1", ["pbm"], [1])
    assert "No metrics for this run yet" in page


def test_no_sql_text_is_built_from_values():
    """No f-string, %-format or .format() call is passed as SQL text (where/filter/expr/selectExpr/sql):
    values go in as Column literals, or through tables.replace_slice, which validates them."""
    sql_calls = {"where", "filter", "expr", "selectExpr", "sql"}
    offenders = []
    for folder in ("clickeval_spark", "jobs"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in sql_calls):
                    continue
                for arg in node.args:
                    built = isinstance(arg, ast.JoinedStr) or (
                        isinstance(arg, ast.BinOp) and isinstance(arg.op, (ast.Mod, ast.Add))
                        and any(isinstance(x, ast.Constant) and isinstance(x.value, str) for x in (arg.left, arg.right))
                    ) or (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr == "format")
                    if built:
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
