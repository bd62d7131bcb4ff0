"""The training log packed into query blocks: the layout every EM iteration runs on.

EM reads the whole log once per iteration, and every per-(query, doc) parameter
depends only on the SERPs of its own query. So the log is packed once into
``n_blocks`` blocks (a query's SERPs all go to block xxhash64(query_id) mod
n_blocks), each block one row of numpy arrays in binary columns:

    block int,
    data  binary  header (B, M, n_pairs) + clicks int8 (B, M) + pair int32 (B, M)
                  (pair = the block-local index of the rank's (query, doc), -1 = no rank)
    keys  binary  Arrow IPC stream: query_id, doc_id, n_obs of each block-local pair
    state binary  float64 (n_qd_params, n_pairs): current qd parameters (null = all 0.5)
    stats binary  float64 vector: the block's global sums of the last E-step (see `stats_layout`)

An EM iteration is then one narrow Spark stage (`mapInArrow`, no shuffle, no join,
no Python call per SERP): each task decodes its block, runs the model's E-step
over it in slices, does the M-step of the block's own qd parameters in place and
returns the block with its new state and a few hundred global sums. Only those
sums reach the driver, which adds them up in block order and hands the new global
parameters to the next iteration. This is the blocked layout Spark MLlib's ALS
uses for the same reason (per-key state that never needs a shuffle).

Determinism: a block's SERPs are sorted by serp_id, its pairs by (query_id,
doc_id), and the block count depends only on the number of SERPs and
``block_serps``. Every sum is taken in that fixed order, so the fitted parameters
are a function of the data and the config alone: bit-identical on any number of
partitions, shuffle partitions or executors.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.models.base import INIT_VALUE, ClickModel, log_likelihood

#: SERPs per block: enough that a task's numpy work dwarfs its scheduling cost, small
#: enough that a block's arrays stay a few MB (50 bytes per SERP of 10 ranks).
BLOCK_SERPS = 131072
#: at least this many blocks, so small logs still use every core of a small cluster
MIN_BLOCKS = 4
#: SERPs per E-step slice inside a task: keeps the kernels' (slice, M) temporaries in cache
SLICE_ROWS = 16384

BLOCK_SCHEMA = T.StructType([
    T.StructField("block", T.IntegerType(), False),
    T.StructField("data", T.BinaryType(), False),
    T.StructField("keys", T.BinaryType(), False),
    T.StructField("state", T.BinaryType(), True),
    T.StructField("stats", T.BinaryType(), True),
])

_HEADER_WORDS = 4  # int64: B, M, n_pairs, reserved


# ---------------------------------------------------------------------------
# encoding
# ---------------------------------------------------------------------------

def _padded(nbytes: int) -> int:
    return (nbytes + 7) // 8 * 8


def encode_data(clicks: np.ndarray, pair: np.ndarray, n_pairs: int) -> bytes:
    """clicks int8 (B, M) and pair int32 (B, M) -> one buffer (8-byte aligned sections)."""
    B, M = clicks.shape
    head = np.array([B, M, n_pairs, 0], dtype=np.int64).tobytes()
    c = np.ascontiguousarray(clicks, dtype=np.int8).tobytes()
    c += b"\0" * (_padded(len(c)) - len(c))
    return head + c + np.ascontiguousarray(pair, dtype=np.int32).tobytes()


def decode_data(buf) -> tuple[np.ndarray, np.ndarray, int]:
    """Inverse of `encode_data`, without copying: (clicks, pair, n_pairs)."""
    B, M, n_pairs, _ = np.frombuffer(buf, dtype=np.int64, count=_HEADER_WORDS)
    B, M = int(B), int(M)
    off = _HEADER_WORDS * 8
    clicks = np.frombuffer(buf, dtype=np.int8, count=B * M, offset=off).reshape(B, M)
    off += _padded(B * M)
    pair = np.frombuffer(buf, dtype=np.int32, count=B * M, offset=off).reshape(B, M)
    return clicks, pair, int(n_pairs)


def encode_keys(query_ids: np.ndarray, doc_ids: np.ndarray, n_obs: np.ndarray) -> bytes:
    table = pa.table({"query_id": pa.array(query_ids, pa.string()),
                      "doc_id": pa.array(doc_ids, pa.string()),
                      "n_obs": pa.array(n_obs, pa.int64())})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def decode_keys(buf) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(buf)).read_all()


def decode_state(buf, n_params: int, n_pairs: int) -> np.ndarray:
    if buf is None:
        return np.full((n_params, n_pairs), INIT_VALUE)
    return np.frombuffer(buf, dtype=np.float64).reshape(n_params, n_pairs)


# ---------------------------------------------------------------------------
# packing (once per fit)
# ---------------------------------------------------------------------------

def pack_block(pdf: pd.DataFrame, M: int) -> tuple[bytes, bytes]:
    """One block's SERPs (serp_id, query_id, doc_ids, clicks; lists cut to M) -> (data, keys)."""
    pdf = pdf.sort_values("serp_id", kind="stable")
    docs = pdf["doc_ids"].to_numpy()
    lens = np.fromiter((len(a) for a in docs), dtype=np.int64, count=len(docs))
    click_lists = pdf["clicks"].to_numpy()
    click_lens = np.fromiter((len(a) for a in click_lists), dtype=np.int64, count=len(docs))
    if not np.array_equal(lens, click_lens):
        raise ValueError("serps rows with clicks and doc_ids of different lengths; "
                         "run them through ingest (which quarantines them) first")
    B = len(pdf)
    mask = np.arange(M)[None, :] < lens[:, None]
    clicks = np.zeros((B, M), dtype=np.int8)
    pair = np.full((B, M), -1, dtype=np.int32)
    if B and lens.sum():
        clicks[mask] = np.concatenate(click_lists).astype(np.int8)
        q = np.repeat(pdf["query_id"].to_numpy(), lens)
        d = np.concatenate(docs)
        # sort=True: pairs in (query_id, doc_id) order, whatever order the rows came in
        codes, uniques = pd.MultiIndex.from_arrays([q, d]).factorize(sort=True)
        pair[mask] = codes.astype(np.int32)
        n_obs = np.bincount(codes, minlength=len(uniques))
        qs, ds = uniques.get_level_values(0).to_numpy(), uniques.get_level_values(1).to_numpy()
    else:
        n_obs, qs, ds = np.zeros(0, np.int64), np.array([], object), np.array([], object)
    return encode_data(clicks, pair, len(n_obs)), encode_keys(qs, ds, n_obs)


