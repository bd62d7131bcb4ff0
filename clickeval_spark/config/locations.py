"""Location strings: relative ones made absolute, the walk that lists the inputs a stage reads, and daily
inputs, whose location names the logical day with a `{log_date}` placeholder.

A daily input (`s3a://bucket/logs/dt={log_date}/`, `…/{log_date:%Y%m%d}.xml`) is filled from
ingest.log_date, so a scheduled ingest reads exactly that day's folder or file and no other. Any other
braces are Hadoop globs (`{a,b}`) and pass as they are. The placeholders' form is checked when the config
loads; a missing ingest.log_date only where the location is read (the ingest, and `input_locations` before
its session starts): the later stages of a daily run share the config without a log_date.
"""

from __future__ import annotations

import os
import re
from datetime import date
from typing import Any

from clickeval_spark.config.fields import Invalid, Location, map_locations
from clickeval_spark.errors import ConfigError

# {log_date} or {log_date:<strftime format>}
DAY_PLACEHOLDER = re.compile(r"\{log_date(?::([^{}]*))?\}")
# a `{name}` or `{name:format}` that is no Hadoop glob (a glob lists alternatives: `{a,b}`)
_NAMED = re.compile(r"\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?::[^{}]*)?\}")
# the strftime codes a day's location may use: parts of a date, never of a time
DAY_CODES = ("%Y", "%m", "%d", "%y", "%j")
_CODE = re.compile("|".join(DAY_CODES))


def is_uri(location: str) -> bool:
    return "://" in location or location.startswith("file:")


def resolve_location(location: str) -> str:
    """A relative path is relative to the current working directory (not to the package, which may
    sit inside a zip or a PEX); URIs (s3a://, abfss://, file:/) and absolute paths pass."""
    if is_uri(location) or os.path.isabs(location):
        return location
    return os.path.abspath(location)


def resolve_locations(cfg: Any) -> Any:
    """`cfg` (an AppConfig) with every Location made absolute against the working directory."""
    return map_locations(cfg, type(cfg), "", lambda key, location, marker, section: resolve_location(location))


def input_locations(cfg: Any, stages: tuple[str, ...]) -> list[tuple[str, str]]:
    """(key, location) of every input file the given stages read (outputs not included), as configured: a
    daily input keeps its `{log_date}` (IngestConfig.input_paths gives it filled); one that cannot be filled
    (no ingest.log_date) is a ConfigError here."""
    found = []

    def collect(key: str, location: str, marker: Location, section: Any) -> str:
        if marker.read_by in stages and getattr(section, "reads_inputs", True):
            if hasattr(section, "log_date"):   # the ingest's locations: a {log_date} must be fillable
                fill_day(location, section.log_date, key)
            found.append((key, location))
        return location
    map_locations(cfg, type(cfg), "", collect)
    return found


def names_day(location: str) -> bool:
    return DAY_PLACEHOLDER.search(location) is not None


def check_day_placeholders(location: str) -> None:
    """Invalid unless every placeholder of `location` is one: `{log_date}`, or `{log_date:<format>}` with
    a date's strftime codes only (no other name is a placeholder)."""
    for match in _NAMED.finditer(location):
        if match.group(1) != "log_date" or not DAY_PLACEHOLDER.fullmatch(match.group(0)):
            raise Invalid(f"{location!r}: {match.group(0)} is not allowed; the one placeholder is {{log_date}} "
                          f"(or {{log_date:<format>}} with {', '.join(DAY_CODES)})")
    for match in DAY_PLACEHOLDER.finditer(location):
        fmt = match.group(1)
        if fmt is not None and (not _CODE.search(fmt) or "%" in _CODE.sub("", fmt)):
            raise Invalid(f"{location!r}: {match.group(0)} is not allowed; a format uses only "
                          f"{', '.join(DAY_CODES)} and literal text, e.g. {{log_date:%Y%m%d}}")


def fill_day(location: str, log_date: date | None, key: str) -> str:
    """`location` (config key `key`) with each `{log_date}` as the ISO day (2026-11-28) and
    `{log_date:<format>}` as that strftime format of it; a location without a placeholder as it is.
    A placeholder without ingest.log_date is a ConfigError naming both keys."""
    if log_date is None:
        if names_day(location):
            raise ConfigError(f"{key}: {location!r} names its day with {{log_date}}, but ingest.log_date is not "
                              "set; set it (YYYY-MM-DD), e.g. --set ingest.log_date=2026-11-28")
        return location
    return DAY_PLACEHOLDER.sub(lambda m: log_date.strftime(m.group(1)) if m.group(1) else log_date.isoformat(),
                               location)
