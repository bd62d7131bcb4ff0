"""Bringing fitted per-(query, doc) parameters to SERPs, and SERP lists as padded numpy arrays:
what predict and the sampler share (EM packs its own blocks, em/blocks.py).

The kernels' side runs in `mapInArrow`: list columns reach numpy as their flat values and
lengths, and go back the same way, with no Python object per SERP (`batch_arrays`, `list_array`).

Several models are attached together through one wide table, a column per (model, qd
parameter) (`wide_qd`, `wide_col`): the models of a run share their (query, doc) pairs, so
one attach serves them all and one kernel pass runs each model on the same batch.

`truncate_serps` is the one place that decides which SERPs the models see (fit,
predict and the sampler all start there).
"""

from __future__ import annotations

from functools import reduce
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from clickeval_spark.models.base import INIT_VALUE

if TYPE_CHECKING:  # FittedModel calls predict and sampling, which import this module: only a type here
    from clickeval_spark.fitted import FittedModel


def truncate_serps(serps: DataFrame, max_rank: int, keep: Sequence[str] = (),
                   cut: Sequence[str] = ()) -> DataFrame:
    """SERPs with a query and at least one result, lists cut to ``max_rank`` ranks.

    The one place that decides which SERPs the models see (fit, predict and the
    sampler all start here). Output: ``keep`` columns (as they are, but those
    also named in ``cut``, per-rank lists such as vtypes, are cut to
    ``max_rank`` too), query_id, doc_ids, clicks.
    """
    out = serps.filter(F.col("query_id").isNotNull() & (F.size(F.col("doc_ids")) > 0))
    extra = [c for c in keep if c not in ("query_id", "doc_ids", "clicks")]
    return out.select(
        *[F.slice(F.col(c), 1, max_rank).alias(c) if c in cut else F.col(c) for c in extra],
        "query_id",
        F.slice(F.col("doc_ids"), 1, max_rank).alias("doc_ids"),
        F.slice(F.col("clicks"), 1, max_rank).alias("clicks"),
    )


def qd_array_col(p: str) -> str:
    """Name of the per-rank array column holding qd parameter ``p`` after `attach_qd`."""
    return f"_qd_{p}"


def _lookup_struct(d: Column) -> Column:
    return F.try_element_at(F.col("_qd_map"), d)


def _at_rank(default: float | Sequence[float], pos: Column) -> Column:
    """The value for an unseen pair at 0-based position ``pos``: ``default`` itself, or its entry for
    that rank (the last entry past its end)."""
    if np.ndim(default) == 0:
        return F.lit(float(default))
    values = F.array(*[F.lit(float(v)) for v in default])
    return F.element_at(values, F.least(pos + 1, F.lit(len(default))))


def _field_or(p: str, default: float | Sequence[float]):
    def fn(x: Column, i: Column) -> Column:
        return F.coalesce(x.getField(p), _at_rank(default, i))

    return fn


def _field(p: str):
    def fn(x: Column) -> Column:
        return x.getField(p)

    return fn


#: Queries with more than this many (query, doc) pairs in the qd table get their
#: parameters through the impression join of `attach_qd`; the others through a
#: per-query map (predict and the sampler). A map lookup's cost per SERP grows with the
#: query's doc count, the join's does not; the two tie near 300 (benchmarks/RESULTS.md).
MAP_MAX_DOCS = 300


def attach_qd(df: DataFrame, qd: DataFrame | None, params: Sequence[str],
              prior: Mapping[str, float | Sequence[float]]) -> DataFrame:
    """Add one array<double> column per qd parameter aligned with ``doc_ids``.

    ``qd`` = None means "no estimates yet": every rank gets ``prior[p]``.
    Pairs missing from ``qd`` get ``prior[p]``: one value, or one per rank (rank 1
    first; the last one past its end). Output: df's columns + the
    `qd_array_col(p)` columns (rows in no particular order).

    Two routes, chosen per query by its number of pairs in ``qd`` (a window
    count, computed in Spark):

    * at most `MAP_MAX_DOCS` pairs (the common case): the query's pairs become
      one ``map<doc_id, struct<params>>``, merge-joined to its SERPs on
      query_id (the SERPs are not reshuffled when they are already partitioned
      by query_id, as in `fit`) and looked up once per rank for all parameters.
      A map lookup is a linear scan, so this costs O(#docs of the query) per
      rank, and the map rides along with every SERP row of the query: fine for
      small queries only.
    * more pairs (head queries): the query's SERPs are exploded to impressions
      (row id, rank, query_id, doc_id), left-joined with the qd rows on
      (query_id, doc_id) and regrouped per SERP (the SERP's own columns ride
      along once, on its first impression); arrays are ordered by rank with
      ``array_sort``. Cost is linear in the impressions, and the lookup join
      and regroup of a head query's impressions are spread over all partitions
      instead of one task.

    Nothing goes through the driver: no collect, no broadcast (the joins carry
    hints that keep adaptive execution from broadcasting a qd-derived side).
    """
    if not params:
        return df
    if qd is None:
        arrays = [F.transform(F.col("doc_ids"), _constant(prior[p])).alias(qd_array_col(p))
                  for p in params]
        return df.select(*df.columns, *arrays)
    return attach_by_size(df, qd, params, prior, MAP_MAX_DOCS)