@dataclass
class PackedLog:
    """A training log packed into query blocks (cached until `unpersist`)."""

    blocks: DataFrame   # BLOCK_SCHEMA rows, state and stats null; one block per partition
    max_rank: int
    n_serps: int
    n_blocks: int

    def unpersist(self) -> None:
        self.blocks.unpersist()


def n_blocks_for(n_serps: int, block_serps: int | None = None) -> int:
    return max(MIN_BLOCKS, math.ceil(n_serps / (block_serps or BLOCK_SERPS)))


def checkpointed(df: DataFrame, *, keep_cached: bool = False) -> DataFrame:
    """``df`` computed once, its lineage cut where a lost executor's partitions are rebuilt from.

    With a checkpoint directory on the SparkContext (``spark.checkpoint_dir``, reliable storage on a
    cluster) the rows are written there: a lost executor's partitions are read back. Without one they
    are local checkpoints, kept by the executors that computed them and lost with them (the embedded
    default). ``keep_cached``: also serve the reliable copy from the executors' cache (read repeatedly).
    ``df``'s own cache, if any, is released.
    """
    if df.sparkSession.sparkContext.getCheckpointDir() is None:
        return df.localCheckpoint(eager=True)
    if not df.is_cached:  # the checkpoint's count fills the cache, its write job reads it: df is computed once
        df.cache()
    out = df.checkpoint(eager=True)
    df.unpersist()
    return out.cache() if keep_cached else out


