"""The training log packed into query blocks on Spark, and the fitted pairs unpacked at the end.

Every per-(query, doc) parameter depends only on the SERPs of its own query, so the log is packed
once into blocks (a query's SERPs all go to block xxhash64(query_id) mod n_blocks; with groups, the
group's first block plus that mod the group's n_blocks), one row each (`codec`), and every EM pass
is a narrow stage over them: the blocked layout Spark MLlib's ALS uses for per-key state. Where the
blocks' rows live between passes (partitions, checkpoints) is `layout`'s.

Groups: a packed log may hold several independent logs (the surrogate stage's real log and every
generator's sequences), each in its own consecutive range of blocks, packed as it would be alone.
A group's block count depends only on its number of SERPs and ``block_serps``, so a fit is the same
on any number of partitions or executors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.em.codec import decode_keys, group_of, pack_block
# checkpointed and cluster_slots are part of this module's interface too (the EM passes import them here)
from clickeval_spark.em.layout import (balanced, checkpointed, cluster_slots, release,  # noqa: F401
                                       task_partitions, to_partitions)
from clickeval_spark.fitted.attach import truncate_serps
from clickeval_spark.models.base import ClickModel

#: SERPs per block: enough that a task's numpy work dwarfs a Python task's scheduling cost in every pass,
#: small enough that a block's arrays stay ~13 MB (50 bytes per SERP of 10 ranks); the comparison with
#: 131072 is in benchmarks/RESULTS.md. Logs under MIN_BLOCKS * BLOCK_SERPS SERPs get
#: MIN_BLOCKS blocks either way.
BLOCK_SERPS = 262144

#: at least this many blocks, so small logs still use every core of a small cluster
MIN_BLOCKS = 4

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

#: the pack's rows: a block row, its SERPs and its held-out positions (those whose pair has a training
#: impression too), which the job that fills the pack's cache sums for the driver
_PACKED_SCHEMA = T.StructType([*BLOCK_SCHEMA.fields, T.StructField("n_train", T.LongType(), False),
                               T.StructField("n_held_out", T.LongType(), False),
                               T.StructField("held_out_positions", T.LongType(), False),
                               T.StructField("held_out_seen", T.LongType(), False)])


@dataclass(frozen=True)
class BlockGroup:
    """One independent log of a packed log: blocks first_block .. first_block + n_blocks - 1."""

    first_block: int
    n_blocks: int
    n_serps: int        # training SERPs
    n_held_out: int = 0
    held_out_positions: int = 0
    held_out_seen: int = 0   # held-out positions whose (query, doc) pair has a training impression

    @property
    def seen_share(self) -> float | None:
        """The share of held-out positions whose pair the training SERPs show (None: nothing held out): how
        dense the log is where valid scores it."""
        return self.held_out_seen / self.held_out_positions if self.held_out_positions else None


@dataclass
class PackedLog:
    """A training log (and optionally its held-out SERPs) packed into query blocks (cached until `unpersist`);
    or several independent logs, one `BlockGroup` each."""

    blocks: DataFrame   # BLOCK_SCHEMA rows, state and stats null
    max_rank: int
    groups: tuple[BlockGroup, ...]
    #: block -> (bytes of its data, training SERPs, held-out SERPs, held-out positions, those seen in
    #: training): one entry per block, none per SERP
    sizes: Mapping[int, tuple[int, int, int, int, int]]

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


def pack_log(prep: DataFrame, max_rank: int, block_serps: int | None = None, fold: bool = True,
             at_most: int | None = None, queries: DataFrame | None = None) -> PackedLog:
    """Pack SERPs (query_id, doc_ids, clicks, optional held_out and group; lists already cut to
    ``max_rank``; other columns are ignored).

    Held-out SERPs (``held_out`` true: the valid split) are packed beside the
    training SERPs of their query, so a fit scores them in the same pass.
    ``group`` (int 0..G-1, default 0) packs G independent logs side by side, each
    into the blocks it would get alone.
    ``fold``: Spark folds identical SERPs into weighted rows before the pack, partly before the shuffle.
    That pays on a log that repeats itself (sampled click sequences, several per SERP; fixed lists per
    query: a 10M log of them folds to 1.7M rows); on one that does not (real logs: the TREC sample folds
    2,872 SERPs to 2,490) it is a shuffle of every SERP for nothing. The blocks are the same bytes either
    way: `pack_block` folds what reaches it.
    ``at_most``: one group only; a count of rows ``prep`` has no more of (its input before a filter, which a
    Delta table counts without reading the lists). The block count is taken from it and checked against the
    packed SERPs, which the pack counts anyway: a log that filled fewer blocks than that is packed again.
    ``queries``: one group only; the log's query_id rows (before a filter is fine), counted per block (a read
    of query_id alone), so that the pack's tasks, which Spark starts in partition order, take the largest
    blocks first. A log's largest block holds its head queries: started by its number alone, its task can
    start late in the pack's stage and run on while the other cores idle (benchmarks/RESULTS.md).
    """
    M = int(max_rank)
    if "held_out" not in prep.columns:
        prep = prep.withColumn("held_out", F.lit(False))
    if (at_most is not None or queries is not None) and "group" in prep.columns:
        raise ValueError("pack_log: at_most and queries count one log, not groups")
    if "group" not in prep.columns:
        prep = prep.withColumn("group", F.lit(0))
    groups = _block_groups({0: (at_most, 0)} if at_most is not None else _group_rows(prep), block_serps)
    packed, sizes = packed_blocks(prep, M, groups, block_serps, fold, largest_first(queries, groups))
    exact = _block_groups(_group_counts(groups, sizes), block_serps)
    if [g.n_blocks for g in exact] != [g.n_blocks for g in groups]:   # the filter took a block's worth
        packed.unpersist()
        packed, sizes = packed_blocks(prep, M, exact, block_serps, fold, largest_first(queries, exact))
    blocks = checkpointed(balanced(packed.select(*BLOCK_SCHEMA.fieldNames()), task_partitions(prep, len(sizes)),
                                   sizes), keep_cached=True)
    packed.unpersist()
    return PackedLog(blocks=blocks, max_rank=M, groups=tuple(exact), sizes=sizes)


def largest_first(queries: DataFrame | None, groups: list[BlockGroup]) -> list[int] | None:
    """The blocks of a one-group log, the most query_id rows first (by number on a tie); None without
    ``queries``. One row per block reaches the driver."""
    if queries is None:
        return None
    [group] = groups
    counts = dict.fromkeys(range(group.n_blocks), 0)
    counts.update((int(r["block"]), int(r["n"])) for r in
                  queries.groupBy(_query_block(group.n_blocks).alias("block")).agg(F.count(F.lit(1)).alias("n"))
                  .collect())
    return sorted(counts, key=lambda b: (-counts[b], b))


def _query_block(n_blocks: Column | int) -> Column:
    """A query's block within its group (0..n_blocks-1): a hash of its query_id."""
    return F.pmod(F.xxhash64(F.lit("clickeval-block"), F.col("query_id")), n_blocks)


