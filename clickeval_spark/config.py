"""Job configuration: one YAML per environment (conf/<env>.yaml) loaded into frozen dataclasses.

Validation happens once, at start-up: an unknown key or a bad value raises
ConfigError naming the key path and what is allowed, before any Spark work.

Locations (spark.warehouse, ingest.paths, ingest.labels, evaluate.external[].predictions and
.relevance_scores, generate.external[].path, report.path) are folders, files or URIs. A relative
one is relative to the current working directory of the process that reads the config (the
driver), never to where the package is installed: `resolve_locations` makes them absolute once,
at start-up. URIs (s3a://, abfss://, file:/) and absolute paths are kept as they are.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml

from clickeval_spark.errors import ConfigError
from clickeval_spark.models import ENGINES as FIT_ENGINES, MODELS  # the kernel registry (numpy only: no Spark at config time)
from clickeval_spark.models.priors import DEFAULT_K_GRID, DEFAULT_WARMUP, SEEN_MEANS

# the checkout, for scripts that live in it (benchmarks/); config locations never resolve against it
PROJECT_ROOT = Path(__file__).resolve().parent.parent
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
# dataset, model and environment names: they go into Delta predicates (replaceWhere), partition folders
# and default run ids, so they are a subset of what a run id allows
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SPLITS = ("train", "valid", "test")
MODEL_NAMES = tuple(MODELS)
SOURCE_FORMATS = ("synthetic", "tiangong_xml", "per_query_text", "yandex", "parquet", "delta")
ISO_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


def resolve_location(location: str) -> str:
    """A relative path is relative to the current working directory (not to the package, which may
    sit inside a zip or a packed venv); URIs (s3a://, abfss://, file:/) and absolute paths pass."""
    if is_uri(location) or os.path.isabs(location):
        return location
    return os.path.abspath(location)


def is_uri(location: str) -> bool:
    return "://" in location or location.startswith("file:")


def validate_run_id(run_id: str) -> str:
    """run_id goes into Delta predicates: only a safe character set is allowed."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id):
        raise ConfigError(
            f"run_id {run_id!r} is not allowed: use 1-128 of [A-Za-z0-9_.:-], starting with a letter or digit"
        )
    return run_id


def validate_name(key: str, value: Any) -> str:
    """A user-given name (dataset, model, env) is checked against NAME_PATTERN at start-up, before any write."""
    if not isinstance(value, str) or not NAME_PATTERN.match(value):
        raise ConfigError(
            f"{key}: {value!r} is not allowed: must match {NAME_PATTERN.pattern} "
            "(1-64 of [A-Za-z0-9_.-], starting with a letter or digit)"
        )
    return value


@dataclass(frozen=True)
class SparkConfig:
    # embedded: one machine, Delta jars fetched by Ivy; cluster: spark-submit supplies master and jars
    mode: Literal["embedded", "cluster"] = "embedded"
    master: str | None = "local[*]"
    # warehouse root for every Delta table: a folder (relative to the working directory) or a URI (s3a://...)
    warehouse: str = "warehouse"
    # reliable storage for EM's checkpoints (a folder or URI, like warehouse): with it a lost executor
    # costs a recomputation, not the fit; null: local checkpoints, lost with their executor (one machine)
    checkpoint_dir: str | None = None
    conf: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SplitConfig:
    seed: int = 20210414
    # AICM's TianGong-ST proportions; only used for inputs that do not arrive split
    ratios: dict[str, float] = field(
        default_factory=lambda: {"train": 117431.0, "valid": 13154.0, "test": 16570.0}
    )

    def __post_init__(self) -> None:
        unknown = set(self.ratios) - set(SPLITS)
        if unknown or not self.ratios:
            raise ConfigError(f"ingest.split.ratios: keys must be among {list(SPLITS)}, got {sorted(self.ratios)}")
        if any((not isinstance(v, (int, float))) or v < 0 for v in self.ratios.values()) or sum(self.ratios.values()) <= 0:
            raise ConfigError("ingest.split.ratios: values must be non-negative numbers with a positive sum")


@dataclass(frozen=True)
class SyntheticConfig:
    model: str = "pbm"
    n_serps: int = 20000
    n_queries: int = 400
    docs_per_query: int = 15
    list_size: int = 10
    zipf_s: float = 1.1
    # how far a document may move from its base position from one SERP to the next
    shuffle_width: float = 6.0
    sessions_mean_serps: int = 3
    seed: int = 7
    # pooled: every (query, doc) of the pools graded; serp: TianGong-ST-like, the last SERP of a
    # `label_fraction` of the sessions graded document by document (its human-label-like subset)
    labels: Literal["pooled", "serp"] = "pooled"
    label_fraction: float = 0.3

    def __post_init__(self) -> None:
        if self.model not in SIMULATABLE_MODELS:
            raise ConfigError(f"ingest.synthetic.model: {self.model!r} is not allowed; allowed: {list(SIMULATABLE_MODELS)}")
        for name in ("n_serps", "n_queries", "list_size", "sessions_mean_serps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ingest.synthetic.{name}: must be >= 1, got {getattr(self, name)}")
        if self.docs_per_query < self.list_size:
            raise ConfigError("ingest.synthetic.docs_per_query: must be >= list_size")
        if self.zipf_s <= 0:
            raise ConfigError("ingest.synthetic.zipf_s: must be > 0")
        if not 0 < self.label_fraction <= 1:
            raise ConfigError("ingest.synthetic.label_fraction: must be in (0, 1]")


SIMULATABLE_MODELS = ("pbm", "ubm", "dbn", "sdbn", "dcm", "ccm", "cm")


@dataclass(frozen=True)
class IngestConfig:
    dataset: str = "synthetic"
    format: str = "synthetic"
    # per_query_text: {train: path, valid: path, test: path} (already split) or {all: path}
    # tiangong_xml / yandex / parquet / delta: {all: path}
    paths: dict[str, str] = field(default_factory=dict)
    labels: str | None = None
    # per_query_text: auto (per line), graphcm (5 columns), aicm (7 columns: two zero columns after qid)
    text_variant: Literal["auto", "graphcm", "aicm"] = "auto"
    # TianGong-ST labels may use bare numbers where the XML uses prefixed ids (q123, d456)
    label_query_prefix: str = ""
    label_doc_prefix: str = ""
    max_rank: int = 10
    # an ingest whose quarantined share of the records of serps (or of labels) exceeds this fails
    # before any write: a mostly broken input never replaces a dataset's good rows
    max_quarantine_share: float = 0.5
    split: SplitConfig = field(default_factory=SplitConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    # the day of records whose source gives none (Yandex, per-query text, synthetic; TianGong-ST without
    # starttime; canonical rows without log_date); null: undated, for one-shot datasets
    log_date: date | None = None

    def __post_init__(self) -> None:
        if self.format not in SOURCE_FORMATS:
            raise ConfigError(f"ingest.format: {self.format!r} is not allowed; allowed: {list(SOURCE_FORMATS)}")
        validate_name("ingest.dataset", self.dataset)
        allowed_keys = set(SPLITS) | {"all"}
        bad = set(self.paths) - allowed_keys
        if bad:
            raise ConfigError(f"ingest.paths: unknown key(s) {sorted(bad)}; allowed: {sorted(allowed_keys)}")
        if "all" in self.paths and len(self.paths) > 1:
            raise ConfigError("ingest.paths: give either 'all' or per-split paths, not both")
        if self.format != "synthetic" and not self.paths:
            raise ConfigError(f"ingest.paths: required for format {self.format!r}")
        if self.max_rank < 1:
            raise ConfigError("ingest.max_rank: must be >= 1")
        if not 0 <= self.max_quarantine_share <= 1:
            raise ConfigError("ingest.max_quarantine_share: must be in [0, 1]")


def _check_strength(key: str, k: Any, allow_auto: bool = True) -> None:
    if k == "auto" and allow_auto:
        return
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not k > 0 or not math.isfinite(k):
        raise ConfigError(f"{key}: {k!r} is not allowed; a number > 0" + (" or auto" if allow_auto else ""))


@dataclass(frozen=True)
class PriorConfig:
    """The Beta prior of every parameter family (models/priors.py): value = (num + k m) / (den + k).

    none: plain MLE; pyclick: PyClick's +1 / +2 everywhere; beta: qd families shrink toward
    their pooled mean m with strength k, `auto` = the grid value with the best valid-split LL.
    """
    kind: Literal["none", "pyclick", "beta"] = "beta"
    k: Any = "auto"
    grid: tuple[float, ...] = DEFAULT_K_GRID
    warmup: int = DEFAULT_WARMUP   # at most this many passes pooled means follow the fit (while valid LL improves); then fixed
    rank_means: bool = True   # pairs unseen in training take their family's pooled mean at the rank shown
    # what seen pairs shrink toward: the family's mean, or their ranks' (models/priors.py); both: valid chooses
    seen_means: tuple[str, ...] = ("pooled", "rank")

    def __post_init__(self) -> None:
        _check_strength("fit.prior.k", self.k)
        if not isinstance(self.rank_means, bool):
            raise ConfigError(f"fit.prior.rank_means: true or false, got {self.rank_means!r}")
        if not self.seen_means or any(v not in SEEN_MEANS for v in self.seen_means) \
                or len(set(self.seen_means)) < len(self.seen_means):
            raise ConfigError(f"fit.prior.seen_means: a list of distinct values from {list(SEEN_MEANS)}, "
                              f"got {list(self.seen_means)!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 1:
            raise ConfigError(f"fit.prior.warmup: an integer >= 1, got {self.warmup!r}")
        if not self.grid:
            raise ConfigError("fit.prior.grid: a non-empty list of numbers > 0")
        for k in self.grid:
            _check_strength("fit.prior.grid", k, allow_auto=False)


@dataclass(frozen=True)
class PriorOverride:
    """fit.model_priors.<model> or <model>.<family>: what differs from fit.prior there."""
    kind: Literal["none", "pyclick", "beta"] | None = None
    k: Any = None

    def __post_init__(self) -> None:
        if self.k is not None:
            _check_strength("fit.model_priors.k", self.k)


@dataclass(frozen=True)
class FitConfig:
    models: tuple[str, ...] = ("gctr", "rctr", "dctr", "pbm", "cm", "ubm", "dcm", "ccm", "dbn", "sdbn")
    # the cap on EM passes; EM stops earlier once the log posterior per training SERP moves by less than tol
    iterations: int = 50
    tol: float | None = 1e-4
    max_rank: int = 10
    prior: PriorConfig = field(default_factory=PriorConfig)
    # per model ("dbn") or per parameter family ("dbn.sigma"): {kind, k}
    model_priors: dict[str, PriorOverride] = field(default_factory=dict)
    # with spark.checkpoint_dir: EM's state is checkpointed every this many passes (ALS's checkpointInterval)
    checkpoint_interval: int = 10
    # how EM passes run (spark_em.ENGINES): "stages", one Spark job per pass; "resident", every pass in one
    # barrier stage whose tasks keep the blocks; "auto", resident where the cluster allows it (no dynamic
    # allocation). The fitted parameters are the same bit for bit.
    engine: str = "auto"

    def __post_init__(self) -> None:
        if self.engine not in FIT_ENGINES:
            raise ConfigError(f"fit.engine: {self.engine!r} not allowed; allowed: {list(FIT_ENGINES)}")
        bad = [m for m in self.models if m not in MODEL_NAMES]
        if bad or not self.models:
            raise ConfigError(f"fit.models: {bad or '[]'} not allowed; allowed: {list(MODEL_NAMES)}")
        if self.iterations < 1:
            raise ConfigError("fit.iterations: must be >= 1")
        if self.tol is not None and self.tol <= 0:
            raise ConfigError("fit.tol: must be > 0 or null")
        if self.checkpoint_interval < 1:
            raise ConfigError("fit.checkpoint_interval: must be >= 1")
        for key in self.model_priors:
            name, _, family = key.partition(".")
            if name not in MODEL_NAMES:
                raise ConfigError(f"fit.model_priors.{key}: unknown model {name!r}; allowed: {list(MODEL_NAMES)}")
            model = MODELS[name]
            families = [*model.qd_params, *sorted(model.global_shapes(self.max_rank))]
            if family and family not in families:
                raise ConfigError(f"fit.model_priors.{key}: {name} has no parameter family {family!r}; "
                                  f"it has {families}")

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


@dataclass(frozen=True)
class PredictConfig:
    splits: tuple[str, ...] = ("test",)

    def __post_init__(self) -> None:
        bad = [s for s in self.splits if s not in SPLITS]
        if bad or not self.splits:
            raise ConfigError(f"predict.splits: {bad or '[]'} not allowed; allowed: {list(SPLITS)}")


@dataclass(frozen=True)
class ExternalModelConfig:
    """Predictions of a model trained elsewhere (NCM, CACM, AICM, ...), in the click_predictions contract."""
    name: str
    predictions: str
    # relevance_scores contract (query_id, doc_id, score); without it the model gets no NDCG
    relevance_scores: str | None = None
    format: Literal["auto", "delta", "parquet"] = "auto"

    def __post_init__(self) -> None:
        validate_name("evaluate.external.name", self.name)


@dataclass(frozen=True)
class EvaluateConfig:
    splits: tuple[str, ...] = ("test",)
    # probabilities are clipped to [eps, 1 - eps]; the number clipped is reported
    eps: float = 1e-6
    replicates: int = 200
    seed: int = 20210414
    confidence: float = 0.95
    ndcg_cutoffs: tuple[int, ...] = (1, 3, 5, 10)
    ndcg_gain: Literal["exponential", "linear"] = "exponential"
    # serp: ideal order of the SERP's own grades; query: of every judged document of the query
    ndcg_ideal: Literal["serp", "query"] = "serp"
    # paired differences (<metric>_diff) of every model against this one; null: none
    reference_model: str | None = "rctr"
    external: tuple[ExternalModelConfig, ...] = ()

    def __post_init__(self) -> None:
        bad = [s for s in self.splits if s not in SPLITS]
        if bad or not self.splits:
            raise ConfigError(f"evaluate.splits: {bad or '[]'} not allowed; allowed: {list(SPLITS)}")
        if self.reference_model is not None:
            validate_name("evaluate.reference_model", self.reference_model)
        if not 0 < self.eps < 0.5:
            raise ConfigError("evaluate.eps: must be in (0, 0.5)")
        if self.replicates < 1:
            raise ConfigError("evaluate.replicates: must be >= 1")
        if not 0 < self.confidence < 1:
            raise ConfigError("evaluate.confidence: must be in (0, 1)")
        if not self.ndcg_cutoffs or any(k < 1 for k in self.ndcg_cutoffs):
            raise ConfigError("evaluate.ndcg_cutoffs: a non-empty list of integers >= 1")
        names = [e.name for e in self.external]
        if len(set(names)) != len(names):
            raise ConfigError(f"evaluate.external: model names must be unique, got {names}")


@dataclass(frozen=True)
class ExternalSequencesConfig:
    """Click sequences sampled by a model trained elsewhere, in the synthetic_serps layout."""
    name: str
    path: str
    format: Literal["auto", "delta", "parquet"] = "auto"

    def __post_init__(self) -> None:
        validate_name("generate.external.name", self.name)


LIST_ORDERS = ("original", "shuffled_all", "shuffled_halves")
CLICK_MODES = ("stochastic", "deterministic")


@dataclass(frozen=True)
class GenerateConfig:
    # generator models among fit.models; empty: every fitted model
    generators: tuple[str, ...] = ()
    samples: int = 7
    click_modes: tuple[str, ...] = ("stochastic",)
    list_orders: tuple[str, ...] = LIST_ORDERS
    split: Literal["train", "valid", "test"] = "test"
    seed: int = 20210415
    external: tuple[ExternalSequencesConfig, ...] = ()

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ConfigError("generate.samples: must be >= 1")
        for key, values, allowed in (("click_modes", self.click_modes, CLICK_MODES),
                                     ("list_orders", self.list_orders, LIST_ORDERS)):
            bad = [v for v in values if v not in allowed]
            if bad or not values:
                raise ConfigError(f"generate.{key}: {bad or '[]'} not allowed; allowed: {list(allowed)}")


@dataclass(frozen=True)
class SurrogateConfig:
    model: str = "dcm"
    # the same for every generator of a run
    iterations: int = 10
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.model not in MODEL_NAMES:
            raise ConfigError(f"surrogate.model: {self.model!r} is not allowed; allowed: {list(MODEL_NAMES)}")
        if self.iterations < 1:
            raise ConfigError("surrogate.iterations: must be >= 1")


@dataclass(frozen=True)
class ReportConfig:
    # folder (relative to the working directory) or URI; the page is <path>/<run_id>.html
    path: str = "reports"
    # also write <path>/<dataset>-trend.html: each model's metrics across the dataset's runs (`report --trend`)
    trend: bool = False


# a catalog database: `schema` or `catalog.schema` (Unity), unquoted SQL identifiers
DATABASE_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}(\.[A-Za-z_][A-Za-z0-9_]{0,127})?$")


@dataclass(frozen=True)
class CatalogConfig:
    """Register every table the pipeline writes as an external Delta table of `database` in the session's
    catalog (Hive metastore, Glue, Unity: whatever the spark conf configures), so any SQL client finds it."""
    database: str

    def __post_init__(self) -> None:
        if not DATABASE_PATTERN.match(self.database):
            raise ConfigError(f"tables.catalog.database: {self.database!r} is not allowed: a SQL identifier "
                              "([A-Za-z_][A-Za-z0-9_]*), or catalog.schema")


@dataclass(frozen=True)
class TablesConfig:
    # null: the tables are Delta paths under spark.warehouse only
    catalog: CatalogConfig | None = None


@dataclass(frozen=True)
class WindowConfig:
    """The log_date range, both ends inclusive, that fit, predict, evaluate, generate and surrogate read."""
    start: date
    end: date

    def __post_init__(self) -> None:
        if self.start > self.end:
            raise ConfigError(f"window: start {self.start} is after end {self.end}")


@dataclass(frozen=True)
class AppConfig:
    env: str = "local"
    run_id: str | None = None
    spark: SparkConfig = field(default_factory=SparkConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    fit: FitConfig = field(default_factory=FitConfig)
    predict: PredictConfig = field(default_factory=PredictConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    surrogate: SurrogateConfig = field(default_factory=SurrogateConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    tables: TablesConfig = field(default_factory=TablesConfig)
    # null: the whole dataset; set: only SERPs (and dated labels) with log_date in [start, end]
    window: WindowConfig | None = None

    def __post_init__(self) -> None:
        validate_name("env", self.env)
        if self.run_id is not None:
            validate_run_id(self.run_id)
        clash = [e.name for e in self.evaluate.external if e.name in self.fit.models]
        if clash:
            raise ConfigError(f"evaluate.external: {clash} clash with fitted models in fit.models; rename them")
        missing = [s for s in self.evaluate.splits if s != "train" and s not in self.predict.splits]
        if missing:
            raise ConfigError(f"evaluate.splits: {missing} are not predicted; add them to predict.splits")

        bad = [g for g in self.generate.generators if g not in self.fit.models]
        if bad:
            raise ConfigError(f"generate.generators: {bad} are not in fit.models {list(self.fit.models)}")
        clash = [e.name for e in self.generate.external if e.name in self.fit.models]
        if clash:
            raise ConfigError(f"generate.external: {clash} clash with fitted models in fit.models; rename them")

    @property
    def generator_models(self) -> tuple[str, ...]:
        return self.generate.generators or self.fit.models

    @property
    def evaluated_models(self) -> tuple[str, ...]:
        return (*self.fit.models, *(e.name for e in self.evaluate.external))


def _build(cls: type, data: Any, path: str) -> Any:
    """Turn a YAML mapping into dataclass `cls`, rejecting unknown keys and wrong types."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or '<root>'}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise ConfigError(
            f"{_join(path, sorted(unknown)[0])}: unknown key; allowed keys: {sorted(fields)}"
        )
    required = [name for name, f in fields.items() if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING and name not in data]
    if required:
        raise ConfigError(f"{_join(path, required[0])}: required key is missing")
    hints = typing.get_type_hints(cls)
    kwargs = {name: _coerce(hints[name], value, _join(path, name)) for name, value in data.items()}
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, path)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}: {value!r} is not allowed; allowed: {list(args)}")
        return value
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return {str(k): _coerce(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        return tuple(_coerce(args[0], v, path) for v in value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is date:
        # YAML reads an unquoted 2026-11-30 as a date; a quoted one (or --set from a template) is a string
        if isinstance(value, str) and ISO_DATE.match(value.strip()):
            try:
                return date.fromisoformat(value.strip())
            except ValueError:
                pass
        if isinstance(value, date) and not isinstance(value, datetime):
            return value
        raise ConfigError(f"{path}: expected a date YYYY-MM-DD, got {value!r}")
    if tp is str:
        if isinstance(value, (dict, list)) or value is None:
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return str(value)
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> AppConfig:
    """Load conf/<env>.yaml; `overrides` are dotted keys (e.g. {"ingest.dataset": "x"}) from the CLI."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top, got {type(data).__name__}")
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for i, key in enumerate(parents):
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                # e.g. --set ingest.dataset.x=1: ingest.dataset is a value, not a section
                raise ConfigError(f"{'.'.join(parents[:i + 1])}: is {node!r}, not a section; cannot set {dotted}")
        node[leaf] = value
    return _build(AppConfig, data, "")


def resolve_locations(cfg: AppConfig) -> AppConfig:
    """`cfg` with every location key made absolute against the working directory (see the module doc)."""
    ingest = cfg.ingest
    return dataclasses.replace(
        cfg,
        spark=dataclasses.replace(cfg.spark, warehouse=resolve_location(cfg.spark.warehouse)),
        ingest=dataclasses.replace(
            ingest, paths={k: resolve_location(v) for k, v in ingest.paths.items()},
            labels=None if ingest.labels is None else resolve_location(ingest.labels)),
        evaluate=dataclasses.replace(cfg.evaluate, external=tuple(
            dataclasses.replace(e, predictions=resolve_location(e.predictions),
                                relevance_scores=e.relevance_scores and resolve_location(e.relevance_scores))
            for e in cfg.evaluate.external)),
        generate=dataclasses.replace(cfg.generate, external=tuple(
            dataclasses.replace(e, path=resolve_location(e.path)) for e in cfg.generate.external)),
        report=dataclasses.replace(cfg.report, path=resolve_location(cfg.report.path)),
    )


def input_locations(cfg: AppConfig, stages: tuple[str, ...]) -> list[tuple[str, str]]:
    """(key, location) of every input file the given stages read (outputs not included)."""
    found = []
    if "ingest" in stages and cfg.ingest.format != "synthetic":
        found += [(f"ingest.paths.{k}", v) for k, v in cfg.ingest.paths.items()]
        if cfg.ingest.labels is not None:
            found.append(("ingest.labels", cfg.ingest.labels))
    if "evaluate" in stages:
        for e in cfg.evaluate.external:
            found.append((f"evaluate.external[{e.name}].predictions", e.predictions))
            if e.relevance_scores is not None:
                found.append((f"evaluate.external[{e.name}].relevance_scores", e.relevance_scores))
    if "generate" in stages:
        found += [(f"generate.external[{e.name}].path", e.path) for e in cfg.generate.external]
    return found


def config_as_dict(cfg: AppConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