def attach_by_size(df: DataFrame, qd: DataFrame, params: Sequence[str],
                   prior: Mapping[str, float | Sequence[float]], max_map_docs: int) -> DataFrame:
    """`attach_qd` with an explicit threshold (0: every query takes the join route)."""
    n_docs = F.count(F.lit(1)).over(Window.partitionBy("query_id"))
    sized = qd.select("query_id", "doc_id", *[F.col(p) for p in params], n_docs.alias("_qd_n"))
    small = F.col("_qd_n") <= F.lit(int(max_map_docs))

    # --- small queries: one map per query, joined on query_id --------------------
    maps = (
        sized.groupBy("query_id")
        .agg(F.map_from_entries(F.collect_list(F.when(small, F.struct(
            F.col("doc_id"), F.struct(*[F.col(p).alias(p) for p in params]))))).alias("_qd_map"),
             (F.max("_qd_n") > F.lit(int(max_map_docs))).alias("_qd_big"))
    )
    # never broadcast the maps: a broadcast goes through the driver (scale rule); a
    # sort-merge join on query_id reuses the SERPs' query partitioning. One map scan
    # per rank for all parameters: look the struct up once, then split it.
    by_map = (
        df.join(maps.hint("merge"), on="query_id", how="left")
        .filter(~F.coalesce(F.col("_qd_big"), F.lit(False)))
        .select(*df.columns, F.transform(F.col("doc_ids"), _lookup_struct).alias("_qd_found"))
        .select(*df.columns, *[F.transform(F.col("_qd_found"), _field_or(p, prior[p])).alias(qd_array_col(p))
                               for p in params])
    )

    # --- large queries: impressions joined on (query_id, doc_id), regrouped --------
    big = sized.filter(~small)
    big_queries = big.select("query_id").distinct()
    big_pairs = big.select(F.col("query_id").alias("_qd_q"), F.col("doc_id").alias("_qd_d"),
                           *[F.col(p).alias(f"_qd_v_{p}") for p in params])
    # a semi join against the few large query ids: hashed, so the SERPs are not sorted;
    # when there is none, adaptive execution drops this whole branch. The row id only
    # has to be unique within this plan (Spark reruns a whole stage on retry when a
    # nondeterministic expression feeds a shuffle).
    rows = (
        df.join(big_queries.hint("shuffle_hash"), on="query_id", how="left_semi")
        .select(F.monotonically_increasing_id().alias("_qd_sid"), F.struct(*df.columns).alias("_qd_row"))
    )
    imps = rows.select("_qd_sid", "_qd_row", F.posexplode_outer(F.col("_qd_row.doc_ids")).alias("_qd_pos", "_qd_d"))
    imps = imps.select(
        "_qd_sid", "_qd_pos", F.col("_qd_row.query_id").alias("_qd_q"), "_qd_d",
        # the SERP's own columns travel once, on its first impression
        F.when(F.coalesce(F.col("_qd_pos"), F.lit(0)) == 0, F.col("_qd_row")).alias("_qd_row"),
    )
    looked_up = imps.join(big_pairs.hint("merge"), on=["_qd_q", "_qd_d"], how="left")
    entry = F.struct(F.col("_qd_pos").alias("pos"),
                     *[F.coalesce(F.col(f"_qd_v_{p}"), _at_rank(prior[p], F.col("_qd_pos"))).alias(p)
                       for p in params])
    regrouped = looked_up.groupBy("_qd_sid").agg(
        F.first("_qd_row", ignorenulls=True).alias("_qd_row"),
        F.array_sort(F.collect_list(F.when(F.col("_qd_pos").isNotNull(), entry))).alias("_qd_vals"),
    )
    no_list = F.col("_qd_row.doc_ids").isNull()
    by_join = regrouped.select(
        *[F.col("_qd_row").getField(c).alias(c) for c in df.columns],
        *[F.when(no_list, F.lit(None)).otherwise(F.transform(F.col("_qd_vals"), _field(p)))
          .alias(qd_array_col(p)) for p in params],
    )
    return by_map.unionByName(by_join)


# --- several models at once: their qd parameters side by side (predict, the sampler) ----------

def wide_col(model: str, p: str) -> str:
    """The column of model ``model``'s qd parameter ``p`` in a wide qd table (`wide_qd`)."""
    return f"{model}__{p}"


def wide_cols(fitted: Mapping[str, FittedModel]) -> list[str]:
    """The `wide_col` names of every model's qd parameters, models in order."""
    return [wide_col(name, p) for name, f in fitted.items() for p in f.model.qd_params]