def _group_rows(prep: DataFrame) -> dict[int, tuple[int, int]]:
    """(training, held-out) SERPs of each group: one row per group reaches the driver (the surrogate's few
    dozen logs at most)."""
    counts = {int(r["group"]): (int(r["all"]) - int(r["held_out"]), int(r["held_out"])) for r in
              prep.groupBy("group").agg(F.count(F.lit(1)).alias("all"),
                                        F.count(F.when(F.col("held_out"), 1)).alias("held_out")).collect()}
    if sorted(counts) != list(range(len(counts))):
        raise ValueError(f"pack_log: groups must be 0..G-1 with SERPs in each, got {sorted(counts)}")
    return counts


def _block_groups(counts: Mapping[int, tuple[int, ...]], block_serps: int | None) -> list[BlockGroup]:
    """Each group's range of blocks, from its (training, held-out) SERPs (and, once packed, its held-out
    positions and those seen in training)."""
    groups, first = [], 0
    for g in range(max(len(counts), 1)):
        n_serps, n_held_out, *positions = counts.get(g, (0, 0))
        n = n_blocks_for(n_serps + n_held_out, block_serps)
        groups.append(BlockGroup(first, n, n_serps, n_held_out, *positions))
        first += n
    return groups


def _group_counts(groups: list[BlockGroup], sizes: Mapping[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
    """(training SERPs, held-out SERPs, held-out positions, those seen in training) per group, summed over its
    blocks."""
    first_blocks = tuple(g.first_block for g in groups)
    counts = {g: (0, 0, 0, 0) for g in range(len(groups))}
    for block, (_, *numbers) in sizes.items():
        g = group_of(block, first_blocks)
        counts[g] = tuple(a + b for a, b in zip(counts[g], numbers))
    return counts


def packed_blocks(prep: DataFrame, M: int, groups: list[BlockGroup], block_serps: int | None, fold: bool,
            order: list[int] | None = None) -> tuple[DataFrame, dict[int, tuple[int, ...]]]:
    """The log packed into ``groups``' blocks (cached, `_PACKED_SCHEMA` rows), and each block's (data bytes,
    training SERPs, held-out SERPs, held-out positions, those seen in training). ``order`` (one group): its
    blocks in the order their pack tasks start."""

    def pack(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """A partition's rows (whole blocks: partitioned by block) -> one row per block."""
        batches = list(batches)
        rows = pa.Table.from_batches(batches) if batches else None
        if rows is None or not rows.num_rows:   # a partition no block went to
            return
        block = rows.column("block").to_numpy()
        if (block == block[0]).all():   # one block (a single log's partitions hold one each): no copy
            parts = [(int(block[0]), rows)]
        else:
            order = np.argsort(block, kind="stable")
            ends = np.flatnonzero(np.diff(block[order])) + 1
            parts = [(int(block[part[0]]), rows.take(pa.array(part))) for part in np.split(order, ends)]
        for b, mine in parts:
            data, keys, counts = pack_block(mine, M)
            yield pa.RecordBatch.from_arrays(
                [pa.array([b], pa.int32()), pa.array([data], pa.binary()),
                 pa.array([keys], pa.binary()), pa.nulls(1, pa.binary()), pa.nulls(1, pa.binary()),
                 *[pa.array([n], pa.int64()) for n in counts]],
                names=_PACKED_SCHEMA.fieldNames())

    def lookup(values: list[int]) -> Column:
        return F.element_at(F.array(*[F.lit(v) for v in values]), F.col("group") + 1)

    block_of = lookup([g.first_block for g in groups]) + _query_block(lookup([g.n_blocks for g in groups]))
    # packed about one block per task (a task's memory is a few blocks' rows, whatever the log's size); with
    # groups, as many tasks as the whole log would get blocks
    n_parts = (groups[0].n_blocks if len(groups) == 1
               else n_blocks_for(sum(g.n_serps + g.n_held_out for g in groups), block_serps))
    rows = prep.select(block_of.cast("int").alias("block"), "held_out", "query_id", "doc_ids", "clicks")
    if fold:
        rows = rows.groupBy(*rows.columns).agg(F.count(F.lit(1)).alias("weight"))
    else:
        rows = rows.withColumn("weight", F.lit(1).cast("long"))
    # a block's rows meet in one partition, block b's in partition b mod n_parts (a single log's: one block
    # each; with ``order``, the largest first), and are grouped there in Arrow: no sort of the rows by Spark
    # (`groupBy().applyInArrow` sorts every row, lists and all, to group them)
    if order is None:
        task = F.pmod(F.col("block"), F.lit(n_parts))
    else:   # block order[t] in partition t
        task = F.element_at(F.array(*[F.lit(t) for t in np.argsort(order).tolist()]), F.col("block") + 1)
    packed = to_partitions(rows, n_parts, task).mapInArrow(pack, _PACKED_SCHEMA).cache()
    # the job that fills the cache: one row per block reaches the driver
    counted = ("n_train", "n_held_out", "held_out_positions", "held_out_seen")
    sizes = {int(r["block"]): (int(r["bytes"]), *(int(r[c]) for c in counted)) for r in
             packed.select("block", F.length("data").alias("bytes"), *counted).collect()}
    return packed, sizes


def pack_serps(serps: DataFrame, max_rank: int = 10, block_serps: int | None = None,
               held_out: DataFrame | None = None, fold: bool = False) -> PackedLog:
    """The training SERPs (`truncate_serps`'s rule) packed into query blocks, once for any number of fits.

    ``held_out`` SERPs (the valid split) ride along in the same blocks: every fit
    scores them at no extra Spark job, which is how `k: auto` picks a prior strength.
    ``fold``: `pack_log`'s; a log of users' SERPs folds little, so by default Spark does not fold it.
    The block count comes from the SERPs before `truncate_serps`' filter (`pack_log`'s ``at_most``): a count
    that reads no list; so does each block's, by which the pack takes the largest first (``queries``).
    """
    prep = truncate_serps(serps, max_rank).withColumn("held_out", F.lit(False))
    at_most, queries = serps.count(), serps.select("query_id")
    if held_out is not None:
        prep = prep.unionByName(truncate_serps(held_out, max_rank)
                                .withColumn("held_out", F.lit(True)))
        at_most += held_out.count()
        queries = queries.unionByName(held_out.select("query_id"))
    return pack_log(prep, max_rank, block_serps, fold, at_most=at_most, queries=queries)


def qd_table(blocks: DataFrame, packed: DataFrame, model: ClickModel, first_blocks: tuple[int, ...] = (0,)
             ) -> DataFrame:
    """Fitted qd parameters as rows: group int, query_id, doc_id, one double per qd param, n_obs double;
    of each group, its chosen candidate's. ``blocks``: a finished fit's (`passes.Passes.finish`: the state is
    the chosen candidate's values); ``packed``: the packed log's, whose keys name the pairs.

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
                group = group_of(block, first_blocks)
                keys = decode_keys(batch.column("keys")[i].as_buffer())
                n_obs = keys.column("n_obs").to_numpy()
                state = np.frombuffer(batch.column("state")[i].as_buffer(), dtype=np.float64)
                values = state.reshape(len(params), keys.num_rows)
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


def sample_of(packed: PackedLog, serps: int) -> PackedLog | None:
    """Blocks of the packed log holding about ``serps`` SERPs (training and held out): a sample of whole
    queries, since a query's SERPs all hash to one block; None when the log is not larger than that.

    One group only (the fit stage's log). The sample's group counts the blocks kept and their SERPs; its
    blocks keep their numbers, which are not consecutive (only `first_block` locates the group).
    """
    [group] = packed.groups
    n = math.ceil(group.n_blocks * serps / max(1, group.n_serps + group.n_held_out))
    if n >= group.n_blocks:
        return None
    # spread over the range of blocks: the sample's queries are those of every part of the hash's range
    ids = sorted({group.first_block + i * group.n_blocks // n for i in range(n)})
    sizes = {b: packed.sizes[b] for b in ids if b in packed.sizes}   # (a block no query hashed to has none)
    kept = packed.blocks.where(F.col("block").isin(ids))
    # its own balance: a few blocks of unequal size, which the log's partitions hold unevenly
    kept = balanced(kept, task_partitions(kept, len(ids)), sizes)
    counts = (sum(v[i] for v in sizes.values()) for i in (1, 2, 3, 4))
    return PackedLog(kept, packed.max_rank, (BlockGroup(group.first_block, len(ids), *counts),), sizes)
