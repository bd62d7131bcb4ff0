"""What every config section shares: the Section base model, and the names and rules of the values that
go into Delta predicates, partition folders and run ids."""

from __future__ import annotations

import re
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from clickeval_spark.config.fields import Text, config_error, matching, strength
from clickeval_spark.errors import ConfigError
from clickeval_spark.models import LEARNED, MODELS  # the kernel registry (numpy only: no Spark at config time)

# the checkout, for scripts that live in it (benchmarks/); config locations never resolve against it
PROJECT_ROOT = Path(__file__).resolve().parents[2]
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
RUN_ID_RULE = "use 1-128 of [A-Za-z0-9_.:-], starting with a letter or digit"
# dataset, model and environment names: they go into Delta predicates (replaceWhere), partition folders
# and default run ids, so they are a subset of what a run id allows
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
NAME_RULE = f"must match {NAME_PATTERN.pattern} (1-64 of [A-Za-z0-9_.-], starting with a letter or digit)"
# a catalog database: `schema` or `catalog.schema` (Unity), unquoted SQL identifiers
DATABASE_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}(\.[A-Za-z_][A-Za-z0-9_]{0,127})?$")
SPLITS = ("train", "valid", "test")
# the EM models (surrogates, priors) and every model fit.models may name (the EM ones and the learned ones)
EM_MODEL_NAMES = tuple(MODELS)
MODEL_NAMES = (*MODELS, *LEARNED)
SIMULATABLE_MODELS = ("pbm", "ubm", "dbn", "sdbn", "dcm", "ccm", "cm")
SOURCE_FORMATS = ("synthetic", "tiangong_xml", "per_query_text", "yandex", "parquet", "delta")
LIST_ORDERS = ("original", "shuffled_all", "shuffled_halves")
CLICK_MODES = ("stochastic", "deterministic")


def validate_run_id(run_id: str) -> str:
    """run_id goes into Delta predicates: only a safe character set is allowed."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id):
        raise ConfigError(f"run_id {run_id!r} is not allowed: {RUN_ID_RULE}")
    return run_id


def validate_name(key: str, value: Any) -> str:
    """A user-given name (dataset, model, env) is checked against NAME_PATTERN at start-up, before any write."""
    if not isinstance(value, str) or not NAME_PATTERN.match(value):
        raise ConfigError(f"{key}: {value!r} is not allowed: {NAME_RULE}")
    return value


Name = Annotated[Text, matching(NAME_PATTERN, NAME_RULE)]
AtLeast1 = Annotated[int, Field(ge=1)]
Strength = Annotated[Any, strength(allow_auto=True)]
PriorKind = Literal["none", "pyclick", "beta"]


# pydantic validates a nested section through its __init__ too: only the outermost turns errors into ConfigError
_VALIDATING = ContextVar("config_validating", default=False)


class Section(BaseModel):
    """A config section: frozen, strict, unknown keys rejected; an empty (null) section takes the defaults."""
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def __init__(self, *args: Any, **data: Any) -> None:
        data.update(zip(type(self).model_fields, args))   # positional in field order: WindowConfig(start, end)
        outer = not _VALIDATING.get()   # a section inside another one's validation: that one words the error
        token = _VALIDATING.set(True)
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_error(exc, _root(), type(self)) if outer else exc from None
        finally:
            _VALIDATING.reset(token)

    @model_validator(mode="before")
    @classmethod
    def _null_is_empty(cls, data: Any) -> Any:
        return {} if data is None else data


def _root() -> type[BaseModel]:
    """AppConfig, the root whose key paths an error names; imported when an error is worded, since it is
    built from the sections that derive from Section."""
    from clickeval_spark.config import AppConfig
    return AppConfig
