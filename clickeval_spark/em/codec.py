"""The binary format of a query block: one row of numpy arrays per block, and how SERPs are folded into it.

A block row (`blocks.BLOCK_SCHEMA`) carries:

    data  binary  header (B, M, n_pairs, n_train) + clicks int8 (B, M) + pair int32 (B, M)
                  + weight int32 (B): B distinct rows, each standing for ``weight`` identical SERPs
                  (pair = the block-local index of the rank's (query, doc), -1 = no rank; the first
                  n_train rows are training data, the rest held out)
    keys  binary  Arrow IPC stream: query_id, doc_id, n_obs (training impressions) of each pair
    state binary  float64 (C, 3, n_qd_params, n_pairs): per candidate fit, the pairs' current values and
                  the num / den of the last E-step (null = the start, all 0.5); (C, 6, ...) while a
                  SQUAREM cycle keeps its three points (`decode_state`), never after a fit's last pass;
                  in a finished fit's rows (`passes.Passes.finish`) only the chosen candidate's values,
                  float64 (n_qd_params, n_pairs) (`chosen_values`)
    stats binary  float64 vector: per candidate, the block's sums of the last pass (`step.stats_layout`)

Determinism: a block's rows are sorted by their (pair, clicks) bytes and its pairs by (query_id, doc_id),
so every sum of a pass is taken in an order fixed by the data alone.
"""

from __future__ import annotations

import bisect
import io
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from clickeval_spark.fitted.attach import list_lengths

_HEADER_WORDS = 4  # int64: B, M, n_pairs, n_train


def _padded(nbytes: int) -> int:
    return (nbytes + 7) // 8 * 8


def encode_data(clicks: np.ndarray, pair: np.ndarray, n_pairs: int, n_train: int | None = None,
                weight: np.ndarray | None = None) -> bytes:
    """clicks int8 (B, M), pair int32 (B, M) and weight int32 (B,) (default all 1) -> one buffer
    (8-byte aligned sections).

    The first ``n_train`` rows (default all) are training SERPs, the rest held out.
    """
    B, M = clicks.shape
    head = np.array([B, M, n_pairs, B if n_train is None else n_train], dtype=np.int64).tobytes()
    c = np.ascontiguousarray(clicks, dtype=np.int8).tobytes()
    c += b"\0" * (_padded(len(c)) - len(c))
    w = np.ones(B, dtype=np.int32) if weight is None else np.ascontiguousarray(weight, dtype=np.int32)
    return head + c + np.ascontiguousarray(pair, dtype=np.int32).tobytes() + w.tobytes()


def decode_data(buf) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Inverse of `encode_data`, without copying: (clicks, pair, weight, n_pairs, n_train)."""
    B, M, n_pairs, n_train = np.frombuffer(buf, dtype=np.int64, count=_HEADER_WORDS)
    B, M = int(B), int(M)
    off = _HEADER_WORDS * 8
    clicks = np.frombuffer(buf, dtype=np.int8, count=B * M, offset=off).reshape(B, M)
    off += _padded(B * M)
    pair = np.frombuffer(buf, dtype=np.int32, count=B * M, offset=off).reshape(B, M)
    weight = np.frombuffer(buf, dtype=np.int32, count=B, offset=off + 4 * B * M)
    return clicks, pair, weight, int(n_pairs), int(n_train)


def encode_keys(query_ids: pa.Array, doc_ids: pa.Array, n_obs: np.ndarray) -> bytes:
    table = pa.table({"query_id": query_ids.cast(pa.string()),
                      "doc_id": doc_ids.cast(pa.string()),
                      "n_obs": pa.array(n_obs, pa.int64())})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def decode_keys(buf) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(buf)).read_all()


def decode_state(buf, n_candidates: int, n_params: int, n_pairs: int) -> np.ndarray | None:
    """(C, D, P, n_pairs): per candidate the values, last num, last den, and (D = 6) the points an extrapolation
    keeps (`step.em_block`); None before the first pass."""
    if buf is None:
        return None
    flat = np.frombuffer(buf, dtype=np.float64)
    per_row = n_candidates * n_params * n_pairs
    return flat.reshape(n_candidates, flat.size // per_row if per_row else 3, n_params, n_pairs)


def chosen_values(state, block: int, chosen: Sequence[Sequence[int]], first_blocks: tuple[int, ...]
                  ) -> np.ndarray | None:
    """From ``block``'s state after a fit's last pass (depth 3: that pass scores), the values of its group's
    chosen candidate, flat (n_qd_params * n_pairs,): all a fit's per-pair table needs. ``chosen``: per group,
    (the candidate's slot, the group's number of candidates) (`passes.Passes.finish`). ``state``: a
    `decode_state` array or its buffer; None (no pass ran) gives None."""
    if state is None:
        return None
    slot, n_candidates = chosen[group_of(block, first_blocks)]
    flat = state.ravel() if isinstance(state, np.ndarray) else np.frombuffer(state, dtype=np.float64)
    return flat.reshape(n_candidates, 3, -1)[slot, 0]


def fold_rows(clicks: np.ndarray, pair: np.ndarray, weight: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Identical (pair row, clicks row) rows folded into one: (clicks, pair, weight), rows sorted by their bytes.

    Every sum of an EM pass is linear in the SERPs, so a row standing for ``weight``
    identical SERPs gives the same sums as those SERPs, at the cost of one. Input rows may
    already stand for several SERPs (``weight``, default 1 each): folded rows add theirs up.
    """
    B, M = clicks.shape
    if B == 0:
        return clicks, pair, np.zeros(0, dtype=np.int32)
    rows = np.concatenate([np.ascontiguousarray(pair, dtype=np.int32).view(np.uint8).reshape(B, 4 * M),
                           np.ascontiguousarray(clicks, dtype=np.int8).view(np.uint8)], axis=1)
    # one opaque value per row: np.unique then sorts rows by memcmp, a fixed order
    keys = rows.view(np.dtype((np.void, rows.shape[1]))).ravel()   # concatenate's result is C-contiguous
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    total = np.bincount(inverse, weights=weight, minlength=len(first))   # exact: integers far below 2**53
    return clicks[first], pair[first], total.astype(np.int32)


