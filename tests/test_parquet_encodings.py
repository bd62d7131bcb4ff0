"""The session writes per-SERP and per-session ids without Parquet's dictionary (`build_session`): those ids are
unique, so a dictionary only costs work before the writer falls back; ids that repeat keep theirs."""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow.parquet as pq

from clickeval_spark import tables


def test_serp_and_session_ids_are_written_without_a_dictionary_other_ids_with_one(spark, warehouse):
    # enough repeats of the query and doc ids that their dictionary pays off (Parquet drops one that does not)
    rows = [("d", "train", f"session-{i // 3}", f"session-{i // 3}-{i % 3 + 1}", i % 3 + 1, f"query-{i % 5}",
             [f"doc-{i % 5}-{k}" for k in range(10)], ["1"] * 10, [0] * 10, datetime.date(2026, 12, 6), "r")
            for i in range(600)]
    tables.replace_slice(spark.createDataFrame(rows, tables.SCHEMAS["serps"]), warehouse, "serps", {"dataset": "d"}, "r")
    files = list(Path(tables.table_path(warehouse, "serps")).rglob("*.parquet"))
    assert files
    for file in files:
        meta = pq.ParquetFile(file).metadata.row_group(0)
        encodings = {meta.column(i).path_in_schema: set(meta.column(i).encodings) for i in range(meta.num_columns)}
        dictionary = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}
        assert not encodings["serp_id"] & dictionary and not encodings["session_id"] & dictionary
        assert encodings["query_id"] & dictionary and encodings["doc_ids.list.element"] & dictionary
