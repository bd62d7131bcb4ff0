"""Property tests of the text parsers (issue 7, point 4): any input line either becomes valid rows or is
quarantined with a rule, never both, never neither, and no exception escapes the job.

The parsers are Spark jobs, so hypothesis draws the lines first (a fixed, derandomized set of examples)
and they are all written to one file and ingested once; the properties are then checked line by line.
Lines mix three kinds: well-formed records (must be accepted, with exactly their values), well-formed
records with one known defect (must be quarantined under that rule), and arbitrary text (either way).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from clickeval_spark.config import IngestConfig
from clickeval_spark.validation import LABEL_RULES, SERP_RULES
from tests.sources.helpers import run, write

pytestmark = pytest.mark.slow

N_LINES = 200
MAX_RANK = 10
SETTINGS = settings(max_examples=N_LINES, derandomize=True, database=None, deadline=None,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def examples(strategy, n: int = N_LINES) -> list:
    """`n` examples of `strategy`, the same on every run (derandomized), without running Spark per example."""
    drawn = []

    @SETTINGS
    @given(strategy)
    def collect(example):
        drawn.append(example)

    collect()
    return drawn[:n]


def blank(text: str) -> bool:
    return text.strip() == ""  # the parsers' whitespace is exactly Python's str.isspace()


# text without line breaks (Spark's text reader ends a line at \n, \r and \r\n): any other character,
# including tabs, quotes, brackets, emoji, NUL, Unicode spaces and line separators
line_text = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=60)
# ids: mostly readable, some hostile; never a tab (the field separator)
plain_id = st.text(st.characters(codec="utf-8", exclude_characters="\t\r\n"), min_size=1, max_size=8).filter(
    lambda s: s == s.strip() and s.strip() != "")
hostile_id = st.sampled_from(["'; DROP TABLE serps; --", "x' OR '1'='1", '"q"', "😀", "会话", "a\\b", "{x}", "[1]",
                              "NULL", "\x00", "d\u2028e"])
good_id = st.one_of(st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True), hostile_id, plain_id)
blank_id = st.sampled_from(["", " ", "\u3000", "\u00a0", "\x0b", "\x1c", "  \u2003 "])
BAD_CLICKS = {"click_not_binary": ["2", "-1", "null"],
              "unparseable": ["NaN", "0.5", "1.0", "true", '"1"', "99999999999", "Infinity", "01", "1e0"]}
DEFECTS = ["click", "length", "trailing", "nested", "blank_session", "blank_query", "blank_doc", "empty",
           "too_many", "fields", "relevance"]
# what each defect breaks, for a SERP line and for a label line (label files check neither clicks' values nor
# their length, nor the session id, nor a rank limit; their relevances are what serps lines do not have)
SERP_OUTCOME = {"length": "length_mismatch", "trailing": "unparseable", "nested": "unparseable",
                "blank_session": "missing_id", "blank_query": "missing_id", "blank_doc": "missing_id",
                "empty": "empty_result_list", "too_many": "rank_out_of_range", "fields": "unparseable",
                "relevance": "accepted"}
LABEL_OUTCOME = {**SERP_OUTCOME, "length": "accepted", "blank_session": "accepted", "too_many": "accepted",
                 "relevance": "relevance_not_integer", "click_not_binary": "accepted"}


def json_list(values: list[str], sep: str = ", ") -> str:
    return "[" + sep.join(values) + "]"


@st.composite
def text_line(draw):
    """(line, defect, values): defect None for arbitrary text, 'none' for a well-formed line, else what is wrong;
    values are what a well-formed line must become. Every line has a relevances field after the clicks (label
    files need it; for SERP files a well-formed line with it has 6 or 8 fields and is itself a `fields` defect)."""
    kind = draw(st.sampled_from(["valid"] * 4 + ["defect"] * 4 + ["text", "fields"]))
    if kind == "text":
        return draw(line_text), None, None
    if kind == "fields":
        return "\t".join(draw(st.lists(line_text, min_size=1, max_size=8))), None, None
    sid, qid = draw(good_id), draw(good_id)
    n = draw(st.integers(1, MAX_RANK))
    docs = draw(st.lists(good_id, min_size=n, max_size=n))
    vtypes = draw(st.lists(st.sampled_from(["0", "1", "x"]), min_size=n, max_size=n))
    clicks = draw(st.lists(st.sampled_from(["0", "1"]), min_size=n, max_size=n))
    rels = draw(st.lists(st.integers(-2, 4).map(str), min_size=n, max_size=n))
    sep = draw(st.sampled_from([", ", ",", " , "]))
    zero_columns = ["0", "0"] if draw(st.booleans()) else []  # the AICM / NCM layout
    defect = "none" if kind == "valid" else draw(st.sampled_from(DEFECTS))
    if defect == "click":
        defect = draw(st.sampled_from(sorted(BAD_CLICKS)))
        clicks[draw(st.integers(0, n - 1))] = draw(st.sampled_from(BAD_CLICKS[defect]))
    elif defect == "length":
        clicks = clicks + ["0"] if draw(st.booleans()) or n == 1 else clicks[1:]
    elif defect == "nested":
        docs[draw(st.integers(0, n - 1))] = draw(st.sampled_from(["[1]", "{}", '{"a": 1}']))
    elif defect == "blank_session":
        sid = draw(blank_id)
    elif defect == "blank_query":
        qid = draw(blank_id)
    elif defect == "blank_doc":
        docs[draw(st.integers(0, n - 1))] = draw(blank_id)
    elif defect == "empty":
        docs, vtypes, clicks, rels = [], [], [], []
    elif defect == "too_many":
        extra = MAX_RANK + 1 - n
        docs, vtypes = docs + [f"x{i}" for i in range(extra)], vtypes + ["0"] * extra
        clicks, rels = clicks + ["0"] * extra, rels + ["0"] * extra
    elif defect == "fields":
        zero_columns = ["0"]  # six fields (seven with relevances): neither layout
    elif defect == "relevance":
        rels[draw(st.integers(0, n - 1))] = draw(st.sampled_from(['"high"', '"2.5"', '"NaN"', '""']))

    def ids(values: list[str]) -> str:
        return json_list([v if defect == "nested" and v in ("[1]", "{}", '{"a": 1}')
                          else json.dumps(v, ensure_ascii=draw(st.booleans())) for v in values], sep)

    clicks_text = json_list(clicks, sep)
    if defect == "trailing":  # text after the list's closing bracket (Spark's JSON parser alone would ignore it)
        clicks_text += draw(st.sampled_from(["x", "[1]", ",0", " 0", "}", "]", "garbage", " // c"]))
    line = "\t".join([sid, qid, *zero_columns, ids(docs), ids(vtypes), clicks_text, json_list(rels, sep)])
    values = {"session_id": sid.strip(), "query_id": qid.strip(), "doc_ids": docs, "vtypes": vtypes,
              "clicks_text": clicks_text, "relevances": rels}
    return line, defect, values


def serp_version(example):
    """The same example as a SERP line: without its relevances field."""
    line, defect, values = example
    if defect is None:
        return line, None, None
    rule = "accepted" if defect == "none" else defect if defect in BAD_CLICKS else SERP_OUTCOME[defect]
    return line.rsplit("\t", 1)[0], rule, values


def label_version(example):
    line, defect, values = example
    if defect is None:
        return line, None, None
    rule = "accepted" if defect == "none" else LABEL_OUTCOME.get(defect, defect)
    return line, rule, values


def _serp_ids(lines: list[str]) -> list[str]:
    """The serp id of each line: '<session>-<position of the line among the session's lines>'."""
    seen: Counter = Counter()
    ids = []
    for line in lines:
        sid = line.split("\t")[0].strip()
        seen[sid] += 1
        ids.append(f"{sid}-{seen[sid]}")
    return ids


