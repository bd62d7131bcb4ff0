"""FittedModel <-> rows of the ``model_params`` table.

One row per parameter value (run_id, model, param, query_id, doc_id, rank,
prev_click_rank, value, n_obs):

- qd parameters: query_id and doc_id set, rank / prev_click_rank null, n_obs =
  impressions of the pair in training;
- per-rank parameters (global shape (M,)): rank 1..M;
- two-dimensional per-rank globals (UBM's gamma, shape (M, M + 1)): rank =
  first index + 1 and prev_click_rank = second index as the kernel stores it
  (for UBM: 1-based rank of the last click above, 0 = no click above);
- scalar globals: every key null; a fixed-length vector whose size does not
  depend on M (CCM's tau, shape (3,)) is stored as scalars named
  ``<name><i>``, i = 1.. (tau1, tau2, tau3);
- the prior (every key null), enough to reproduce the estimator
  (models/priors.py): ``prior_<family>`` = its mean m (for a qd family, the
  relevance of (query, doc) pairs unseen in training, and one row per rank (rank
  set) with the value such a pair takes there; for a global family only when it
  has a prior, one row per rank when m is pooled per rank),
  ``prior_strength_<family>`` = its strength k (0: plain ratio), and one row
  ``prior_kind:<none|pyclick|beta|mixed>`` of value 1.

Global and prior rows are built on the driver (a few hundred at most); qd rows
never leave Spark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from clickeval_spark import tables
from clickeval_spark.fitted.attach import wide_col
from clickeval_spark.models.base import ClickModel
from clickeval_spark.models.priors import is_per_rank

if TYPE_CHECKING:  # FittedModel's to_rows / from_rows call this module: the class is only a type here
    from clickeval_spark.fitted import FittedModel

# the table's own schema (clickeval_spark/tables/schemas.py), as a DDL string
MODEL_PARAMS_SCHEMA = tables.MODEL_PARAMS.simpleString()
_COLS = tables.MODEL_PARAMS.fieldNames()
PRIOR_PREFIX = "prior_"
STRENGTH_PREFIX = "prior_strength_"
KIND_PREFIX = "prior_kind:"


def _global_rows(run_id: str, model: ClickModel, name: str, arr: np.ndarray, M: int) -> list[tuple]:
    arr = np.asarray(arr, dtype=np.float64)
    m = model.name
    if arr.ndim == 0:
        return [(run_id, m, name, None, None, None, None, float(arr), None)]
    if arr.ndim == 1 and not is_per_rank(model, name, M):
        return [(run_id, m, f"{name}{i + 1}", None, None, None, None, float(v), None)
                for i, v in enumerate(arr)]
    if arr.ndim == 1:
        return [(run_id, m, name, None, None, i + 1, None, float(v), None) for i, v in enumerate(arr)]
    if arr.ndim == 2:
        return [(run_id, m, name, None, None, i + 1, j, float(arr[i, j]), None)
                for i in range(arr.shape[0]) for j in range(arr.shape[1])]
    raise ValueError(f"global parameter {name!r} has {arr.ndim} dimensions; model_params holds at most 2")


def to_param_rows(fitted: FittedModel, run_id: str) -> DataFrame:
    """All of ``fitted``'s parameters as model_params rows (schema MODEL_PARAMS_SCHEMA)."""
    spark = fitted.qd.sparkSession
    name = fitted.model.name
    small: list[tuple] = []
    for g_name, arr in sorted(fitted.glob.items()):
        small += _global_rows(run_id, fitted.model, g_name, arr, fitted.max_rank)
    for p, v in sorted(fitted.prior.items()):
        small.append((run_id, name, PRIOR_PREFIX + p, None, None, None, None, float(v), None))
        small += [(run_id, name, PRIOR_PREFIX + p, None, None, r + 1, None, m, None)
                  for r, m in enumerate(fitted.unseen_at_ranks(p))]
    spec = fitted.prior_spec
    if spec:
        small.append((run_id, name, KIND_PREFIX + spec["kind"], None, None, None, None, 1.0, None))
        for family, f in sorted(spec["families"].items()):
            small.append((run_id, name, STRENGTH_PREFIX + family, None, None, None, None, float(f["k"]), None))
            if family in fitted.prior:
                continue
            means = f["m"] if isinstance(f["m"], list) else [f["m"]]
            for r, m in enumerate(means):
                rank = r + 1 if isinstance(f["m"], list) else None
                small.append((run_id, name, PRIOR_PREFIX + family, None, None, rank, None, float(m), None))
    out = spark.createDataFrame(small, MODEL_PARAMS_SCHEMA)
    for p in fitted.model.qd_params:
        rows = fitted.qd.select(
            F.lit(run_id).alias("run_id"),
            F.lit(name).alias("model"),
            F.lit(p).alias("param"),
            F.col("query_id").cast("string").alias("query_id"),
            F.col("doc_id").cast("string").alias("doc_id"),
            F.lit(None).cast("int").alias("rank"),
            F.lit(None).cast("int").alias("prev_click_rank"),
            F.col(p).cast("double").alias("value"),
            F.col("n_obs").cast("double").alias("n_obs"),
        )
        out = out.unionByName(rows)
    return out.select(*_COLS)


def global_rows(df: DataFrame, run_id: str, names: Sequence[str]) -> dict[str, list[Row]]:
    """The global (not per (query, doc)) model_params rows of run ``run_id`` for the models ``names``, by
    model, in one job: a few rows per rank, never per-pair data. A model without any has an empty list."""
    rows = (df.filter((F.col("run_id") == F.lit(run_id)) & F.col("model").isin(*names)
                      & F.col("query_id").isNull() & F.col("doc_id").isNull())
            .select("model", "param", "rank", "prev_click_rank", "value").collect())
    by_model: dict[str, list[Row]] = {name: [] for name in names}
    for r in rows:
        by_model[r["model"]].append(r)
    return by_model


