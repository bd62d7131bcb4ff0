"""The vectorised side of the per-query text reader: one Arrow pass over each file split (``mapInArrow``)
splits the lines into fields, decodes the list fields that take the common plain form, and numbers each
session's records within the split.

Plain form: a JSON list whose items are all quoted ids without a backslash, comma or control character, or
integers 0..999,999,999 written without sign or leading zero (`["d1", "d2"]`, `[440, 1886]`, `[0, 1]`;
clicks: integers only), with JSON blanks around them. For such a field Spark's JSON parser gives exactly the
items between the quotes (a number as its digits), so the decoding here is the same by construction. Any
other field (escapes, single quotes, floats, nesting, trailing text, a malformed list) comes back as its
text, and the reader hands it to Spark's JSON parser (`per_query_text.json_list`): what is decoded, and
what is quarantined, does not depend on which path a field took.

Positions: the records of one file split reach one task in file order, so a session's n-th record in the
split is found by a stable sort of session codes, with each session's count carried across the batches of
the split. `per_query_text.settled_positions` adds the records of the same session in earlier splits.
Lines are counted within the split the same way; `per_query_text.settled_lines` adds the lines of the
file's earlier splits.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from clickeval_spark.sources.files import WHITESPACE_CHARS

_JSON_BLANKS = " \t\n\r"     # JSON's whitespace; a field with any other blank takes Spark's path
_BLANK = f"[{_JSON_BLANKS}]"
_PLAIN_ID = r'"[^"\\\x00-\x1f,]*"'
_PLAIN_INT = r"(?:0|[1-9][0-9]{0,8})"


def _plain_list(item: str) -> str:
    return rf"^{_BLANK}*\[{_BLANK}*(?:{item}(?:{_BLANK}*,{_BLANK}*{item})*)?{_BLANK}*\]{_BLANK}*$"


PLAIN_IDS = _plain_list(f"(?:{_PLAIN_ID}|{_PLAIN_INT})")
PLAIN_INTS = _plain_list(_PLAIN_INT)


def _decoded(field: pa.Array, plain: pa.Array, ints: bool) -> pa.ListArray:
    """The plain fields' items as a list array (strings without their quotes, or int32); null elsewhere.

    A plain field is blanks, '[', items split by commas, ']', blanks: once trimmed, its brackets are its first
    and last characters, and an id holds no quote, so trimming quotes leaves exactly what they enclose. (JSON's
    blanks are ASCII, and no byte of a multi-byte UTF-8 character is: the ASCII trims are exact on any text.)
    """
    inner = pc.ascii_trim(pc.utf8_slice_codeunits(pc.ascii_trim(pc.if_else(plain, field, "[]"), _JSON_BLANKS), 1, -1),
                          _JSON_BLANKS)
    parts = pc.split_pattern(inner, ",")
    n_parts = pc.list_value_length(parts).to_numpy(zero_copy_only=False)
    empty = pc.equal(inner, "").to_numpy(zero_copy_only=False)     # "[]" splits into one empty item
    items = pc.list_flatten(parts)
    if empty.any():
        items = pc.filter(items, pa.array(np.repeat(~empty, n_parts)))
    items = pc.ascii_trim(items, _JSON_BLANKS)
    # a number as its digits; a quoted id without its quotes
    items = pc.cast(items, pa.int32()) if ints else pc.ascii_trim(items, '"')
    offsets = pa.array(np.r_[0, np.cumsum(np.where(empty, 0, n_parts))].astype(np.int32))
    return pa.ListArray.from_arrays(offsets, items, mask=pc.invert(plain))


class _Fields:
    """The tab-separated fields of a batch's lines, taken by position per line (null where a line has fewer)."""

    def __init__(self, text: pa.Array) -> None:
        split = pc.split_pattern(text, "\t")
        offsets = split.offsets.to_numpy()
        self.starts, self.flat = offsets[:-1] - offsets[0], split.flatten()
        self.count = np.diff(offsets).astype(np.int32)

    def at(self, index: np.ndarray | int, wanted: np.ndarray | bool = True) -> pa.Array:
        """Field `index` (per line, or one for all) of the lines where `wanted` and it exists; null elsewhere."""
        present = wanted & (self.count > index)
        return pc.take(self.flat, pa.array(np.where(present, self.starts + index, 0), mask=~present))


