"""Job configuration: one YAML per environment (conf/<env>.yaml) loaded into frozen pydantic models.

Validation happens once, at start-up: an unknown key or a bad value raises ConfigError naming the key
path, the value given and what is allowed, before any Spark work.

Every folder, file or URI is a field typed `Location[...]` (fields.py), found by walking the models. A
relative one is relative to the current working directory of the process that reads the config (the
driver), never to where the package is installed: `resolve_locations` makes them absolute once, at
start-up. URIs (s3a://, abfss://, file:/) and absolute paths are kept as they are.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Mapping

import yaml
from pydantic import model_validator

# what the package's users import from here: the sections (sections.py), the shared names and rules (base.py),
# the field types (fields.py) and the location helpers (locations.py)
from clickeval_spark.config.base import (CLICK_MODES, DATABASE_PATTERN, LIST_ORDERS, MODEL_NAMES,  # noqa: F401
                                         NAME_PATTERN, NAME_RULE, PROJECT_ROOT, RUN_ID_PATTERN, RUN_ID_RULE,
                                         SIMULATABLE_MODELS, SOURCE_FORMATS, SPLITS, AtLeast1, Name, PriorKind,
                                         Section, Strength, validate_name, validate_run_id)
from clickeval_spark.config.fields import (ISO_DATE, Day, Invalid, Location, Text, Tuple, config_error,  # noqa: F401
                                           distinct, matching, strength)
from clickeval_spark.config.locations import (check_day_placeholders, fill_day, input_locations,  # noqa: F401
                                              is_uri, names_day, resolve_location, resolve_locations)
from clickeval_spark.config.sections import (CatalogConfig, EvaluateConfig, ExternalModelConfig,  # noqa: F401
                                             ExternalSequencesConfig, FitConfig, GenerateConfig, IngestConfig,
                                             PredictConfig, PriorConfig, PriorOverride, ReportConfig, SparkConfig,
                                             SplitConfig, Splits, SurrogateConfig, SyntheticConfig, TablesConfig,
                                             WindowConfig)
from clickeval_spark.errors import ConfigError
from clickeval_spark.models import ENGINES as FIT_ENGINES, MODELS  # noqa: F401
from clickeval_spark.models.priors import (DEFAULT_K_GRID, DEFAULT_SELECT_SERPS, DEFAULT_WARMUP,  # noqa: F401
                                           SEEN_MEANS)


class AppConfig(Section):
    env: Name = "local"
    run_id: Annotated[Text, matching(RUN_ID_PATTERN, RUN_ID_RULE)] | None = None
    spark: SparkConfig = SparkConfig()
    ingest: IngestConfig = IngestConfig()
    fit: FitConfig = FitConfig()
    predict: PredictConfig = PredictConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    generate: GenerateConfig = GenerateConfig()
    surrogate: SurrogateConfig = SurrogateConfig()
    report: ReportConfig = ReportConfig()
    tables: TablesConfig = TablesConfig()
    # null: the whole dataset; set: only SERPs (and dated labels) with log_date in [start, end]
    window: WindowConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> AppConfig:
        fitted = self.fit.models
        for section in ("evaluate", "generate"):
            clash = [e.name for e in getattr(self, section).external if e.name in fitted]
            if clash:
                raise Invalid(f"{clash} clash with fitted models in fit.models; rename them", f"{section}.external")
        missing = [s for s in self.evaluate.splits if s != "train" and s not in self.predict.splits]
        if missing:
            raise Invalid(f"{missing} are not predicted; add them to predict.splits", "evaluate.splits")
        bad = [g for g in self.generate.generators if g not in fitted]
        if bad:
            raise Invalid(f"{bad} are not in fit.models {list(fitted)}", "generate.generators")
        return self

    @property
    def generator_models(self) -> tuple[str, ...]:
        return self.generate.generators or self.fit.models

    @property
    def evaluated_models(self) -> tuple[str, ...]:
        return (*self.fit.models, *(e.name for e in self.evaluate.external))


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> AppConfig:
    """Load conf/<env>.yaml; `overrides` are dotted keys (e.g. {"ingest.dataset": "x"}) from the CLI."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config ({exc.strerror})") from None
    except (yaml.YAMLError, ValueError) as exc:   # ValueError: a date YAML cannot build (2026-02-30)
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
        # a copy: a later override under this key must not write into the caller's mapping (a shared constant)
        node[leaf] = copy.deepcopy(value)
    return AppConfig.model_validate(data)   # through Section.__init__, which raises ConfigError


def config_as_dict(cfg: AppConfig) -> dict[str, Any]:
    return cfg.model_dump()
