"""The per-query text reader's Arrow pass (sources/text_batches.py): plain lists decoded exactly as Spark's JSON
parser decodes them, other fields left to that parser, and each session's records numbered in file order over
file splits (positions within a split, then `settled_positions`' offsets, or the session window), and its
lines numbered in file order (lines within a split, then `settled_lines`' offsets)."""

from contextlib import contextmanager

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.config import IngestConfig
from clickeval_spark.sources import per_query_text
from clickeval_spark.sources.files import WHITESPACE, WHITESPACE_CHARS, numbered_lines
from clickeval_spark.sources.text_batches import SplitPositions, parse_batches
from tests.sources.helpers import run, write

# list fields: plain ones (decoded by the Arrow pass) and others (Spark's JSON parser, or unparseable)
PLAIN = ['[1, 2]', '["a","b"]', '[]', '[ ]', ' [ "x" , 3 ] ', '["é", "会话", "😀"]', '[999999999]', '[0]',
         '["a b", ""]', '["[1]", "{x}"]']
OTHER = ['["a,b"]', '["a\\"b"]', '["\\u00e9"]', "['a']", '[01]', '[1.0]', '[-1]', '[1e3]', '[true]', '[null]',
         '[1,]', '[,1]', '[[1]]', '[1] x', '[2147483648]', '[1234567890]', '["\x01"]', '{"a": 1}', '1', '',
         '[\x0b1]', '["a" "b"]', '[NaN]']


def _lines(fields: list[str]) -> str:
    """One graphcm line per field, the field as docs, vtypes and clicks alike."""
    return "".join(f"s{i}\tq\t{f}\t{f}\t{f}\n" for i, f in enumerate(fields))


def test_plain_fields_are_decoded_in_arrow_and_the_others_left_to_spark():
    raw = pa.array([line.encode() for line in _lines(PLAIN + OTHER).split("\n")[:-1]], pa.binary())
    n = len(raw)
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["f"] * n), pa.array(range(1, n + 1), pa.int64()), pa.array([0] * n, pa.int64()), raw,
         pa.array([True] * n), pa.nulls(n, pa.string())],
        names=["source", "line", "block_start", "raw", "utf8", "key"])
    # two batches of one split: the positions run on across them (one record per session "s<i>")
    out = pa.Table.from_batches(list(parse_batches(iter([batch.slice(0, 20), batch.slice(20)]), [(5, 2)],
                                                   [("doc_ids", False), ("vtypes", False), ("clicks", True)])))
    assert out.column("local_pos").to_pylist() == [1] * n and out.column("line").to_pylist() == list(range(1, n + 1))
    assert out.column("block_line").to_pylist() == list(range(1, n + 1))
    plain_ids = [t is None for t in out.column("doc_ids_text").to_pylist()]
    assert plain_ids == [True] * len(PLAIN) + [False] * len(OTHER)
    assert out.column("doc_ids").to_pylist()[:3] == [["1", "2"], ["a", "b"], []]
    # clicks: integers only
    assert [t is None for t in out.column("clicks_text").to_pylist()][:len(PLAIN)] == [
        f.strip().replace(" ", "") in ("[1,2]", "[]", "[999999999]", "[0]") for f in PLAIN]
    assert out.column("clicks").to_pylist()[0] == [1, 2]


def test_split_positions_run_on_across_batches_and_restart_with_the_next_split():
    count = SplitPositions()
    first = count.number(("f", 0), pa.array(["a", "b", "a", "c"]))
    second = count.number(("f", 0), pa.array(["b", "a", "a"]))
    other = count.number(("f", 100), pa.array(["a", "b"]))
    # (lines within the split, positions in the session within the split)
    assert [(lines.tolist(), pos.tolist()) for lines, pos in (first, second, other)] == [
        ([1, 2, 3, 4], [1, 1, 2, 1]), ([5, 6, 7], [2, 3, 4]), ([1, 2], [1, 1])]


def test_every_field_decodes_as_spark_json_parser_decodes_it(spark, tmp_path):
    fields = PLAIN + OTHER
    path = write(tmp_path / "t.txt", _lines(fields))
    parsed = per_query_text.parse_lines(numbered_lines(spark, path), "t", "graphcm", 0)
    got = {r["line"]: (r["doc_ids"], r["vtypes"], r["clicks"]) for r in parsed.collect()}
    texts = spark.createDataFrame([(i + 1, f) for i, f in enumerate(fields)], "line long, f string")
    by_spark = texts.select("line", per_query_text.json_list(F.col("f"), "string").alias("ids"),
                            per_query_text.json_list(F.col("f"), "int").alias("ints"))
    expected = {r["line"]: (r["ids"], r["ids"], r["ints"]) for r in by_spark.collect()}
    assert got == expected
    # the plain fields all decode; some of the others do too (Spark's JSON parser accepts single quotes)
    assert all(got[i + 1][0] is not None for i in range(len(PLAIN)))
    assert got[len(PLAIN) + OTHER.index("['a']") + 1][0] == ["a"]


