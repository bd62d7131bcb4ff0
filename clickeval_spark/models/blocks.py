"""The training log packed into query blocks: the layout every EM iteration runs on.

EM reads the whole log once per iteration, and every per-(query, doc) parameter
depends only on the SERPs of its own query. So the log is packed once into
``n_blocks`` blocks (a query's SERPs all go to block xxhash64(query_id) mod
n_blocks; with groups, the group's first block plus that mod the group's n_blocks),
each block one row of numpy arrays in binary columns:

    block int,
    data  binary  header (B, M, n_pairs, n_train) + clicks int8 (B, M) + pair int32 (B, M)
                  + weight int32 (B): B distinct rows, each standing for ``weight`` identical
                  SERPs (same query, doc list and clicks: folded at pack time, so a pass's
                  work and bytes follow the distinct rows, not the SERPs)
                  (pair = the block-local index of the rank's (query, doc), -1 = no rank;
                  the first n_train rows are training data, the rest held out (valid))
    keys  binary  Arrow IPC stream: query_id, doc_id, n_obs (training impressions) of each pair
    state binary  float64 (C, 3, n_qd_params, n_pairs): per candidate fit, the pairs' current
                  values and the num / den of the last E-step (null = the start, all 0.5)
    stats binary  float64 vector: per candidate, the block's sums of the last pass (see `stats_layout`)

An EM pass reads and writes every column but ``keys`` (`PASS_SCHEMA`): the pair names are read once,
by `qd_table` at the end, from the packed log's cache.

A packed log may hold several independent logs ("groups": the surrogate stage's real log and
every generator's sequences), each in its own consecutive range of blocks, packed exactly as
it would be alone. A candidate fit belongs to one group: a block runs only its own group's
candidates and keeps only their state, and the other candidates' sums from it are zeros, so
dozens of small fits share one pack and one Spark job per pass.

An EM iteration is then one narrow Spark stage (`mapInArrow`, no shuffle, no join,
no Python call per SERP): each task decodes its block, runs the model's E-step
over it in slices, does the M-step of the block's own qd parameters in place and
returns the block with its new state and a few hundred global sums. Several candidate
fits (one per prior strength of `k: auto`, one per group) share each pass: one Spark job. Only those
sums reach the driver, which adds them up in block order and hands the new global
parameters to the next iteration. This is the blocked layout Spark MLlib's ALS
uses for the same reason (per-key state that never needs a shuffle).

Determinism: a block's rows are sorted by their (pair, clicks) bytes, its pairs by (query_id,
doc_id), and a group's block count depends only on its number of SERPs and
``block_serps``. Every sum is taken in that fixed order, so the fitted parameters
are a function of the data and the config alone: bit-identical on any number of
partitions, shuffle partitions or executors.
"""

from __future__ import annotations

import bisect
import io
import math
from dataclasses import dataclass, replace
from typing import Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.models.attach import list_lengths
from clickeval_spark.models.base import INIT_VALUE, LL_EPS, ClickModel, binned_sums
from clickeval_spark.models.priors import EB_GRID, FamilyPrior, log_prior, pooled_rank_means, posterior_mode, ratio_or

#: SERPs per block: enough that a task's numpy work dwarfs its scheduling cost (a Python task costs ~0.1 s
#: per pass), small enough that a block's arrays stay ~13 MB (50 bytes per SERP of 10 ranks); the paired
#: runs against 131072 are in benchmarks/RESULTS.md. Logs under MIN_BLOCKS * BLOCK_SERPS SERPs get
#: MIN_BLOCKS blocks either way.
BLOCK_SERPS = 262144
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
#: an EM pass's rows: the keys stay in the packed log's cache (only the qd table reads them), so each
#: pass moves a seventh less through Arrow and the cache
PASS_SCHEMA = T.StructType([f for f in BLOCK_SCHEMA.fields if f.name != "keys"])

_HEADER_WORDS = 4  # int64: B, M, n_pairs, n_train


# ---------------------------------------------------------------------------
# encoding
# ---------------------------------------------------------------------------

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
    """(C, 3, P, n_pairs): per candidate the values, last num, last den; None before the first pass."""
    if buf is None:
        return None
    return np.frombuffer(buf, dtype=np.float64).reshape(n_candidates, 3, n_params, n_pairs)


# ---------------------------------------------------------------------------
# packing (once per fit)
# ---------------------------------------------------------------------------

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
    """(code of each value, the distinct values in byte order): codes numbered in that order, so they
    sort as the strings do (UTF-8 byte order is code point order, Python's string order)."""
    encoded = values.dictionary_encode()
    order = pc.sort_indices(encoded.dictionary).to_numpy()
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[encoded.indices.to_numpy()], encoded.dictionary.take(pa.array(order))