def _check_canonical(row, max_rank: int | None = MAX_RANK) -> None:
    """The canonical rules every accepted serps row satisfies."""
    assert not blank(row["session_id"]) and not blank(row["query_id"]) and not blank(row["serp_id"])
    assert row["doc_ids"] and all(d is not None and not blank(d) for d in row["doc_ids"])
    assert len(row["clicks"]) == len(row["doc_ids"]) and set(row["clicks"]) <= {0, 1}
    assert row["vtypes"] is None or len(row["vtypes"]) == len(row["doc_ids"])
    assert max_rank is None or len(row["doc_ids"]) <= max_rank
    assert row["split"] in ("train", "valid", "test")


def test_any_per_query_line_is_accepted_or_quarantined_never_both(spark, tmp_path):
    drawn = [serp_version(e) for e in examples(text_line())]
    lines = [line for line, _, _ in drawn]
    path = write(tmp_path / "train.txt", "\n".join(lines) + "\n")
    out = run(spark, IngestConfig(dataset="prop", format="per_query_text", paths={"train": path},
                                  max_rank=MAX_RANK))  # no exception escapes: that is the first property

    quarantined = {}
    for q in out.quarantine.collect():
        assert q["line"] not in quarantined, f"line {q['line']} quarantined twice"
        assert q["rule"] in SERP_RULES and q["reason"], q
        quarantined[q["line"]] = q
    accepted = {}
    for row in out.serps.collect():
        assert row["serp_id"] not in accepted, f"serp {row['serp_id']} accepted twice"
        _check_canonical(row)
        accepted[row["serp_id"]] = row
    assert out.counts["serps_read"] == len(lines) == len(accepted) + len(quarantined)

    for i, (serp_id, (line, rule, values)) in enumerate(zip(_serp_ids(lines), drawn), start=1):
        where = f"line {i}: {line!r}"
        assert (i in quarantined) != (serp_id in accepted), f"{where}: accepted and quarantined, or neither"
        if rule == "accepted":
            assert serp_id in accepted, f"{where}: a well-formed line was quarantined: {quarantined[i]['reason']}"
            row = accepted[serp_id]
            assert (row["session_id"], row["query_id"], row["doc_ids"], row["vtypes"]) == (
                values["session_id"], values["query_id"], values["doc_ids"], values["vtypes"]), where
            assert row["clicks"] == json.loads(values["clicks_text"]), where
        elif rule is not None:
            assert i in quarantined, f"{where}: should break {rule} but was accepted"
            assert quarantined[i]["rule"] == rule, f"{where}: {quarantined[i]['rule']} ({quarantined[i]['reason']})"
        if serp_id in accepted:  # whatever the line, what was accepted is what the line says
            fields = line.split("\t")
            assert json.loads(fields[-1]) == accepted[serp_id]["clicks"], where
    kinds = Counter(rule for _, rule, _ in drawn)
    assert kinds["accepted"] >= 40 and sum(n for r, n in kinds.items() if r not in (None, "accepted")) >= 40, kinds