def _sorted_codes(values: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(code of each value, the distinct values in order): codes numbered in that order, so they sort as
    the values do (strings: UTF-8 byte order is code point order, Python's string order). As
    ``np.unique(return_inverse=True)``, but it hashes every value and sorts only the distinct ones: a
    block has ~10 ranks per SERP and a few distinct pairs per query."""
    encoded = values.dictionary_encode()
    order = pc.sort_indices(encoded.dictionary).to_numpy()
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[encoded.indices.to_numpy()], encoded.dictionary.take(pa.array(order))


def pack_block(rows: pa.Table, M: int) -> tuple[bytes, bytes, tuple[int, int, int, int]]:
    """One block's rows (query_id, doc_ids, clicks, held_out, weight: ``weight`` identical SERPs each;
    lists cut to M) -> (data, keys, counts): counts are its training SERPs, held-out SERPs, held-out
    positions and those of them whose pair has a training impression.

    Training rows first, then held-out ones, each folded into weighted distinct rows
    (`fold_rows`); pairs of either get an index in (query_id, doc_id) order, whatever order
    the rows came in; n_obs counts training impressions only. The rows are read in the order they
    came and split into training and held out as numpy arrays: a `take` of the table would copy every
    list, and the block is the same bytes in any order of its rows.
    """
    held = rows.column("held_out").to_numpy().astype(bool)
    docs, click_lists = rows.column("doc_ids").combine_chunks(), rows.column("clicks").combine_chunks()
    lens = list_lengths(docs, click_lists)
    weight = rows.column("weight").to_numpy().astype(np.int64)
    B = len(lens)
    mask = np.arange(M)[None, :] < lens[:, None]
    clicks = np.zeros((B, M), dtype=np.int8)
    pair = np.full((B, M), -1, dtype=np.int32)
    if lens.sum():
        clicks[mask] = click_lists.flatten().to_numpy().astype(np.int8)
        q_codes, q_values = _sorted_codes(rows.column("query_id").combine_chunks())
        d_codes, d_values = _sorted_codes(docs.flatten())
        # one int64 per (query, doc) that sorts as the pair does: the pairs are numbered in that order
        codes, uniques = _sorted_codes(pa.array(np.repeat(q_codes, lens) * len(d_values) + d_codes))
        uniques = uniques.to_numpy()
        pair[mask] = codes.astype(np.int32)
        train = mask & ~held[:, None]
        # integer weights summed as float64: exact, so the same in any order of the rows
        n_obs = np.bincount(pair[train], weights=np.broadcast_to(weight[:, None], train.shape)[train],
                            minlength=len(uniques)).astype(np.int64)
        qs, ds = q_values.take(pa.array(uniques // len(d_values))), d_values.take(pa.array(uniques % len(d_values)))
        # the held-out positions, and those whose pair the training rows show: how dense the log is (`driver._run`)
        shown = mask & held[:, None]
        held_weight = np.broadcast_to(weight[:, None], shown.shape)[shown]
        seen = (int(held_weight.sum()), int(held_weight[n_obs[pair[shown]] > 0].sum()))
    else:
        n_obs, qs, ds = np.zeros(0, np.int64), pa.array([], pa.string()), pa.array([], pa.string())
        seen = (0, 0)
    counts = (int(weight[~held].sum()), int(weight[held].sum()), *seen)
    train = fold_rows(clicks[~held], pair[~held], weight[~held])
    held = fold_rows(clicks[held], pair[held], weight[held])
    clicks, pair, weight = (np.concatenate([t, h]) for t, h in zip(train, held))
    return encode_data(clicks, pair, len(n_obs), len(train[2]), weight), encode_keys(qs, ds, n_obs), counts


def group_of(block: int, first_blocks: tuple[int, ...]) -> int:
    """The group a block belongs to: groups occupy consecutive block ranges starting at ``first_blocks``."""
    return bisect.bisect_right(first_blocks, block) - 1
