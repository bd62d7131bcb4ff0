"""The stage engine: every EM pass one narrow Spark job over the blocks, checkpointed every few passes.

A pass is a `mapInArrow` over the last pass's blocks (no shuffle, no join, no Python call per SERP):
each task runs `sums.block_pass` on its blocks and returns them with their new state and stats. The
output is cached by the same job that collects the stats, and becomes the next pass's input.
"""

from __future__ import annotations

import logging
import time
from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from clickeval_spark.em.blocks import PASS_SCHEMA, PackedLog, checkpointed, release
from clickeval_spark.em.codec import chosen_values
from clickeval_spark.em.passes import PassMode, PassPlan
from clickeval_spark.em.step import BlockArrays
from clickeval_spark.em.sums import block_pass, pass_plans, sum_block_stats
from clickeval_spark.models.base import ClickModel

def iteration_fn(model: ClickModel, plans: list[PassPlan], first_blocks: tuple[int, ...]):
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


def _chosen_fn(chosen: tuple[tuple[int, int], ...], first_blocks: tuple[int, ...]):
    """The blocks with each one's chosen candidate's values as state (`Passes.finish`)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            state_col = batch.column("state")
            values = [chosen_values(state_col[i].as_buffer(), block, chosen, first_blocks)
                      for i, block in enumerate(batch.column("block").to_pylist())]
            values = [None if v is None else v.tobytes() for v in values]   # None: no pass ran
            yield pa.RecordBatch.from_arrays([batch.column("block"), batch.column("data"), pa.array(values, pa.binary()),
                                              batch.column("stats")], names=PASS_SCHEMA.fieldNames())

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
           .mapInArrow(iteration_fn(model, plans, first_blocks), PASS_SCHEMA)
           .cache())
    rows = sorted(out.select("block", "stats").collect(), key=lambda r: r["block"])
    return out, sum_block_stats(model, M, plans, (np.frombuffer(r["stats"], dtype=np.float64) for r in rows))


class StagePasses:
    """`Passes` as one Spark job per pass over ``packed``'s blocks.

    Every ``checkpoint_interval``-th pass's blocks are checkpointed before the next step pass (as ALS's
    ``checkpointInterval``): with a checkpoint directory on the SparkContext to reliable storage, so a
    lost executor's blocks are recomputed from the last checkpoint, not from pass 1; without one
    locally, which at least cuts the lineage that grows by one stage per pass (past ~80 passes it
    overflows the JVM stack when a task is serialised).
    """

    def __init__(self, packed: PackedLog, model: ClickModel, checkpoint_interval: int = 10,
                 log: logging.Logger | None = None):
        self._packed, self.model, self.M = packed, model, packed.max_rank
        self._interval, self._log = checkpoint_interval, log or logging.getLogger(__name__)
        self._blocks, self._done = packed.blocks, 0

    def run(self, plans: list[PassPlan]) -> list[dict[str, np.ndarray] | None]:
        if self._done and self._done % self._interval == 0 and any(p.mode == PassMode.STEP for p in plans):
            t0 = time.perf_counter()
            self._blocks = checkpointed(self._blocks)
            self._log.debug("%s pass %d checkpointed: %.2f s", self.model.name, self._done, time.perf_counter() - t0)
        blocks, sums = run_iteration(self._blocks, self.model, plans, self.M, self._packed.first_blocks)
        self._drop()
        self._blocks, self._done = blocks, self._done + 1
        return sums

    def finish(self, chosen: tuple[tuple[int, int], ...]) -> DataFrame:
        # the data goes out empty before the map (the packed log keeps it): Spark cannot prune through it
        rows = self._blocks.select("block", F.lit(b"").alias("data"), "state", "stats")
        return rows.mapInArrow(_chosen_fn(tuple(chosen), self._packed.first_blocks), PASS_SCHEMA)

    def end(self) -> None:
        self.close()

    def close(self) -> None:
        self._drop()
        self._blocks = self._packed.blocks

    def _drop(self) -> None:   # a pass's blocks, never the packed log's
        if self._blocks is not self._packed.blocks:
            release(self._blocks)
