"""The config's sections, one per part of the pipeline (spark, ingest, fit, predict, evaluate, generate,
surrogate, report, tables, window), each with its defaults and its own checks; AppConfig (the package's
__init__) holds one of each and checks what spans sections."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from clickeval_spark.config.base import (CLICK_MODES, DATABASE_PATTERN, EM_MODEL_NAMES, LIST_ORDERS, MODEL_NAMES,
                                         SIMULATABLE_MODELS, SOURCE_FORMATS, SPLITS, AtLeast1, Name, PriorKind,
                                         Section, Strength)
from clickeval_spark.config.fields import Day, Invalid, Location, Text, Tuple, distinct, matching, strength
from clickeval_spark.config.locations import check_day_placeholders, fill_day, names_day
from clickeval_spark.models import ENGINES as FIT_ENGINES, MODELS  # the kernel registry (numpy only: no Spark at config time)
from clickeval_spark.models.priors import (DEFAULT_HALVING, DEFAULT_K_GRID, DEFAULT_REUSE_MARGIN, DEFAULT_SELECT_SERPS,
                                           DEFAULT_WARMUP, SEEN_MEANS)


class SparkConfig(Section):
    # embedded: one machine, Delta jars fetched by Ivy; cluster: spark-submit supplies master and jars
    mode: Literal["embedded", "cluster"] = "embedded"
    master: Text | None = "local[*]"
    # warehouse root for every Delta table: a folder (relative to the working directory) or a URI (s3a://...)
    warehouse: Location[None] = "warehouse"
    # reliable storage for EM's checkpoints (a folder or URI, like warehouse): with it a lost executor
    # costs a recomputation, not the fit; null: local checkpoints, lost with their executor (one machine)
    checkpoint_dir: Location[None] | None = None
    conf: dict[Text, Text] = {}


class SplitConfig(Section):
    seed: int = 20210414
    # AICM's TianGong-ST proportions; only used for inputs that do not arrive split
    ratios: dict[Text, Annotated[float, Field(ge=0)]] = {"train": 117431.0, "valid": 13154.0, "test": 16570.0}

    @model_validator(mode="after")
    def _check(self) -> SplitConfig:
        if not self.ratios or set(self.ratios) - set(SPLITS):
            raise Invalid(f"keys must be among {list(SPLITS)}, got {sorted(self.ratios)}", "ratios")
        if sum(self.ratios.values()) <= 0:
            raise Invalid(f"values must have a positive sum, got {self.ratios}", "ratios")
        return self


class SyntheticConfig(Section):
    model: Literal[SIMULATABLE_MODELS] = "pbm"
    n_serps: AtLeast1 = 20000
    n_queries: AtLeast1 = 400
    docs_per_query: int = 15
    list_size: AtLeast1 = 10
    zipf_s: Annotated[float, Field(gt=0)] = 1.1
    # how far a document may move from its base position from one SERP to the next
    shuffle_width: float = 6.0
    sessions_mean_serps: AtLeast1 = 3
    seed: int = 7
    # pooled: every (query, doc) of the pools graded; serp: TianGong-ST-like, the last SERP of a
    # `label_fraction` of the sessions graded document by document (its human-label-like subset)
    labels: Literal["pooled", "serp"] = "pooled"
    label_fraction: Annotated[float, Field(gt=0, le=1)] = 0.3
    # short: d<query>_<j> (a few bytes, as TianGong-ST's integer ids); sha256: that id's 64-character hex
    # digest, a log the size of one that carries URLs
    doc_id_form: Literal["short", "sha256"] = "short"

    @model_validator(mode="after")
    def _check(self) -> SyntheticConfig:
        if self.docs_per_query < self.list_size:
            raise Invalid(f"must be >= list_size ({self.list_size}), got {self.docs_per_query}", "docs_per_query")
        return self


class IngestConfig(Section):
    dataset: Name = "synthetic"
    format: Literal[SOURCE_FORMATS] = "synthetic"
    # per_query_text: {train: path, valid: path, test: path} (already split) or {all: path}
    # tiangong_xml / yandex / parquet / delta: {all: path}. Paths and labels may name the day with
    # {log_date} (config/locations.py): a daily ingest then reads ingest.log_date's folder or file only
    paths: dict[Text, Location["ingest"]] = {}
    labels: Location["ingest"] | None = None
    # per_query_text: auto (per line), graphcm (5 columns), aicm (7 columns: two zero columns after qid)
    text_variant: Literal["auto", "graphcm", "aicm"] = "auto"
    # TianGong-ST labels may use bare numbers where the XML uses prefixed ids (q123, d456)
    label_query_prefix: Text = ""
    label_doc_prefix: Text = ""
    max_rank: AtLeast1 = 10
    # an ingest whose quarantined share of the records of serps (or of labels) exceeds this fails
    # before any write: a mostly broken input never replaces a dataset's good rows
    max_quarantine_share: Annotated[float, Field(ge=0, le=1)] = 0.5
    split: SplitConfig = SplitConfig()
    synthetic: SyntheticConfig = SyntheticConfig()
    # the day of records whose source gives none (Yandex, per-query text, synthetic; TianGong-ST without
    # starttime; canonical rows without log_date); null: undated, for one-shot datasets
    log_date: Day | None = None

    @property
    def reads_inputs(self) -> bool:
        """The synthetic format generates its log: its paths and labels are not read."""
        return self.format != "synthetic"

    @property
    def input_paths(self) -> dict[str, str]:
        """`paths` as the ingest reads them: {log_date} filled with ingest.log_date."""
        return {key: fill_day(path, self.log_date, f"ingest.paths.{key}") for key, path in self.paths.items()}

    @property
    def input_labels(self) -> str | None:
        return None if self.labels is None else fill_day(self.labels, self.log_date, "ingest.labels")

    @property
    def daily(self) -> bool:
        """The SERP input names its day: it holds ingest.log_date's records only."""
        return self.reads_inputs and any(names_day(path) for path in self.paths.values())

    @model_validator(mode="after")
    def _check(self) -> IngestConfig:
        allowed_keys = set(SPLITS) | {"all"}
        bad = set(self.paths) - allowed_keys
        if bad:
            raise Invalid(f"unknown key(s) {sorted(bad)}; allowed: {sorted(allowed_keys)}", "paths")
        if "all" in self.paths and len(self.paths) > 1:
            raise Invalid(f"give either 'all' or per-split paths, not both; got {sorted(self.paths)}", "paths")
        if self.format != "synthetic" and not self.paths:
            raise Invalid(f"required for format {self.format!r}", "paths")
        inputs = [*((f"paths.{key}", path) for key, path in self.paths.items()), ("labels", self.labels)]
        for key, location in inputs if self.reads_inputs else ():
            try:
                check_day_placeholders(location or "")
            except Invalid as exc:
                raise Invalid(str(exc), key) from None
        return self