def fields_from_rows(df: DataFrame, model: ClickModel, run_id: str, max_rank: int,
                     glob_rows: Sequence[Row] | None = None) -> dict[str, Any]:
    """Inverse of `to_param_rows` for one run and model: the FittedModel constructor's fields
    (`FittedModel.from_rows` builds it; history is not stored: empty). ``glob_rows``: the model's
    `global_rows`, when they were read with other models' (else read here)."""
    rows = df.filter((F.col("run_id") == F.lit(run_id)) & (F.col("model") == F.lit(model.name)))
    params = list(model.qd_params)
    M = int(max_rank)

    if glob_rows is None:
        glob_rows = global_rows(df, run_id, [model.name])[model.name]
    shapes = model.global_shapes(M)
    glob = {k: np.full(s, np.nan) for k, s in shapes.items()}
    # fixed-length vectors stored as scalars <name><i>
    scalar_slots = {f"{k}{i + 1}": (k, i) for k, s in shapes.items()
                    if len(s) == 1 and not is_per_rank(model, k, M) for i in range(s[0])}
    prior: dict[str, float] = {}
    by_rank: dict[str, list] = {}
    spec: dict = {"kind": None, "families": {}}
    for r in glob_rows:
        param = r["param"]
        if param.startswith(KIND_PREFIX):
            spec["kind"] = param[len(KIND_PREFIX):]
        elif param.startswith(STRENGTH_PREFIX):
            spec["families"].setdefault(param[len(STRENGTH_PREFIX):], {})["k"] = float(r["value"])
        elif param.startswith(PRIOR_PREFIX) and param[len(PRIOR_PREFIX):] in shapes:
            fam = spec["families"].setdefault(param[len(PRIOR_PREFIX):], {})
            if r["rank"] is None:
                fam["m"] = float(r["value"])
            else:   # pooled per rank: a list, rank 1 first
                ranks = fam.setdefault("m", [])
                ranks.extend([None] * (r["rank"] - len(ranks)))
                ranks[r["rank"] - 1] = float(r["value"])
        elif param.startswith(PRIOR_PREFIX) and param[len(PRIOR_PREFIX):] in params and r["rank"] is not None:
            ranks = by_rank.setdefault(param[len(PRIOR_PREFIX):], [None] * M)
            if 1 <= r["rank"] <= M:
                ranks[r["rank"] - 1] = float(r["value"])
        elif param.startswith(PRIOR_PREFIX) and param[len(PRIOR_PREFIX):] in params:
            prior[param[len(PRIOR_PREFIX):]] = float(r["value"])
            spec["families"].setdefault(param[len(PRIOR_PREFIX):], {})["m"] = float(r["value"])
        elif param in scalar_slots:
            k, i = scalar_slots[param]
            glob[k][i] = r["value"]
        elif param in glob:
            arr = glob[param]
            if arr.ndim == 0:
                arr[()] = r["value"]
            elif arr.ndim == 1:
                arr[r["rank"] - 1] = r["value"]
            else:
                arr[r["rank"] - 1, r["prev_click_rank"]] = r["value"]
    missing = ([k for k, a in glob.items() if np.isnan(a).any()] + [p for p in params if p not in prior]
               + [f"{PRIOR_PREFIX}{p} by rank" for p, ranks in by_rank.items() if None in ranks])
    if missing:
        raise ValueError(f"model_params of run {run_id!r}, model {model.name!r} lack values for {missing} "
                         f"(max_rank={M})")

    if params:
        qd = (
            rows.filter(F.col("query_id").isNotNull() & F.col("param").isin(params))
            .groupBy("query_id", "doc_id")
            .agg(*[F.max(F.when(F.col("param") == p, F.col("value"))).alias(p) for p in params],
                 F.max("n_obs").alias("n_obs"))
            .select("query_id", "doc_id", *params, "n_obs")
        )
    else:
        qd = df.sparkSession.createDataFrame([], "query_id string, doc_id string, n_obs double")
    return dict(model=model, max_rank=M, qd=qd, glob=glob, prior=prior, prior_by_rank=by_rank, history=[],
                prior_spec=spec if spec["kind"] else {})


def wide_qd_rows(df: DataFrame, run_id: str, models: Mapping[str, ClickModel]) -> DataFrame:
    """The `attach.wide_qd` table of several models of run ``run_id`` straight from model_params rows:
    query_id, doc_id and one column per (model, qd parameter), in one aggregation (not one per model)."""
    wanted = [(name, p) for name, m in models.items() for p in m.qd_params]
    rows = df.filter((F.col("run_id") == F.lit(run_id)) & F.col("query_id").isNotNull()
                     & F.col("model").isin(*{name for name, _ in wanted}))
    return (
        rows.groupBy("query_id", "doc_id")
        .agg(*[F.max(F.when((F.col("model") == name) & (F.col("param") == p), F.col("value"))).alias(wide_col(name, p))
               for name, p in wanted])
    )


def fitted_qd_rows(df: DataFrame, run_id: str, fitted: Mapping[str, FittedModel]) -> DataFrame | None:
    """`wide_qd_rows` of those ``fitted`` models that have qd parameters; None when none has (GCTR, RCTR)."""
    ranked = {name: f.model for name, f in fitted.items() if f.model.qd_params}
    return wide_qd_rows(df, run_id, ranked) if ranked else None