def wide_prior(fitted: Mapping[str, FittedModel]) -> dict[str, list[float]]:
    """Each `wide_col`'s values for pairs without one, by rank: its model's `FittedModel.unseen_at_ranks`."""
    return {wide_col(name, p): f.unseen_at_ranks(p) for name, f in fitted.items() for p in f.model.qd_params}


def wide_qd(fitted: Mapping[str, FittedModel]) -> DataFrame:
    """query_id, doc_id and one column per (model, qd parameter), `wide_col`: every model's
    pairs in one table, null where a model has no value for the pair.

    From the models' own qd tables (one outer aggregation); the predict stage builds the
    same table straight from model_params (`params_io.wide_qd_rows`), in one pass.
    """
    parts = [f.qd.select("query_id", "doc_id", *[F.col(p).cast("double").alias(wide_col(name, p))
                                                 for p in f.model.qd_params])
             for name, f in fitted.items() if f.model.qd_params]
    if not parts:
        spark = next(iter(fitted.values())).qd.sparkSession
        return spark.createDataFrame([], "query_id string, doc_id string")
    if len(parts) == 1:
        return parts[0]
    return (reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
            .groupBy("query_id", "doc_id")
            .agg(*[F.max(c).alias(c) for c in wide_cols(fitted)]))


def attach_models(df: DataFrame, fitted: Mapping[str, FittedModel], qd: DataFrame | None = None) -> DataFrame:
    """`attach_qd` of every model's qd parameters at once: the `wide_cols` columns, each model's prior for the
    pairs it has no value for. ``qd``: the models' `wide_qd` table, when the caller has a cheaper way to build it."""
    cols = wide_cols(fitted)
    return attach_qd(df, wide_qd(fitted) if qd is None and cols else qd, cols, wide_prior(fitted))


def wide_models(fitted: Mapping[str, FittedModel]) -> list[tuple[str, object, dict, dict[str, str]]]:
    """(name, kernel, global parameters, {qd parameter: its `wide_col`}) per model: what a kernel pass over
    attached wide columns needs of each model."""
    return [(name, f.model, f.glob, {p: wide_col(name, p) for p in f.model.qd_params}) for name, f in fitted.items()]


def shared_max_rank(fitted: Mapping[str, FittedModel]) -> int:
    """The one max_rank of models attached together."""
    ranks = {f.max_rank for f in fitted.values()}
    if len(ranks) != 1:
        raise ValueError(f"models predicted together share one max_rank; got {sorted(ranks)}")
    return ranks.pop()


def _constant(value: float | Sequence[float]):
    def fn(d: Column, i: Column) -> Column:
        return _at_rank(value, i)

    return fn


def list_value_lengths(lists: pa.Array | np.ndarray) -> np.ndarray:
    """Each list's length (0 for a null list), as int64: an Arrow list array, or a numpy array of lists."""
    if isinstance(lists, pa.Array):
        return pc.fill_null(pc.list_value_length(lists), 0).to_numpy().astype(np.int64)
    return np.fromiter((len(a) for a in lists), dtype=np.int64, count=len(lists))


def padded(lists: pa.Array, mask: np.ndarray, dtype, fill=0) -> np.ndarray:
    """A list column as a (B, M) array, ``fill`` where ``mask`` is False: the lists' flat values stored
    through the mask in one step (no per-row Python). Null elements become NaN (floats)."""
    out = np.full(mask.shape, fill, dtype=dtype)
    out[mask] = lists.flatten().to_numpy(zero_copy_only=False)
    return out


def list_array(values: np.ndarray, mask: np.ndarray, lens: np.ndarray) -> pa.ListArray:
    """(B, M) values back to one list per row, of the row's length: the inverse of `padded`."""
    offsets = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values[mask]))


def list_lengths(doc_lists: pa.Array | np.ndarray, click_lists: pa.Array | np.ndarray) -> np.ndarray:
    """Each SERP's list length; a clicks list of another length than its doc list is an error
    (ingest quarantines such SERPs, so this only guards against unvalidated input)."""
    lens, click_lens = list_value_lengths(doc_lists), list_value_lengths(click_lists)
    if not np.array_equal(lens, click_lens):
        raise ValueError("serps rows with clicks and doc_ids of different lengths; "
                         "run them through ingest (which quarantines them) first")
    return lens


def batch_arrays(batch: pa.RecordBatch, M: int, params: Sequence[str]):
    """(clicks int8 (B, M), mask, lengths, {p: (B, M) float64}) of an Arrow batch (`mapInArrow`) with
    attached params (lists of at most M ranks: `truncate_serps`)."""
    lens = list_lengths(batch.column("doc_ids"), batch.column("clicks"))
    mask = np.arange(M)[None, :] < lens[:, None]
    clicks = padded(batch.column("clicks"), mask, np.int8, 0)
    qd = {p: padded(batch.column(qd_array_col(p)), mask, np.float64, INIT_VALUE) for p in params}
    return clicks, mask, lens, qd
