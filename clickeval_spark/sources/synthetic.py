"""Synthetic click logs simulated from a click model with known, seeded parameters.

The embedded default input of the main job (no download) and the scale
benchmark's source. The shape follows TianGong-ST: 10 results per SERP,
Zipf-like query frequencies, sessions of several queries, and a per-query
document pool whose order varies a little from one SERP to the next (which also
makes examination and attractiveness identifiable). Everything is computed by
Spark from seeded hashes, so the log is the same on any number of partitions,
and no loop over SERPs ever runs on the driver.

The true parameters come with the log, as `model_params` rows of run id
`truth-<dataset>` (the ingest stage writes them), so a fit can be compared with
the truth in SQL, and the predict stage scores the true model beside the fitted
ones as model `truth` (`load_truth`, `truth_param_rows`). Pooled
relevance labels (grade = floor(5 * relevance score), 0..4) come with it, so
NDCG can be computed on the default data too.
"""

from __future__ import annotations

import numpy as np
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from clickeval_spark.config import AppConfig, IngestConfig, SyntheticConfig
from clickeval_spark.errors import ClickevalError
from clickeval_spark.hashing import seeded_uniform
from clickeval_spark.models import get_model
from clickeval_spark.fitted import FittedModel
from clickeval_spark.sources.parsed import to_parsed, to_parsed_labels


def _uniform(seed: int, salt: str, *cols: Column | str) -> Column:
    """U[0, 1) as a pure function of (seed, salt, column values); the salt separates the draws."""
    return seeded_uniform(seed, F.lit(salt), *cols)


def true_globals(model_name: str, M: int) -> dict[str, np.ndarray]:
    """Per-rank / global parameters of the simulated user: examination decays with rank as in web logs."""
    ranks = np.arange(1, M + 1, dtype=float)
    exam = 0.98 * ranks ** -0.7
    if model_name == "pbm":
        return {"gamma": exam}
    if model_name == "ubm":
        gamma = np.full((M, M + 1), 0.5)
        gamma[:, 0] = exam
        for r in range(M):  # after a click at rank k, examination decays with the distance r+1-k
            for k in range(1, r + 1):
                gamma[r, k] = 0.95 * (r + 1 - k) ** -0.5
        return {"gamma": gamma}
    if model_name == "dbn":
        return {"gamma": np.array(0.9)}
    if model_name == "dcm":
        return {"lambda": np.clip(0.65 - 0.03 * np.arange(M), 0.05, 1.0)}
    if model_name == "ccm":
        return {"tau": np.array([0.85, 0.6, 0.35])}
    return {}  # cm, sdbn: no global parameters


def _query_index(cfg: SyntheticConfig, u: Column) -> Column:
    """Inverse CDF of a continuous power law on [1, N+1): a Zipf-like query index in 0..N-1."""
    n1 = float(cfg.n_queries + 1)
    if abs(cfg.zipf_s - 1.0) < 1e-9:
        x = F.pow(F.lit(n1), u)
    else:
        a = 1.0 - cfg.zipf_s
        x = F.pow((F.lit(n1 ** a) - 1.0) * u + 1.0, F.lit(1.0 / a))
    return F.least(F.floor(x).cast("long") - 1, F.lit(cfg.n_queries - 1))


def _doc_id(cfg: SyntheticConfig, q: Column | str, j: Column | str) -> Column:
    """d<query>_<pool index>, or its SHA-256 hex digest: 64 characters, the size of the URL or URL hash a
    production log carries, whose ids neither dictionary-encode nor compress the way short ones do."""
    short = F.format_string("d%d_%d", q, j)
    return F.sha2(short, 256) if cfg.doc_id_form == "sha256" else short


def true_qd(spark: SparkSession, cfg: SyntheticConfig) -> DataFrame:
    """query_id, doc_id, alpha, sigma, n_obs: better-placed docs of a pool tend to be more attractive."""
    D = cfg.docs_per_query
    pairs = spark.range(cfg.n_queries).select(
        F.col("id").alias("q"), F.explode(F.sequence(F.lit(0), F.lit(D - 1))).alias("j"),
    )
    return pairs.select(
        F.concat(F.lit("q"), F.col("q").cast("string")).alias("query_id"),
        _doc_id(cfg, "q", "j").alias("doc_id"),
        (F.lit(0.05) + 0.85 * F.pow(_uniform(cfg.seed, "alpha", "q", "j"), 1.0 + 2.0 * F.col("j") / D))
        .alias("alpha"),
        (F.lit(0.2) + 0.6 * _uniform(cfg.seed, "sigma", "q", "j")).alias("sigma"),
        F.lit(None).cast("double").alias("n_obs"),
    )