def pack_log(prep: DataFrame, max_rank: int, block_serps: int | None = None) -> PackedLog:
    """Pack SERPs (serp_id, query_id, doc_ids, clicks; lists already cut to ``max_rank``)."""
    M = int(max_rank)
    n_serps = prep.count()
    n_blocks = n_blocks_for(n_serps, block_serps)

    def pack(key, pdf: pd.DataFrame) -> pd.DataFrame:
        data, keys = pack_block(pdf, M)
        return pd.DataFrame({"block": [int(key[0])], "data": [data],
                             "keys": [keys], "state": [None], "stats": [None]})

    block_of = F.pmod(F.xxhash64(F.lit("clickeval-block"), F.col("query_id")), F.lit(n_blocks)).cast("int")
    blocks = (
        prep.select("serp_id", "query_id", "doc_ids", "clicks", block_of.alias("block"))
        .groupBy("block").applyInPandas(pack, BLOCK_SCHEMA)
        # one block per task in every iteration: range partitioning on the block number
        .repartitionByRange(n_blocks, "block")
    )
    blocks = checkpointed(blocks, keep_cached=True)
    return PackedLog(blocks=blocks, max_rank=M, n_serps=n_serps, n_blocks=n_blocks)


# ---------------------------------------------------------------------------
# the E- and M-step of one block (pure numpy)
# ---------------------------------------------------------------------------

def stats_layout(model: ClickModel, M: int) -> list[tuple[str, int]]:
    """(name, length) of the sections of a block's stats vector, in order.

    ll: the block's summed per-SERP log-likelihood under the input parameters;
    n: its SERP count; pool_<p>: pooled (num, den) of qd parameter p;
    <global>: (num..., den...) of each global parameter, flattened.
    """
    layout = [("ll", 1), ("n", 1)] + [(f"pool_{p}", 2) for p in model.qd_params]
    layout += [(name, 2 * int(np.prod(shape))) for name, shape in sorted(model.global_shapes(M).items())]
    return layout


def split_stats(model: ClickModel, M: int, vec: np.ndarray) -> dict[str, np.ndarray]:
    out, off = {}, 0
    for name, size in stats_layout(model, M):
        out[name] = vec[off:off + size]
        off += size
    return out