class ReuseConfig(Section):
    """fit.prior.reuse: a daily run fits the candidate that `k: auto` chose in this dataset's latest fit of the
    model that ran the whole selection (the `runs` table, at most ``days`` days old) instead of the whole
    selection, if that fit's valid LL per position and today's differ by at most ``margin``; otherwise, or with
    no such fit, the whole selection runs (`em.selection.reused_candidate`). Off (``days`` null) by default."""
    # how old the fit whose choice is reused may be, in days of data (a run with a window: its window's end) or
    # else by the clock (the runs table's finished_at); null: never reuse
    days: AtLeast1 | None = None
    # the valid LL per position today may differ from the reused fit's by at most this; more: select again
    margin: Annotated[float, Field(gt=0)] = DEFAULT_REUSE_MARGIN


class PriorConfig(Section):
    """The Beta prior of every parameter family (models/priors.py): value = (num + k m) / (den + k).

    none: plain MLE; pyclick: PyClick's +1 / +2 everywhere; beta: qd families shrink toward
    their pooled mean m with strength k, `auto` = the grid value with the best valid-split LL.
    """
    kind: PriorKind = "beta"
    k: Strength = "auto"
    grid: Tuple(Annotated[float, strength(allow_auto=False)], min_length=1) = DEFAULT_K_GRID
    warmup: AtLeast1 = DEFAULT_WARMUP   # at most this many passes pooled means follow the fit (while valid LL improves); then fixed
    rank_means: bool = True   # pairs unseen in training take their family's pooled mean at the rank shown
    # what seen pairs shrink toward: the family's mean, or their ranks' (models/priors.py); both: valid chooses
    seen_means: Annotated[Tuple(Literal[SEEN_MEANS], min_length=1), AfterValidator(distinct)] = ("pooled", "rank")
    # on a larger log (train + valid SERPs) `auto`'s candidates compete on a sample of whole queries of about
    # this many SERPs, and the chosen one then fits the whole log; null: they all fit the whole log
    select_serps: AtLeast1 | None = DEFAULT_SELECT_SERPS
    # successive halving of `auto`'s candidates, {iteration: margin}: after scoring that iteration on valid, a
    # candidate trailing the leader's valid LL per position by more than the margin stops and is not chosen;
    # {}: every candidate runs until it stops
    halving: dict[AtLeast1, Annotated[float, Field(gt=0)]] = DEFAULT_HALVING
    # daily runs: the choice of this dataset's latest fit, while its valid LL holds (ReuseConfig)
    reuse: ReuseConfig = ReuseConfig()