def pack_block(rows: pa.Table, M: int) -> tuple[bytes, bytes]:
    """One block's rows (query_id, doc_ids, clicks, held_out, weight: ``weight`` identical SERPs each;
    lists cut to M) -> (data, keys).

    Training rows first, then held-out ones, each folded into weighted distinct rows
    (`fold_rows`); pairs of either get an index in (query_id, doc_id) order, whatever order
    the rows came in; n_obs counts training impressions only.
    """
    held = rows.column("held_out").to_numpy().astype(bool)
    rows = rows.take(pa.array(np.argsort(held, kind="stable")))
    n_train = int((~held).sum())
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
        # one int64 per (query, doc) that sorts as the pair does: np.unique numbers the pairs in that order
        uniques, codes = np.unique(np.repeat(q_codes, lens) * len(d_values) + d_codes, return_inverse=True)
        pair[mask] = codes.astype(np.int32)
        train = mask[:n_train]
        n_obs = np.bincount(pair[:n_train][train], weights=np.broadcast_to(weight[:n_train, None], train.shape)[train],
                            minlength=len(uniques)).astype(np.int64)
        qs, ds = q_values.take(pa.array(uniques // len(d_values))), d_values.take(pa.array(uniques % len(d_values)))
    else:
        n_obs, qs, ds = np.zeros(0, np.int64), pa.array([], pa.string()), pa.array([], pa.string())
    train = fold_rows(clicks[:n_train], pair[:n_train], weight[:n_train])
    held = fold_rows(clicks[n_train:], pair[n_train:], weight[n_train:])
    clicks, pair, weight = (np.concatenate([t, h]) for t, h in zip(train, held))
    return encode_data(clicks, pair, len(n_obs), len(train[2]), weight), encode_keys(qs, ds, n_obs)


@dataclass(frozen=True)
class BlockGroup:
    """One independent log of a packed log: blocks first_block .. first_block + n_blocks - 1."""

    first_block: int
    n_blocks: int
    n_serps: int        # training SERPs
    n_held_out: int = 0


@dataclass
class PackedLog:
    """A training log (and optionally its held-out SERPs) packed into query blocks (cached until `unpersist`);
    or several independent logs, one `BlockGroup` each."""

    blocks: DataFrame   # BLOCK_SCHEMA rows, state and stats null
    max_rank: int
    groups: tuple[BlockGroup, ...]

    @property
    def n_serps(self) -> int:
        return sum(g.n_serps for g in self.groups)

    @property
    def n_held_out(self) -> int:
        return sum(g.n_held_out for g in self.groups)

    @property
    def n_blocks(self) -> int:
        return sum(g.n_blocks for g in self.groups)

    @property
    def first_blocks(self) -> tuple[int, ...]:
        return tuple(g.first_block for g in self.groups)

    def unpersist(self) -> None:
        release(self.blocks)


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
        out = df.localCheckpoint(eager=True)
        df.unpersist()
        return out
    if not df.is_cached:  # the checkpoint's count fills the cache, its write job reads it: df is computed once
        df.cache()
    out = df.checkpoint(eager=True)
    df.unpersist()
    return out.cache() if keep_cached else out


def release(df: DataFrame) -> None:
    """Free what ``df`` holds in the executors: its cache, and the RDD behind a local checkpoint
    (`checkpointed`). ``unpersist`` alone leaves that RDD persisted until the session ends: an EM fit
    kept one copy of every block's state per checkpoint interval (a 10M-SERP fit ran out of heap)."""
    df.unpersist()
    plan = df._jdf.queryExecution().analyzed()   # no public API reaches a checkpoint's RDD
    if plan.nodeName() == "LogicalRDD":
        plan.rdd().unpersist(False)


def pack_log(prep: DataFrame, max_rank: int, block_serps: int | None = None) -> PackedLog:
    """Pack SERPs (query_id, doc_ids, clicks, optional held_out and group; lists already cut to
    ``max_rank``; other columns are ignored).

    Held-out SERPs (``held_out`` true: the valid split) are packed beside the
    training SERPs of their query, so a fit scores them in the same pass.
    ``group`` (int 0..G-1, default 0) packs G independent logs side by side, each
    into the blocks it would get alone.
    """
    M = int(max_rank)
    if "held_out" not in prep.columns:
        prep = prep.withColumn("held_out", F.lit(False))
    if "group" not in prep.columns:
        prep = prep.withColumn("group", F.lit(0))
    # one row per group: the surrogate's few dozen logs at most
    counts = {int(r["group"]): (int(r["all"]) - int(r["held_out"]), int(r["held_out"])) for r in
              prep.groupBy("group").agg(F.count(F.lit(1)).alias("all"),
                                        F.count(F.when(F.col("held_out"), 1)).alias("held_out")).collect()}
    if sorted(counts) != list(range(len(counts))):
        raise ValueError(f"pack_log: groups must be 0..G-1 with SERPs in each, got {sorted(counts)}")
    groups, first = [], 0
    for g in range(max(len(counts), 1)):
        n_serps, n_held_out = counts.get(g, (0, 0))
        n = n_blocks_for(n_serps + n_held_out, block_serps)
        groups.append(BlockGroup(first, n, n_serps, n_held_out))
        first += n
    n_blocks = first

    def pack(key, rows: pa.Table) -> pa.Table:
        data, keys = pack_block(rows, M)
        return pa.Table.from_arrays([pa.array([key[0].as_py()], pa.int32()), pa.array([data], pa.binary()),
                                     pa.array([keys], pa.binary()), pa.nulls(1, pa.binary()), pa.nulls(1, pa.binary())],
                                    names=BLOCK_SCHEMA.fieldNames())

    def lookup(values: list[int]) -> Column:
        return F.element_at(F.array(*[F.lit(v) for v in values]), F.col("group") + 1)

    block_of = (lookup([g.first_block for g in groups])
                + F.pmod(F.xxhash64(F.lit("clickeval-block"), F.col("query_id")), lookup([g.n_blocks for g in groups])))
    # one block per task when alone; with groups, as many tasks as the whole log would get blocks
    n_tasks = n_blocks if len(groups) == 1 else n_blocks_for(sum(map(sum, counts.values())), block_serps)
    blocks = (
        prep.select(block_of.cast("int").alias("block"), "held_out", "query_id", "doc_ids", "clicks")
        # identical SERPs folded into one weighted row by Spark's own aggregation (partly before the
        # shuffle): the Python side packs distinct rows, not SERPs (a 10M-SERP log: 1.7M rows)
        .groupBy("block", "held_out", "query_id", "doc_ids", "clicks").agg(F.count(F.lit(1)).alias("weight"))
        .groupBy("block").applyInArrow(pack, BLOCK_SCHEMA)
        # range partitioning on the block number: a task's blocks are consecutive
        .repartitionByRange(n_tasks, "block")
    )
    blocks = checkpointed(blocks, keep_cached=True)
    return PackedLog(blocks=blocks, max_rank=M, groups=tuple(groups))


# ---------------------------------------------------------------------------
# the E- and M-step of one block (pure numpy)
# ---------------------------------------------------------------------------

def stats_layout(model: ClickModel, M: int) -> list[tuple[str, int]]:
    """(name, length) of the sections of one candidate's stats vector, in order.

    ll: summed per-SERP log-likelihood of the training SERPs under the pass's
    parameters; n: their count; ll_valid / n_valid: summed log-likelihood and
    position count of the held-out (valid) SERPs; lp: log prior density of the
    block's qd values; ppl_n / ppl_ln: per rank, the held-out SERPs reaching it and
    their summed ln P(observed click) under the unconditional click probability
    (perplexity's terms; only in a pass given ``ppl_eps``); pool_<p>: pooled
    (num, den) of qd parameter p; rank_<p>: the same by rank (num..., den...: the
    rank-aware prior means); eb_<p>: p's Beta-binomial log evidence per strength of
    `priors.EB_GRID` (only in a pass asked for it); <global>: (num..., den...) of each global
    parameter, flattened.
    """
    layout = [("ll", 1), ("n", 1), ("ll_valid", 1), ("n_valid", 1), ("lp", 1), ("ppl_n", M), ("ppl_ln", M)]
    layout += [(f"pool_{p}", 2) for p in model.qd_params]
    layout += [(f"rank_{p}", 2 * M) for p in model.qd_params]
    layout += [(f"eb_{p}", len(EB_GRID)) for p in model.qd_params]
    layout += [(name, 2 * int(np.prod(shape))) for name, shape in sorted(model.global_shapes(M).items())]
    return layout


def split_stats(model: ClickModel, M: int, vec: np.ndarray) -> dict[str, np.ndarray]:
    out, off = {}, 0
    for name, size in stats_layout(model, M):
        out[name] = vec[off:off + size]
        off += size
    return out


@dataclass(frozen=True)
class BlockArrays:
    """One block's rows as `em_block` reads them, with what every pass derives from the rows alone.

    The resident engine builds each of its blocks' once per fit (its tasks keep their blocks between
    passes); the stage engine once per pass. Beside the 54 bytes of a packed row (M = 10) it holds
    about 90 more (mask and bins), and a kernel's `row_constants` (UBM: 80).
    """

    clicks: np.ndarray     # int8 (B, M)
    pair: np.ndarray       # int32 (B, M): the block-local pair index, -1 = no rank
    n_pairs: int
    n_train: int           # the first n_train rows are training rows, the rest held out
    weight: np.ndarray     # float64 (B,): how many identical SERPs each row stands for
    mask: np.ndarray       # bool (B, M): the rank exists
    #: intp (B, M): the pair; n_pairs (the spare bin of `base.binned_sums`) where masked; a held-out rank
    #: whose pair has no training impression reads its rank's prior mean, in bin n_pairs + 1 + rank
    bins: np.ndarray
    impressions: np.ndarray   # float64 (n_pairs,): the pair's training impressions, weighted
    rank_impressions: np.ndarray   # float64 (M,): the training impressions at each rank, weighted
    n_valid: float         # positions of the held-out rows, weighted
    const: Mapping[str, np.ndarray]   # the model's `row_constants`

    @classmethod
    def of(cls, model: ClickModel, clicks: np.ndarray, pair: np.ndarray, n_pairs: int, n_train: int | None = None,
           weight: np.ndarray | None = None) -> "BlockArrays":
        B = clicks.shape[0]
        n_train = B if n_train is None else int(n_train)
        weight = np.ones(B) if weight is None else np.asarray(weight, dtype=np.float64)
        mask = pair >= 0
        bins = np.where(mask, pair, n_pairs).astype(np.intp)
        w = np.broadcast_to(weight[:n_train, None], (n_train, clicks.shape[1]))
        impressions = binned_sums(bins[:n_train].ravel(), n_pairs, w.ravel())
        held = bins[n_train:]   # a view
        unseen = held < n_pairs
        if n_pairs:
            unseen &= impressions[np.where(unseen, held, 0)] == 0
        held[unseen] = n_pairs + 1 + np.nonzero(unseen)[1]
        return cls(clicks, pair, int(n_pairs), n_train, weight, mask, bins, impressions=impressions,
                   rank_impressions=(weight[:n_train] @ mask[:n_train]).astype(np.float64),
                   n_valid=float(weight[n_train:] @ mask[n_train:].sum(axis=1)),
                   const=model.row_constants(clicks, mask))

    @classmethod
    def decoded(cls, model: ClickModel, buf) -> "BlockArrays":
        """From an `encode_data` buffer (the arrays are views of it: keep it alive)."""
        clicks, pair, weight, n_pairs, n_train = decode_data(buf)
        return cls.of(model, clicks, pair, n_pairs, n_train, weight)


def em_block(model: ClickModel, g: Mapping[str, np.ndarray], block: BlockArrays, state: np.ndarray | None,
             update: tuple[np.ndarray, np.ndarray] | None = None, *, estep: bool = True,
             held_out: bool = True, ppl_eps: float | None = None, slice_rows: int = SLICE_ROWS,
             compiled: bool | None = None, eb: bool = False, seen_by_rank: bool = False
             ) -> tuple[np.ndarray, np.ndarray]:
    """One EM pass over a block: the qd M-step of the last E-step, then the LL and a new E-step.

    ``state`` is float64 (3, P, n_pairs): the pairs' current values, and the
    num / den of the last E-step (None: the start, every value ``INIT_VALUE``).
    ``update`` = (k, m), each (P,), applies that M-step first as a posterior mode
    (`priors.posterior_mode`; m is the pooled mean the driver computed from every
    block's sums); None leaves the values as they are. The M-step is deferred to
    the next pass because m needs the whole log's sums. Pairs without a training
    impression (seen only in held-out SERPs) get m; or, with a third entry m_rank (P, M),
    the prior mean of the rank they are shown at. ``seen_by_rank``: a pair with training
    impressions is shrunk toward the impression-weighted mean of its ranks' m_rank instead of m.

    Row b stands for ``weight[b]`` identical SERPs (`fold_rows`); every sum counts
    it that many times. The first ``n_train`` rows are training data: they give the
    E-step's sums and the training LL. The rest are held out (the valid split):
    scored only, unless ``held_out`` is False (their sums, n_valid included, are then 0);
    with ``ppl_eps`` also by unconditional click probability per rank,
    clipped to [ppl_eps, 1 - ppl_eps] (perplexity, DESIGN §5). With ``estep`` False
    nothing new is estimated. ``compiled`` (default: the model's ``examination_cells``): the LL and
    the E-step by `compiled.examination_pass` over the whole block, instead of the numpy kernels
    slice by slice (the perplexity terms stay numpy's). ``eb``: also the Beta-binomial evidence of
    the new E-step's counts of the pairs, under the m of ``update`` (empirical Bayes strengths).
    Returns (new state, stats vector in `stats_layout` order).
    """
    clicks, mask, spare, weight, n_train, n_pairs = (block.clicks, block.mask, block.bins, block.weight,
                                                     block.n_train, block.n_pairs)
    B, M = clicks.shape
    params = model.qd_params
    P = len(params)
    shapes = dict(sorted(model.global_shapes(M).items()))
    if state is None:
        values, num_prev, den_prev = np.full((P, n_pairs), INIT_VALUE), np.zeros((P, n_pairs)), np.zeros((P, n_pairs))
    else:
        values, num_prev, den_prev = state[0], state[1], state[2]
    lp = 0.0
    unseen = np.full((P, M), INIT_VALUE)
    if update is not None and P:
        k, m = (np.asarray(a, dtype=np.float64)[:, None] for a in update[:2])
        seen = block.impressions > 0
        unseen = np.asarray(update[2], dtype=np.float64) if len(update) > 2 else np.broadcast_to(m, (P, M))
        m_pair = _pair_means(block, unseen) if seen_by_rank else np.broadcast_to(m, (P, n_pairs))
        values = np.where(seen[None, :], posterior_mode(num_prev, den_prev, values, k, m_pair), m)
        lp = log_prior(values[:, seen], k, m_pair[:, seen])
    # each pair's value; in the spare bin one a masked rank reads (kernels ignore masked ranks); then the
    # values of held-out ranks whose pair has no training impression, by rank (`BlockArrays.bins`)
    padded = np.concatenate([values, np.full((P, 1), INIT_VALUE), unseen], axis=1)
    qd_num = np.zeros((P, n_pairs))
    qd_den = np.zeros((P, n_pairs))
    rank_num, rank_den = np.zeros((P, M)), np.zeros((P, M))
    g_num = {k_: np.zeros(s) for k_, s in shapes.items()}
    g_den = {k_: np.zeros(s) for k_, s in shapes.items()}
    ll = ll_valid = 0.0
    ppl_n, ppl_ln = np.zeros(M), np.zeros(M)
    # training slices, then held-out slices: a slice never mixes the two
    train = [(lo, min(lo + slice_rows, n_train)) for lo in range(0, n_train, slice_rows)]
    valid = [(lo, min(lo + slice_rows, B)) for lo in range(n_train, B, slice_rows)] if held_out else []

    def slice_of(lo, hi):
        qd = {p: padded[j][spare[lo:hi]] for j, p in enumerate(params)}
        return qd, clicks[lo:hi], mask[lo:hi], weight[lo:hi], {k_: v[lo:hi] for k_, v in block.const.items()} or None

    steps = train if estep else []               # slices the numpy E-step runs on
    scored = ([] if estep else train) + valid   # slices only scored
    if model.examination_cells if compiled is None else compiled:
        ll, ll_valid = _examination_pass(g, block, padded[0], estep, held_out, qd_num[0], g_num["gamma"],
                                         g_den["gamma"], rank_num[0])
        steps = scored = []   # the compiled pass did both
    for lo, hi in steps:
        qd, c, m_, w, const = slice_of(lo, hi)
        # the E-step and the LL under the same parameters, in one kernel call
        st, row_ll = model.estep_and_log_likelihood(qd, g, c, m_, w, const)
        ll += float(row_ll @ w)
        flat, w_col = spare[lo:hi].ravel(), w[:, None]
        for j, p in enumerate(params):
            num, den = st.qd[p]
            num_w = np.broadcast_to(num * w_col, m_.shape)
            qd_num[j] += binned_sums(flat, n_pairs, num_w.ravel())
            rank_num[j] += np.where(m_, num_w, 0.0).sum(axis=0)
            if p not in model.impression_dens:
                den_w = np.broadcast_to(den * w_col, m_.shape)
                qd_den[j] += binned_sums(flat, n_pairs, den_w.ravel())
                rank_den[j] += np.where(m_, den_w, 0.0).sum(axis=0)
        for k_, s in shapes.items():
            num, den = st.glob[k_]
            g_num[k_] += np.broadcast_to(np.asarray(num, dtype=np.float64), s)
            g_den[k_] += np.broadcast_to(np.asarray(den, dtype=np.float64), s)
    for lo, hi in scored:
        qd, c, m_, w, const = slice_of(lo, hi)
        part = float(model.scored_log_likelihood(qd, g, c, m_, const) @ w)
        if lo < n_train:
            ll += part
        else:
            ll_valid += part
    for lo, hi in valid if ppl_eps is not None else []:
        qd, c, m_, w, _ = slice_of(lo, hi)
        p = np.clip(model.click_probs(qd, g, m_), ppl_eps, 1 - ppl_eps)
        # log(1 - p), not log1p: the same terms as the SQL perplexity (click_prediction.log_lik)
        ppl_ln += w @ np.where(m_, np.where(c == 1, np.log(p), np.log(1.0 - p)), 0.0)
        ppl_n += w @ m_
    if not estep:
        qd_num, qd_den = num_prev, den_prev
    else:   # sums of whole weights: the same in any order, so the same bits as summing them slice by slice
        for j, p in enumerate(params):
            if p in model.impression_dens:
                qd_den[j] = block.impressions
                rank_den[j] = block.rank_impressions
    new_state = np.stack([values, qd_num, qd_den])
    parts = [np.array([ll, float(weight[:n_train].sum()), ll_valid, block.n_valid if held_out else 0.0, lp]),
             ppl_n, ppl_ln]
    parts += [np.array([qd_num[j].sum(), qd_den[j].sum()]) for j in range(P)]
    parts += [np.concatenate([rank_num[j], rank_den[j]]) for j in range(P)]
    parts += [_evidence(qd_num[j], qd_den[j], m_pair[j]) if eb and estep and update is not None
              else np.zeros(len(EB_GRID)) for j in range(P)]
    parts += [np.concatenate([g_num[k_].ravel(), g_den[k_].ravel()]) for k_ in shapes]
    return new_state, np.concatenate(parts)


def _evidence(num: np.ndarray, den: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The pairs' Beta-binomial log evidence per strength of `EB_GRID`, each around its prior mean m."""
    from clickeval_spark.models.compiled import beta_binomial_evidence   # numba: see `_examination_pass`

    out = np.zeros(len(EB_GRID))
    beta_binomial_evidence(num, den, np.ascontiguousarray(m, dtype=np.float64), np.asarray(EB_GRID), out)
    return out


def _pair_means(block: BlockArrays, by_rank: np.ndarray) -> np.ndarray:
    """(P, n_pairs): each pair's impression-weighted mean of ``by_rank`` (P, M) over its training ranks
    (INIT_VALUE for a pair without one)."""
    n, M = block.n_train, block.clicks.shape[1]
    bins = block.bins[:n].ravel()
    w = np.broadcast_to(block.weight[:n, None], (n, M))
    sums = np.stack([binned_sums(bins, block.n_pairs, (w * row[None, :]).ravel()) for row in by_rank])
    return ratio_or(sums, block.impressions[None, :], INIT_VALUE)


def _examination_pass(g: Mapping[str, np.ndarray], block: BlockArrays, alpha: np.ndarray, estep: bool, held_out: bool,
                      alpha_num: np.ndarray, gamma_num: np.ndarray, gamma_den: np.ndarray,
                      alpha_rank_num: np.ndarray) -> tuple[float, float]:
    """(training LL, held-out LL or 0 without ``held_out``) of an examination model's block
    (`compiled.examination_pass`); with ``estep`` the training rows' E-step sums are added to
    alpha_num (n_pairs,), gamma_num, gamma_den and alpha_rank_num (M,)."""
    # imported here: numba costs a process ~125 MB and 0.3 s, and only processes that run EM passes need it
    from clickeval_spark.models.compiled import examination_pass

    gamma = np.asarray(g["gamma"], dtype=np.float64)
    exam = np.append(gamma.ravel(), 0.0)   # the spare cell: masked ranks
    a_num, e_num, e_den = np.zeros(alpha.size), np.zeros(exam.size), np.zeros(exam.size)
    r_num = np.zeros(block.clicks.shape[1])
    rows = (alpha, block.bins, block.const["cell"], block.clicks, block.mask, block.weight, exam)
    ll = examination_pass(*rows, 0, block.n_train, estep, LL_EPS, a_num, e_num, e_den, r_num)
    ll_valid = (examination_pass(*rows, block.n_train, len(block.weight), False, LL_EPS, a_num, e_num, e_den, r_num)
                if held_out else 0.0)
    alpha_num += a_num[:block.n_pairs]
    alpha_rank_num += r_num
    gamma_num += e_num[:-1].reshape(gamma.shape)
    gamma_den += e_den[:-1].reshape(gamma.shape)
    return ll, ll_valid

# ---------------------------------------------------------------------------
# Spark side: one pass for several candidate fits, and the qd table at the end
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class PassPlan:
    """What one candidate fit does in a pass.

    mode: "step" (M-step of ``update``, LL, E-step), "score" (M-step, LL only:
    the final pass) or "hold" (converged: state kept, nothing computed).
    group: the packed log's group the candidate is fitted on (`BlockGroup`).
    ppl_eps: also score the held-out SERPs' perplexity terms (`em_block`).
    held_out: score the held-out SERPs at all (the driver asks only when it reads their LL).
    eb: also sum the Beta-binomial evidence of the qd families (`em_block`).
    seen_by_rank: pairs seen in training shrink toward their ranks' mean (`em_block`).
    """

    mode: str
    g: Mapping[str, np.ndarray]
    update: tuple[np.ndarray, np.ndarray] | None
    group: int = 0
    ppl_eps: float | None = None
    held_out: bool = True
    eb: bool = False
    seen_by_rank: bool = False


def _group_of(block: int, first_blocks: tuple[int, ...]) -> int:
    """The group a block belongs to: groups occupy consecutive block ranges starting at ``first_blocks``."""
    return bisect.bisect_right(first_blocks, block) - 1


def _lanes(plans: list[PassPlan], n_groups: int) -> list[list[int]]:
    """Per group, the indices of its candidates: the order of their state slots in the group's blocks."""
    stray = sorted({p.group for p in plans} - set(range(n_groups)))
    if stray:   # its blocks do not exist: the fit would silently sum zeros
        raise ValueError(f"pass plan for group(s) {stray}, but the packed log has groups 0..{n_groups - 1}")
    return [[c for c, plan in enumerate(plans) if plan.group == g] for g in range(n_groups)]


def block_pass(model: ClickModel, plans: list[PassPlan], lanes: list[list[int]], first_blocks: tuple[int, ...],
               block: int, arrays: BlockArrays, state_buf) -> tuple[np.ndarray, np.ndarray]:
    """One pass of every candidate over one block: (the block's new state (C_g, 3, P, n_pairs), its stats vector
    for all C candidates, zeros where a candidate is not the block's group's or holds).

    ``arrays``: the block's rows (`BlockArrays`); ``state_buf``: its state (None before the first pass).
    """
    P = len(model.qd_params)
    mine = lanes[_group_of(block, first_blocks)]
    n_pairs = arrays.n_pairs
    state = decode_state(state_buf, len(mine), P, n_pairs)
    size = sum(n for _, n in stats_layout(model, arrays.clicks.shape[1]))
    new, vec = np.empty((len(mine), 3, P, n_pairs)), np.zeros(len(plans) * size)
    for slot, c in enumerate(mine):
        plan = plans[c]
        if plan.mode == "hold":   # only after a first pass: the state exists
            new[slot] = state[slot]
            continue
        new[slot], vec[c * size:(c + 1) * size] = em_block(
            model, plan.g, arrays, None if state is None else state[slot], plan.update,
            estep=plan.mode == "step", held_out=plan.held_out, ppl_eps=plan.ppl_eps, eb=plan.eb,
            seen_by_rank=plan.seen_by_rank)
    return new, vec


def pass_plans(plans: list[PassPlan], n_groups: int) -> tuple[list[PassPlan], list[list[int]]]:
    """The plans with float64 global parameters, and their lanes (`_lanes`): what a task needs for `block_pass`."""
    plans = [replace(p, g={k: np.asarray(v, dtype=np.float64) for k, v in p.g.items()}) for p in plans]
    return plans, _lanes(plans, n_groups)


def sum_block_stats(model: ClickModel, M: int, plans: list[PassPlan], vecs: Iterable[np.ndarray],
                    ) -> list[dict[str, np.ndarray] | None]:
    """Per candidate, the sum of the blocks' stats vectors ``vecs`` (in block order: the sums are then the
    same whatever task finished first); None for a held candidate."""
    size = sum(n for _, n in stats_layout(model, M))
    total = np.zeros(len(plans) * size)
    for vec in vecs:
        total = total + vec
    return [None if plan.mode == "hold" else split_stats(model, M, total[c * size:(c + 1) * size])
            for c, plan in enumerate(plans)]


def _iteration_fn(model: ClickModel, plans: list[PassPlan], first_blocks: tuple[int, ...]):
    plans, lanes = pass_plans(plans, len(first_blocks))

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            states, stats = [], []
            data_col, state_col = batch.column("data"), batch.column("state")
            for i, block in enumerate(batch.column("block").to_pylist()):
                old = state_col[i]
                new, vec = block_pass(model, plans, lanes, first_blocks, block,
                                      BlockArrays.decoded(model, data_col[i].as_buffer()),
                                      old.as_buffer() if old.is_valid else None)
                stats.append(vec.tobytes())
                states.append(new.tobytes())
            yield pa.RecordBatch.from_arrays(
                [batch.column("block"), data_col, pa.array(states, pa.binary()), pa.array(stats, pa.binary())],
                names=PASS_SCHEMA.fieldNames())

    return run


def run_iteration(blocks: DataFrame, model: ClickModel, plans: list[PassPlan], M: int,
                  first_blocks: tuple[int, ...] = (0,)) -> tuple[DataFrame, list[dict[str, np.ndarray] | None]]:
    """One pass over the blocks (the packed log's, or the last pass's) for every candidate; returns (the new
    blocks as PASS_SCHEMA rows, the summed stats per candidate).

    The new blocks are materialised (cached) for the next pass or the qd table;
    the caller unpersists the previous pass's blocks once these are in place.
    A held candidate's sums are None. The per-block vectors are added in block
    order, so the sums do not depend on which task finished first.
    """
    # cache + collect: the collect of the stats is the one job that also fills the cache
    # with the new blocks (a checkpoint would be a second job per pass)
    out = (blocks.select(*PASS_SCHEMA.fieldNames())
           .mapInArrow(_iteration_fn(model, plans, first_blocks), PASS_SCHEMA)
           .cache())
    rows = sorted(out.select("block", "stats").collect(), key=lambda r: r["block"])
    return out, sum_block_stats(model, M, plans, (np.frombuffer(r["stats"], dtype=np.float64) for r in rows))


def qd_table(blocks: DataFrame, packed: DataFrame, model: ClickModel, slots: tuple[int, ...] = (0,),
             first_blocks: tuple[int, ...] = (0,)) -> DataFrame:
    """Fitted qd parameters as rows: group int, query_id, doc_id, one double per qd param, n_obs double;
    of each group g, the candidate in its state slot ``slots[g]`` (its position among g's candidates).
    ``blocks``: the last pass's; ``packed``: the packed log's, whose keys name the pairs.

    Only pairs with a training impression (n_obs > 0): pairs seen only in held-out
    SERPs are not estimates.
    """
    params = list(model.qd_params)
    schema = T.StructType([T.StructField("group", T.IntegerType()), T.StructField("query_id", T.StringType()),
                           T.StructField("doc_id", T.StringType())]
                          + [T.StructField(p, T.DoubleType()) for p in params]
                          + [T.StructField("n_obs", T.DoubleType())])
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for i, block in enumerate(batch.column("block").to_pylist()):
                group = _group_of(block, first_blocks)
                keys = decode_keys(batch.column("keys")[i].as_buffer())
                n_obs = keys.column("n_obs").to_numpy()
                state = np.frombuffer(batch.column("state")[i].as_buffer(), dtype=np.float64)
                values = state.reshape(-1, 3, len(params), keys.num_rows)[slots[group], 0]
                train = n_obs > 0
                yield pa.RecordBatch.from_arrays(
                    [pa.array(np.full(int(train.sum()), group, dtype=np.int32)),
                     keys.column("query_id").combine_chunks().filter(pa.array(train)),
                     keys.column("doc_id").combine_chunks().filter(pa.array(train))]
                    + [pa.array(values[j][train]) for j in range(len(params))]
                    + [pa.array(n_obs[train].astype(np.float64))],
                    names=schema.fieldNames())

    # a merge join: block rows are MBs each, never broadcast through the driver
    keys = packed.select("block", "keys").hint("merge")
    return blocks.select("block", "state").join(keys, on="block", how="inner").mapInArrow(run, schema)


def global_params(model: ClickModel, M: int, sums: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray],
                  prior: Mapping[str, FamilyPrior], frozen_means: Mapping[str, np.ndarray] | None = None,
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """M-step of the global parameters from summed (num..., den...) sections, as posterior modes.

    Returns (values, prior means m): a pooled family's m is its rank's pooled mean, or its
    entry in ``frozen_means`` once the warm-up has fixed it.
    """
    out, means = {}, {}
    for name, shape in sorted(model.global_shapes(M).items()):
        size = int(np.prod(shape))
        num, den = sums[name][:size].reshape(shape), sums[name][size:].reshape(shape)
        prev = np.broadcast_to(np.asarray(old[name], dtype=np.float64), shape)
        fam = prior[name]
        if frozen_means is not None and name in frozen_means:
            m = frozen_means[name]
        elif fam.m is None and fam.k > 0:
            m = pooled_rank_means(num, den)
        else:
            m = np.asarray(INIT_VALUE if fam.m is None else fam.m)
        out[name] = posterior_mode(num, den, prev, fam.k, m)
        means[name] = m
    return out, means