def em_block(model: ClickModel, g: Mapping[str, np.ndarray], clicks: np.ndarray, pair: np.ndarray,
             n_pairs: int, state: np.ndarray, *, estep: bool = True,
             slice_rows: int = SLICE_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """E-step over a block with the given parameters, then the M-step of its qd parameters.

    Returns (new_state, stats vector in `stats_layout` order). With ``estep`` False
    only the log-likelihood is computed and the state comes back unchanged.
    A qd parameter whose denominator is 0 keeps its value (as in PyClick).
    """
    B, M = clicks.shape
    params = model.qd_params
    shapes = dict(sorted(model.global_shapes(M).items()))
    mask = pair >= 0
    index = np.where(mask, pair, 0)
    qd_num = np.zeros((len(params), n_pairs))
    qd_den = np.zeros((len(params), n_pairs))
    g_num = {k: np.zeros(s) for k, s in shapes.items()}
    g_den = {k: np.zeros(s) for k, s in shapes.items()}
    ll = 0.0
    for lo in range(0, B, slice_rows):
        c, m, ix = clicks[lo:lo + slice_rows], mask[lo:lo + slice_rows], index[lo:lo + slice_rows]
        qd = {p: state[j][ix] for j, p in enumerate(params)}
        ll += float(log_likelihood(model.cond_probs(qd, g, c, m), c, m).sum())
        if not estep:
            continue
        st = model.expected_stats(qd, g, c, m)
        flat = ix[m]
        for j, p in enumerate(params):
            num, den = st.qd[p]
            qd_num[j] += np.bincount(flat, weights=np.broadcast_to(num, m.shape)[m], minlength=n_pairs)
            qd_den[j] += np.bincount(flat, weights=np.broadcast_to(den, m.shape)[m], minlength=n_pairs)
        for k, s in shapes.items():
            num, den = st.glob[k]
            g_num[k] += np.broadcast_to(np.asarray(num, dtype=np.float64), s)
            g_den[k] += np.broadcast_to(np.asarray(den, dtype=np.float64), s)
    new_state = np.where(qd_den > 0, qd_num / np.where(qd_den > 0, qd_den, 1.0), state) if estep else state
    parts = [np.array([ll, float(B)])]
    parts += [np.array([qd_num[j].sum(), qd_den[j].sum()]) for j in range(len(params))]
    parts += [np.concatenate([g_num[k].ravel(), g_den[k].ravel()]) for k in shapes]
    return new_state, np.concatenate(parts)


# ---------------------------------------------------------------------------
# Spark side: one iteration, and the qd table at the end
# ---------------------------------------------------------------------------

def _iteration_fn(model: ClickModel, g: Mapping[str, np.ndarray], estep: bool):
    n_params = len(model.qd_params)
    g = {k: np.asarray(v, dtype=np.float64) for k, v in g.items()}

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            states, stats = [], []
            data_col, state_col = batch.column("data"), batch.column("state")
            for i in range(batch.num_rows):
                clicks, pair, n_pairs = decode_data(data_col[i].as_buffer())
                old = state_col[i]
                state = decode_state(old.as_buffer() if old.is_valid else None, n_params, n_pairs)
                new_state, vec = em_block(model, g, clicks, pair, n_pairs, state, estep=estep)
                states.append(np.ascontiguousarray(new_state).tobytes())
                stats.append(vec.tobytes())
            yield pa.RecordBatch.from_arrays(
                [batch.column("block"), data_col, batch.column("keys"),
                 pa.array(states, pa.binary()), pa.array(stats, pa.binary())],
                names=[f.name for f in BLOCK_SCHEMA.fields])

    return run


def run_iteration(blocks: DataFrame, model: ClickModel, g: Mapping[str, np.ndarray], M: int,
                  estep: bool = True) -> tuple[DataFrame, dict[str, np.ndarray]]:
    """One pass over the blocks; returns (new blocks, summed stats by section).

    With ``estep`` the new blocks are materialised (cached) for the next pass; an
    LL-only pass keeps nothing. The per-block vectors are added in block order, so
    the sums do not depend on which task finished first.
    """
    # cache + collect: the collect of the stats is the one job that also fills the cache
    # with the new blocks (a checkpoint would be a second job per pass). The caller
    # unpersists the previous pass's blocks once this one is in place.
    out = blocks.mapInArrow(_iteration_fn(model, g, estep), BLOCK_SCHEMA)
    if estep:
        out = out.cache()
    rows = sorted(out.select("block", "stats").collect(), key=lambda r: r["block"])
    total = np.zeros(sum(size for _, size in stats_layout(model, M)))
    for r in rows:
        total = total + np.frombuffer(r["stats"], dtype=np.float64)
    return out, split_stats(model, M, total)


def qd_table(blocks: DataFrame, model: ClickModel) -> DataFrame:
    """The fitted qd parameters as rows: query_id, doc_id, one double per qd param, n_obs double."""
    params = list(model.qd_params)
    schema = T.StructType([T.StructField("query_id", T.StringType()), T.StructField("doc_id", T.StringType())]
                          + [T.StructField(p, T.DoubleType()) for p in params]
                          + [T.StructField("n_obs", T.DoubleType())])

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for i in range(batch.num_rows):
                keys = decode_keys(batch.column("keys")[i].as_buffer())
                cell = batch.column("state")[i]
                state = decode_state(cell.as_buffer() if cell.is_valid else None, len(params), keys.num_rows)
                yield pa.RecordBatch.from_arrays(
                    [keys.column("query_id").combine_chunks(), keys.column("doc_id").combine_chunks()]
                    + [pa.array(state[j]) for j in range(len(params))]
                    + [pa.array(keys.column("n_obs").to_numpy().astype(np.float64))],
                    names=schema.fieldNames())

    return blocks.select("keys", "state").mapInArrow(run, schema)


def global_params(model: ClickModel, M: int, sums: Mapping[str, np.ndarray],
                  old: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """M-step of the global parameters from summed (num..., den...) sections."""
    out = {}
    for name, shape in sorted(model.global_shapes(M).items()):
        size = int(np.prod(shape))
        num, den = sums[name][:size], sums[name][size:]
        prev = np.broadcast_to(np.asarray(old[name], dtype=np.float64), shape).ravel()
        out[name] = np.where(den > 0, num / np.where(den > 0, den, 1.0), prev).reshape(shape)
    return out


def pooled_prior(model: ClickModel, sums: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Value for unseen pairs: pooled sum(num) / sum(den) of each qd parameter."""
    out = {}
    for p in model.qd_params:
        num, den = sums[f"pool_{p}"]
        out[p] = float(num / den) if den > 0 else INIT_VALUE
    return out