class PriorOverride(Section):
    """fit.model_priors.<model> or <model>.<family>: what differs from fit.prior there."""
    kind: PriorKind | None = None
    k: Strength | None = None


class ConvergeConfig(Section):
    """fit.converge: once the candidates have stopped (fit.tol) and valid has chosen one, the chosen fit, if tol
    stopped it before fit.iterations did, goes on until the training LL it may still gain, estimated from its
    last passes (`em.candidates.remaining_gain`), is below ``gain`` nats per training position, or it has made
    ``iterations`` passes: on a dense log, where at least ``min_seen_share`` of the valid positions are of
    (query, doc) pairs seen in training. Only with a fit.tol (a fit with tol null makes exactly
    fit.iterations passes); gain null: the fit stops with the candidates. On a sparse log tol's stop stands:
    on the TREC sample (20% of valid positions seen) the fixed point lowered PBM's test LL by 2.3e-4 and
    UBM's by 1.6e-4 (docs/models-and-priors.md, How a fit stops)."""
    # nats per training position the chosen fit may still gain when it stops; null: it stops with the candidates
    gain: Annotated[float, Field(gt=0)] | None = 3e-6
    # the cap on the chosen fit's passes, counted from its first
    iterations: AtLeast1 = 300
    # the share of valid positions whose (query, doc) pair the training SERPs show, from which a log is dense
    # (0: every log; a fit with no valid SERPs counts as dense)
    min_seen_share: Annotated[float, Field(ge=0, le=1)] = 0.9
    # go on by SQUAREM's extrapolations of the EM steps (`em.acceleration`): the same fixed point in fewer
    # passes; false: by plain EM steps
    accelerate: bool = True


class FitConfig(Section):
    models: Tuple(Literal[MODEL_NAMES], min_length=1) = (
        "gctr", "rctr", "dctr", "pbm", "cm", "ubm", "dcm", "ccm", "dbn", "sdbn", "lcm")
    # the cap on the passes of `k: auto`'s candidates (a fit that reaches it stops there); a candidate stops
    # earlier once its log posterior per training SERP moves by less than tol (then the chosen one goes on by
    # `converge`)
    iterations: AtLeast1 = 50
    tol: Annotated[float, Field(gt=0)] | None = 1e-4
    # the chosen candidate's own stop, after tol's, on a dense log
    converge: ConvergeConfig = ConvergeConfig()
    max_rank: int = 10
    prior: PriorConfig = PriorConfig()
    # per model ("dbn") or per parameter family ("dbn.sigma"): {kind, k}
    model_priors: dict[Text, PriorOverride] = {}
    # with spark.checkpoint_dir: EM's state is checkpointed every this many passes (ALS's checkpointInterval)
    checkpoint_interval: AtLeast1 = 10
    # how EM passes run (models.ENGINES, `em.EMOptions.engine`): "stages", one Spark job per pass; "resident",
    # every pass in one barrier stage whose tasks keep the blocks; "auto", resident where the cluster allows it
    # (no dynamic allocation). The fitted parameters are the same bit for bit.
    engine: Literal[FIT_ENGINES] = "auto"

    @model_validator(mode="after")
    def _check(self) -> FitConfig:
        for key in self.model_priors:
            name, _, family = key.partition(".")
            # priors are EM's: the learned model (lcm) has none
            if name not in EM_MODEL_NAMES:
                raise Invalid(f"unknown model {name!r}; allowed: {list(EM_MODEL_NAMES)}", f"model_priors.{key}")
            model = MODELS[name]
            families = [*model.qd_params, *sorted(model.global_shapes(self.max_rank))]
            if family and family not in families:
                raise Invalid(f"{name} has no parameter family {family!r}; it has {families}", f"model_priors.{key}")
        return self

    def prior_overrides(self, model: str) -> tuple[str, Any, dict[str, tuple[str, Any]]]:
        """(kind, k, {family: (kind, k)}) for `priors.model_prior`: fit.prior, then the model's, then its families'."""
        base = self.model_priors.get(model, PriorOverride())
        kind, k = base.kind or self.prior.kind, self.prior.k if base.k is None else base.k
        families = {}
        for key, o in self.model_priors.items():
            name, _, family = key.partition(".")
            if name == model and family:
                families[family] = (o.kind or kind, k if o.k is None else o.k)
        return kind, k, families