def test_the_arrow_trim_characters_are_the_spark_whitespace_class(spark):
    chars = [chr(c) for c in range(0x3100) if not 0xD800 <= c < 0xE000] + ["\ufeff", "\U0001f600"]
    df = spark.createDataFrame([(c,) for c in chars], "c string")
    matched = {r["c"] for r in df.where(F.col("c").rlike(f"^{WHITESPACE}$")).collect()}
    assert matched == {c for c in chars if c in WHITESPACE_CHARS}
    assert set(WHITESPACE_CHARS) <= set(chars)   # every listed character was checked
    assert WHITESPACE_CHARS == "".join(c for c in map(chr, range(0x110000)) if c.isspace())


@contextmanager
def _small_splits(spark, nbytes: int):
    """Files read in splits of about `nbytes` (Spark packs at least openCostInBytes per split)."""
    keys = ("spark.sql.files.maxPartitionBytes", "spark.sql.files.openCostInBytes")
    before = {k: spark.conf.get(k, None) for k in keys}
    for k in keys:
        spark.conf.set(k, str(nbytes))
    try:
        yield
    finally:
        for k, v in before.items():
            spark.conf.unset(k) if v is None else spark.conf.set(k, v)


def _numbered(read):
    """`read_serps`' records with their line numbers (`settled_lines`, from each split's count of records)."""
    counts = read.groupBy("source", "block_start").count().collect()
    return per_query_text.settled_lines(read, {(r["source"], r["block_start"]): r["count"] for r in counts})


def _expected_positions(files: list[list[str]]) -> dict[tuple[int, int], int]:
    """(file index, line) -> position of the record in its session, in file order over the files."""
    seen, out = {}, {}
    for f, sessions in enumerate(files):
        for line, s in enumerate(sessions, 1):
            seen[s.strip()] = seen.get(s.strip(), 0) + 1
            out[(f, line)] = seen[s.strip()]
    return out


@pytest.mark.parametrize("spanning_max", [per_query_text.SPANNING_BROADCAST_MAX, 0], ids=["offsets", "window"])
def test_positions_count_every_earlier_record_of_the_session_over_splits_and_files(spark, tmp_path, spanning_max):
    # runs of one session longer than a split, sessions interleaved, one session in both files, blank sessions
    train = ["long"] * 40 + ["x", "y", "x", " y", "y "] * 6 + ["both"] * 7 + [" ", "\u3000"] * 3
    valid = ["both"] * 5 + ["x"] + ["z", "long"] * 9
    files = [train, valid]
    paths = {name: write(tmp_path / f"{name}.txt", "".join(f"{s}\tq{i}\t[1]\t[0]\t[1]\n" for i, s in enumerate(lines)))
             for name, lines in zip(("train", "valid"), files)}
    with _small_splits(spark, 128):
        read = per_query_text.read_serps(spark, paths, "t", "graphcm")
        assert read.select("source", "block_start").distinct().count() > 10   # many splits indeed
        settled = _numbered(per_query_text.settled_positions(read, spanning_max))
        rows = settled.select("source", "line", "session_id", "serp_pos", "serp_id").collect()
    expected = _expected_positions(files)
    got = {(0 if r["source"].endswith("train.txt") else 1, r["line"]): r["serp_pos"] for r in rows}
    assert got == expected
    assert all(r["serp_id"] == f"{r['session_id']}-{r['serp_pos']}" for r in rows)


def test_the_ingest_quarantines_each_record_under_its_line_over_splits_and_files(spark, tmp_path):
    # the reader numbers lines within file splits and the ingest settles them from its per-split counts
    broken = {"train": {1: "[2]", 17: "[2]", 18: "x", 40: "[2]", 60: "[2]"}, "valid": {1: "x", 25: "[2]"}}
    paths = {name: write(tmp_path / f"{name}.txt", "".join(
        "garbage\n" if bad.get(i) == "x" else f"s{i}\tq\t[1]\t[0]\t{bad.get(i, '[1]')}\n" for i in range(1, 61)))
        for name, bad in broken.items()}
    with _small_splits(spark, 128):
        out = run(spark, IngestConfig(dataset="t", format="per_query_text", paths=paths, text_variant="graphcm"))
        assert spark.read.text(paths["train"]).select("_metadata.file_block_start").distinct().count() > 5
        got = sorted((r["source"].rsplit("/", 1)[-1], r["line"], r["rule"]) for r in out.quarantine.collect())
        out.release()
    rule = {"[2]": "click_not_binary", "x": "unparseable"}
    assert got == sorted((f"{name}.txt", line, rule[what]) for name, bad in broken.items() for line, what in bad.items())


def test_a_line_that_is_not_utf8_counts_in_its_session(spark, tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"s\tq\t[1]\t[0]\t[1]\ns\tq\t[1]\t[0]\t[\xff]\ns\tq\t[2]\t[0]\t[1]\n")
    read = _numbered(per_query_text.read_serps(spark, {"train": str(path)}, "t", "graphcm"))
    rows = sorted((r["line"], r["serp_id"], r["parse_rule"]) for r in read.collect())
    assert rows == [(1, "s-1", None), (2, "s-2", "unparseable"), (3, "s-3", None)]