def serp_skeletons(spark: SparkSession, cfg: SyntheticConfig, dataset: str) -> DataFrame:
    """SERPs without clicks: query drawn Zipf-like, the pool re-ordered by base position + jitter."""
    D, L = cfg.docs_per_query, cfg.list_size
    serps = spark.range(cfg.n_serps).select(
        F.col("id").alias("i"),
        _query_index(cfg, _uniform(cfg.seed, "query", "id")).alias("q"),
    )
    ordered = F.array_sort(
        F.transform(
            F.sequence(F.lit(0), F.lit(D - 1)),
            lambda j: F.struct((j + cfg.shuffle_width * _uniform(cfg.seed, "order", F.col("i"), j)).alias("key"),
                               j.alias("j")),
        )
    )
    return serps.select(
        F.lit(dataset).alias("dataset"),
        F.lit(None).cast("string").alias("split"),
        F.concat(F.lit("s"), (F.col("i") / cfg.sessions_mean_serps).cast("long").cast("string")).alias("session_id"),
        F.concat(F.lit("serp"), F.col("i").cast("string")).alias("serp_id"),
        (F.col("i") % cfg.sessions_mean_serps + 1).cast("int").alias("serp_pos"),
        F.concat(F.lit("q"), F.col("q").cast("string")).alias("query_id"),
        F.transform(F.slice(ordered, 1, L), lambda x: _doc_id(cfg, F.col("q"), x["j"])).alias("doc_ids"),
        F.array_repeat(F.lit("1"), L).alias("vtypes"),
        F.array_repeat(F.lit(0), L).alias("clicks"),
        F.lit(None).cast("date").alias("log_date"),
    )


def truth_run_id(dataset: str) -> str:
    """The run id under which a simulated dataset's true parameters are stored in model_params."""
    return f"truth-{dataset}"


#: the `model` name of the true model in click_predictions, relevance_scores and metrics
TRUTH_MODEL = "truth"


def has_truth(cfg: AppConfig) -> bool:
    """True when the run's dataset is simulated (`ingest.format: synthetic`): its true model is scored
    beside the fitted ones as model `TRUTH_MODEL`. A real dataset has no truth row. An external model
    of that name would share its rows: a user error on a simulated dataset."""
    if cfg.ingest.format != "synthetic":
        return False
    clash = [e.name for e in cfg.evaluate.external if e.name == TRUTH_MODEL]
    if clash:
        raise ClickevalError(f"evaluate.external: {TRUTH_MODEL!r} is the true model of the simulated dataset "
                             f"{cfg.ingest.dataset}; rename the external model")
    return True


def _truth_rows(params: DataFrame, dataset: str, max_rank: int) -> DataFrame:
    """The dataset's true parameters (model_params rows of `truth_run_id`) for lists cut to ``max_rank``
    ranks: a rank-indexed value beyond it (a longer simulated list) is left out, as the fits never see
    those ranks either."""
    rank_ok = F.col("rank").isNull() | (F.col("rank") <= max_rank)
    prev_ok = F.col("prev_click_rank").isNull() | (F.col("prev_click_rank") <= max_rank)
    return params.where((F.col("run_id") == truth_run_id(dataset)) & rank_ok & prev_ok)


def load_truth(params: DataFrame, cfg: AppConfig) -> tuple[FittedModel | None, str]:
    """The simulated log's true model as a FittedModel of ``fit.max_rank`` ranks (the fitted models'), and a
    line saying what it is or why there is none: not a simulated dataset, simulated lists shorter than
    fit.max_rank (the truth has no parameters for the ranks beyond), or no true parameters stored (the
    dataset was not ingested with this config's synthetic model)."""
    if not has_truth(cfg):
        return None, "not a simulated dataset"
    scfg, M = cfg.ingest.synthetic, cfg.fit.max_rank
    if scfg.list_size < M:
        return None, (f"no truth row: the simulated lists have {scfg.list_size} ranks, fewer than "
                      f"fit.max_rank={M}")
    try:
        fitted = FittedModel.from_rows(_truth_rows(params, cfg.ingest.dataset, M), get_model(scfg.model),
                                       truth_run_id(cfg.ingest.dataset), M)
    except ValueError:
        return None, (f"no truth row: model_params holds no true {scfg.model} parameters for run "
                      f"{truth_run_id(cfg.ingest.dataset)}; run `clickeval ingest` with this config")
    return fitted, f"the simulated log's {scfg.model} with its true parameters"


