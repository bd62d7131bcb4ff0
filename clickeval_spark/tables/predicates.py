"""The conditions a write or a read names its rows by: a slice's replaceWhere predicate, a set of
log days, a log_date window. Values go into SQL text only after they match the safe id pattern."""

from __future__ import annotations

from datetime import date, datetime
from typing import Sequence

from pyspark.sql import Column
from pyspark.sql import functions as F

from clickeval_spark.config import WindowConfig, validate_run_id


def slice_predicate(keys: dict[str, str | tuple[str, ...]], log_dates: Sequence[date | None] | None = None) -> str:
    """SQL for the slice `col1 = v1 AND ...`; a tuple of values: several slices replaced in one commit (every
    model of a stage); with `log_dates`, only those days of it."""
    parts = [f"{col} IN ({', '.join(map(_quoted, value))})" if isinstance(value, tuple)
             else f"{col} = {_quoted(value)}" for col, value in keys.items()]
    if log_dates is not None:
        parts.append(log_date_predicate(log_dates))
    return " AND ".join(parts)


def _quoted(value: str) -> str:
    return f"'{validate_run_id(value)}'"


def log_date_predicate(log_dates: Sequence[date | None]) -> str:
    """SQL for `log_date` in the given days; None stands for the undated (null) slice."""
    days = sorted({d for d in log_dates if d is not None})
    bad = [d for d in days if not isinstance(d, date) or isinstance(d, datetime)]
    if bad or not log_dates:
        raise ValueError(f"log_dates must be a non-empty list of datetime.date or None, got {list(log_dates)!r}")
    terms = [f"log_date IN ({', '.join(f'DATE{d.isoformat()!r}' for d in days)})"] if days else []
    if None in log_dates:
        terms.append("log_date IS NULL")
    return f"({' OR '.join(terms)})"


def user_metadata(name: str, predicate: str, run_id: str) -> str:
    """The tag of a slice's commit: which run wrote which slice (`DESCRIBE HISTORY`, `rows_written`)."""
    return f"clickeval run_id={validate_run_id(run_id)} table={name} slice={predicate}"


def in_window(window: WindowConfig | None, *, undated: bool = False) -> Column:
    """Rows whose log_date lies in the window (both ends inclusive); every row when it is unset.

    Undated rows (null log_date) are outside any set window, unless `undated` keeps them
    (pooled relevance labels belong to no day).
    """
    if window is None:
        return F.lit(True)
    dated = F.col("log_date").between(F.lit(window.start), F.lit(window.end))
    return (F.col("log_date").isNull() | dated) if undated else F.coalesce(dated, F.lit(False))