def test_any_per_query_label_line_is_accepted_or_quarantined(spark, tmp_path):
    drawn = [label_version(e) for e in examples(text_line())]
    lines = [line for line, _, _ in drawn]
    serps = write(tmp_path / "train.txt", "s\tq\t[1]\t[0]\t[1]\n")
    labels = write(tmp_path / "labels.txt", "\n".join(lines) + "\n")
    out = run(spark, IngestConfig(dataset="prop", format="per_query_text", paths={"train": serps}, labels=labels))

    quarantined = {q["line"]: q for q in out.quarantine.where(F.col("target") == "relevance_labels").collect()}
    assert all(q["rule"] in LABEL_RULES for q in quarantined.values())
    rows = defaultdict(list)
    for r in out.labels.collect():
        assert not blank(r["query_id"]) and not blank(r["doc_id"]) and isinstance(r["relevance"], int), r
        rows[r["serp_id"]].append(r)
    assert out.counts["labels_read"] == len(lines) == out.counts["labels_accepted"] + len(quarantined)
    for i, (serp_id, (line, rule, values)) in enumerate(zip(_serp_ids(lines), drawn), start=1):
        where = f"line {i}: {line!r}"
        got = rows.get(f"label:{serp_id}", [])
        assert (i in quarantined) != bool(got), f"{where}: accepted and quarantined, or neither"
        if rule == "accepted":
            assert sorted((r["rank"], r["doc_id"], r["relevance"]) for r in got) == [
                (k + 1, d, int(g)) for k, (d, g) in enumerate(zip(values["doc_ids"], values["relevances"]))], where
        elif rule is not None:
            assert i in quarantined, f"{where}: should break {rule} but was accepted"
            assert quarantined[i]["rule"] == rule, f"{where}: {quarantined[i]['rule']} ({quarantined[i]['reason']})"