class SplitPositions:
    """Within the current file split (source, block start): the lines seen and each session's running count
    of records."""

    def __init__(self) -> None:
        self.split: tuple | None = None
        self.lines = 0
        self.seen: dict[str, int] = {}

    def number(self, split: tuple, sessions: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """1-based line numbers within the split and positions in their session of `sessions` (the next
        records of one split, in file order), after those already seen."""
        if split != self.split:
            self.split, self.lines, self.seen = split, 0, {}
        lines = np.arange(self.lines + 1, self.lines + len(sessions) + 1, dtype=np.int64)
        self.lines += len(sessions)
        encoded = pc.dictionary_encode(sessions)
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        run_start = np.r_[True, sorted_codes[1:] != sorted_codes[:-1]]
        at = np.arange(len(codes))
        in_run = at - np.maximum.accumulate(np.where(run_start, at, 0))
        keys = encoded.dictionary.to_pylist()
        earlier = np.array([self.seen.get(k, 0) for k in keys], dtype=np.int64)
        for key, n in zip(keys, np.bincount(codes, minlength=len(keys)).tolist()):
            self.seen[key] = self.seen.get(key, 0) + n
        positions = np.empty(len(codes), dtype=np.int64)
        positions[order] = in_run + 1
        return lines, positions + earlier[codes]


def parse_batches(batches: Iterator[pa.RecordBatch], layouts: list[tuple[int, int]], list_fields: list[tuple[str, bool]]
                  ) -> Iterator[pa.RecordBatch]:
    """Per-query text lines -> fields, plain lists decoded, positions within the split (`mapInArrow`).

    In: source, line, block_start, raw (binary), utf8 (the line is valid UTF-8), key (Spark's stripped
    first field, given for lines that are not valid UTF-8 only). layouts: (number of fields, index of the
    docs field) allowed. list_fields: (name, integers?) in field order from the docs field.
    Out: source, line, block_start, raw, utf8, session_id, query_id, n_fields, docs_at, then per list field
    its decoded list (null unless plain) and its text (null when plain or absent), then local_pos (the
    record's position in its session within the split) and block_line (its line number within the split).
    """
    positions = SplitPositions()
    for batch in batches:
        raw, utf8 = batch.column("raw"), batch.column("utf8")
        fields = _Fields(pc.cast(pc.if_else(utf8, raw, pa.scalar(b"", pa.binary())), pa.string()))
        n = fields.count
        session = pc.if_else(utf8, pc.utf8_trim(fields.at(0), WHITESPACE_CHARS), batch.column("key"))
        query = pc.utf8_trim(fields.at(1), WHITESPACE_CHARS)
        docs_at = np.full(len(n), -1, dtype=np.int32)
        for count, at in layouts:
            docs_at[n == count] = at
        lists, texts = [], []
        for offset, (name, ints) in enumerate(list_fields):
            field = fields.at(docs_at + offset, docs_at >= 0)
            plain = pc.fill_null(pc.match_substring_regex(field, PLAIN_INTS if ints else PLAIN_IDS), False)
            lists.append(_decoded(field, plain, ints))
            texts.append(pc.if_else(plain, pa.scalar(None, pa.string()), field))
        split = batch.column("source").to_numpy(zero_copy_only=False), batch.column("block_start").to_numpy()
        local, block_line = np.empty(len(n), dtype=np.int64), np.empty(len(n), dtype=np.int64)
        starts = np.flatnonzero(np.r_[True, (split[0][1:] != split[0][:-1]) | (split[1][1:] != split[1][:-1])])
        for lo, hi in zip(starts, np.r_[starts[1:], len(n)]):
            block_line[lo:hi], local[lo:hi] = positions.number((split[0][lo], split[1][lo]), session.slice(lo, hi - lo))
        names = ["source", "line", "block_start", "raw", "utf8", "session_id", "query_id", "n_fields", "docs_at"]
        arrays = [batch.column(c) for c in names[:5]] + [session, query, pa.array(n, pa.int32()),
                                                         pa.array(docs_at, mask=docs_at < 0)]
        for (name, _), decoded, field_text in zip(list_fields, lists, texts):
            names += [name, f"{name}_text"]
            arrays += [decoded, field_text]
        yield pa.RecordBatch.from_arrays(arrays + [pa.array(local, pa.int32()), pa.array(block_line, pa.int64())],
                                         names=names + ["local_pos", "block_line"])