Splits = Tuple(Literal[SPLITS], min_length=1)


class PredictConfig(Section):
    splits: Splits = ("test",)


class ExternalModelConfig(Section):
    """Predictions of a model trained elsewhere (NCM, CACM, AICM, ...), in the click_predictions contract."""
    name: Name
    predictions: Location["evaluate"]
    # relevance_scores contract (query_id, doc_id, score); without it the model gets no NDCG
    relevance_scores: Location["evaluate"] | None = None
    format: Literal["auto", "delta", "parquet"] = "auto"


class EvaluateConfig(Section):
    splits: Splits = ("test",)
    # probabilities are clipped to [eps, 1 - eps]; the number clipped is reported
    eps: Annotated[float, Field(gt=0, lt=0.5)] = 1e-6
    replicates: AtLeast1 = 200
    seed: int = 20210414
    confidence: Annotated[float, Field(gt=0, lt=1)] = 0.95
    ndcg_cutoffs: Tuple(AtLeast1, min_length=1) = (1, 3, 5, 10)
    ndcg_gain: Literal["exponential", "linear"] = "exponential"
    # serp: ideal order of the SERP's own grades; query: of every judged document of the query
    ndcg_ideal: Literal["serp", "query"] = "serp"
    # paired differences (<metric>_diff) of every model against this one; null: none
    reference_model: Name | None = "rctr"
    external: Tuple(ExternalModelConfig) = ()

    @model_validator(mode="after")
    def _check(self) -> EvaluateConfig:
        names = [e.name for e in self.external]
        if len(set(names)) != len(names):
            raise Invalid(f"model names must be unique, got {names}", "external")
        return self


class ExternalSequencesConfig(Section):
    """Click sequences sampled by a model trained elsewhere, in the synthetic_serps layout."""
    name: Name
    path: Location["generate"]
    format: Literal["auto", "delta", "parquet"] = "auto"


class GenerateConfig(Section):
    # generator models among fit.models; empty: every fitted model
    generators: Tuple(Text) = ()
    samples: AtLeast1 = 7
    click_modes: Tuple(Literal[CLICK_MODES], min_length=1) = ("stochastic",)
    list_orders: Tuple(Literal[LIST_ORDERS], min_length=1) = LIST_ORDERS
    split: Literal[SPLITS] = "test"
    seed: int = 20210415
    external: Tuple(ExternalSequencesConfig) = ()


class SurrogateConfig(Section):
    # fitted by EM on every generator's sequences: one of the EM models
    model: Literal[EM_MODEL_NAMES] = "dcm"
    # the same for every generator of a run
    iterations: AtLeast1 = 10
    eps: float = 1e-6


class ReportConfig(Section):
    # folder (relative to the working directory) or URI; the page is <path>/<run_id>.html
    path: Location[None] = "reports"
    # also write <path>/<dataset>-trend.html: each model's metrics across the dataset's runs (`report --trend`)
    trend: bool = False


class CatalogConfig(Section):
    """Register every table the pipeline writes as an external Delta table of `database` in the session's
    catalog (Hive metastore, Glue, Unity: whatever the spark conf configures), so any SQL client finds it."""
    database: Annotated[Text, matching(DATABASE_PATTERN, "a SQL identifier ([A-Za-z_][A-Za-z0-9_]*), or catalog.schema")]


class TablesConfig(Section):
    # null: the tables are Delta paths under spark.warehouse only
    catalog: CatalogConfig | None = None


class WindowConfig(Section):
    """The log_date range, both ends inclusive, that fit, predict, evaluate, generate and surrogate read."""
    start: Day
    end: Day

    @model_validator(mode="after")
    def _check(self) -> WindowConfig:
        if self.start > self.end:
            raise Invalid(f"start {self.start} is after end {self.end}")
        return self