# --------------------------------------------------------------------------------------------------
# Yandex: a reference reading of the log in plain Python is the oracle

YANDEX_SPACE = "[ \t\n\x0b\x0c\r]+"  # the separators: Java's \s
y_sessions = st.sampled_from(["1", "😀", "s'1", "1", "😀", "s'1", 'q"2', "x;--"])
y_urls = st.sampled_from(["u1", "u'4", "ü5", "u\x1c7", "u1", "u'4", "ü5", "u\x1c7", "u2", "u;6"])
y_sep = st.sampled_from(["\t", " ", "\t\t", " \t"])


@st.composite
def yandex_line(draw):
    kind = draw(st.sampled_from(["Q"] * 4 + ["C"] * 4 + ["text", "short", "other"]))
    sep = draw(y_sep)
    pad = draw(st.sampled_from(["", "", " ", "\t", "\u3000"]))
    sid, t = draw(y_sessions), str(draw(st.integers(0, 99)))
    if kind == "Q":
        query = draw(st.sampled_from(["100", "101", "q'x", "\u3000"]))
        n = draw(st.integers(1, MAX_RANK + 1))
        urls = draw(st.lists(y_urls, min_size=n, max_size=n))
        return pad + sep.join([sid, t, "Q", query, "2", *urls]) + pad
    if kind == "C":
        return pad + sep.join([sid, t, "C", draw(y_urls)]) + pad
    if kind == "short":
        return sep.join([sid, t, draw(st.sampled_from(["Q", "C"]))])
    if kind == "other":
        return sep.join([sid, t, draw(st.sampled_from(["X", "q", "c", "QQ"])), "u1"])
    return draw(line_text)


def yandex_reference(lines: list[str]):
    """(expected accepted SERPs {serp_id: (query_id, docs, clicks)}, expected quarantined {line: rule})."""
    queries, quarantined = {}, {}
    per_session: Counter = Counter()
    clicked = defaultdict(set)
    shown_by_session = defaultdict(list)  # session -> [(line, docs)]
    for i, line in enumerate(lines, start=1):
        f = re.split(YANDEX_SPACE, line.strip())
        kind = f[2] if len(f) > 2 else None
        if kind == "Q" and len(f) >= 6:
            per_session[f[0]] += 1
            queries[i] = (f"{f[0]}-{per_session[f[0]]}", f[3], f[5:])
            shown_by_session[f[0]].append((i, f[5:]))
        elif kind == "C" and len(f) == 4:
            match = [j for j, docs in shown_by_session[f[0]] if f[3] in docs]
            if match:
                clicked[max(match)].add(f[3])
            else:
                quarantined[i] = "unparseable"
        else:
            quarantined[i] = "unparseable"
    accepted = {}
    for i, (serp_id, query, docs) in queries.items():
        if blank(query) or any(blank(d) for d in docs) or blank(serp_id.rsplit("-", 1)[0]):
            quarantined[i] = "missing_id"
        elif len(docs) > MAX_RANK:
            quarantined[i] = "rank_out_of_range"
        else:
            accepted[serp_id] = (query, docs, [int(d in clicked[i]) for d in docs])
    return accepted, quarantined


def test_any_yandex_line_matches_the_reference_reading(spark, tmp_path):
    lines = examples(yandex_line())
    path = write(tmp_path / "log.txt", "\n".join(lines) + "\n")
    out = run(spark, IngestConfig(dataset="prop", format="yandex", paths={"all": path}, max_rank=MAX_RANK))
    want_accepted, want_quarantined = yandex_reference(lines)
    rows = out.serps.collect()
    for row in rows:
        _check_canonical(row)
    got_accepted = {r["serp_id"]: (r["query_id"], r["doc_ids"], r["clicks"]) for r in rows}
    got_quarantined = {q["line"]: q["rule"] for q in out.quarantine.collect()}
    assert got_quarantined == want_quarantined
    assert got_accepted == want_accepted
    assert out.counts["serps_read"] == len(got_accepted) + len(got_quarantined)
    assert len(want_accepted) >= 20 and sum(1 for c in want_accepted.values() if any(c[2])) >= 5