def truth_param_rows(params: DataFrame, cfg: AppConfig, run_id: str) -> DataFrame:
    """The true parameters relabelled as model `TRUTH_MODEL` of run ``run_id``, in model_params' columns: with
    the run's own rows they make one table from which `params_io.fitted_qd_rows` builds the wide (query,
    doc) table of the fitted models and the truth together (one attach for all). Never written."""
    rows = _truth_rows(params, cfg.ingest.dataset, cfg.fit.max_rank).where(
        F.col("model") == cfg.ingest.synthetic.model)
    return rows.select(*[F.lit(run_id).alias(c) if c == "run_id" else
                         F.lit(TRUTH_MODEL).alias(c) if c == "model" else F.col(c) for c in params.columns])


def generate(spark: SparkSession, icfg: IngestConfig) -> tuple[DataFrame, DataFrame, DataFrame]:
    """Parsed SERP records, label records and the truth (model_params rows of run
    `truth_run_id(dataset)`) of a simulated log. Nothing is written here: the ingest stage writes."""
    cfg = icfg.synthetic
    model = get_model(cfg.model)
    qd = true_qd(spark, cfg).select("query_id", "doc_id", *model.qd_params, "n_obs")
    truth = FittedModel(model=model, max_rank=cfg.list_size, qd=qd,
                        glob=true_globals(cfg.model, cfg.list_size), prior={p: 0.5 for p in model.qd_params})
    truth_rows = truth.to_rows(truth_run_id(icfg.dataset))

    sampled = truth.sample(serp_skeletons(spark, cfg, icfg.dataset), k=1, seed=cfg.seed)
    serps = to_parsed(sampled.select(
        F.lit(f"synthetic:{cfg.model}").alias("source"),
        (F.regexp_extract("serp_id", r"(\d+)$", 1).cast("long") + 1).alias("line"),
        F.to_json(F.struct("session_id", "serp_id", "query_id", "doc_ids", "clicks")).alias("raw"),
        "dataset", "split", "session_id", "serp_pos", "serp_id", "query_id", "doc_ids", "vtypes", "clicks",
        "log_date",
    ))
    score = F.col("alpha") * F.col("sigma") if "sigma" in model.qd_params else F.col("alpha")
    grades = qd.select("query_id", "doc_id", F.least(F.floor(score * 5), F.lit(4)).cast("string").alias("grade"))
    if cfg.labels == "serp":
        return serps, _serp_labels(spark, cfg, icfg.dataset, grades), truth_rows
    labels = to_parsed_labels(grades.select(
        F.lit(f"synthetic:{cfg.model}:labels").alias("source"),
        F.concat_ws("|", "query_id", "doc_id").alias("record"),
        F.concat_ws("|", "query_id", "doc_id").alias("raw"),
        F.lit(icfg.dataset).alias("dataset"),
        "query_id",
        F.concat_ws("|", "query_id", "doc_id").alias("label_key"),
        F.array("doc_id").alias("doc_ids"),
        F.array("grade").alias("relevances"),
    ))
    return serps, labels, truth_rows


def _serp_labels(spark: SparkSession, cfg: SyntheticConfig, dataset: str, grades: DataFrame) -> DataFrame:
    """TianGong-ST-like label records: the last SERP of a seeded `label_fraction` of the sessions,
    one grade per shown document (from the true relevance), tied to that SERP."""
    last = (serp_skeletons(spark, cfg, dataset)
            .where((F.col("serp_pos") == cfg.sessions_mean_serps)
                   & (_uniform(cfg.seed, "label", F.col("session_id")) < cfg.label_fraction)))
    # the grades come from a spark.range of queries, which Spark sizes at 8 bytes a query: unhinted, it
    # broadcasts them, every (query, doc) pair through the driver, more than a small driver holds on a large log
    per_doc = (last.select("session_id", "serp_id", "query_id", F.posexplode("doc_ids").alias("pos", "doc_id"))
               .join(grades.hint("merge"), on=["query_id", "doc_id"], how="left"))
    lists = per_doc.groupBy("session_id", "serp_id", "query_id").agg(
        F.sort_array(F.collect_list(F.struct("pos", "doc_id", "grade"))).alias("l"))
    return to_parsed_labels(lists.select(
        F.lit(f"synthetic:{cfg.model}:labels").alias("source"),
        F.col("serp_id").alias("record"),
        F.col("serp_id").alias("raw"),
        F.lit(dataset).alias("dataset"),
        "session_id", "query_id", "serp_id",
        F.col("serp_id").alias("label_key"),
        F.transform("l", lambda x: x["doc_id"]).alias("doc_ids"),
        F.transform("l", lambda x: x["grade"]).alias("relevances"),
    ))
