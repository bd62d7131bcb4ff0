"""The field types of the config models, the walk that finds their locations, and the translation of
pydantic's ValidationError into one ConfigError line: the key path, the value given and what is allowed."""

from __future__ import annotations

import contextlib
import math
import re
import types
from datetime import date
from typing import Annotated, Any, Callable, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, ValidationError
from pydantic.fields import FieldInfo

from clickeval_spark.errors import ConfigError

ISO_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


class Invalid(ValueError):
    """A check of ours failed: the text follows the key path; `key` extends the path of the failing model."""

    def __init__(self, text: str, key: str | None = None) -> None:
        super().__init__(text)
        self.key = key


def _iso_to_date(value: Any) -> Any:
    # YAML reads an unquoted 2026-11-30 as a date; a quoted one (or --set from a template) is a string
    if isinstance(value, str) and ISO_DATE.match(value.strip()):
        with contextlib.suppress(ValueError):   # 2026-02-30 stays a string, which the strict date refuses
            return date.fromisoformat(value.strip())
    return value


# The models are strict: these (and an int where a float is meant) are the only conversions they make.
# A YAML number, boolean or date where a string is meant (`dataset: 2026`, spark conf values) is its text.
Text = Annotated[str, BeforeValidator(lambda v: str(v) if isinstance(v, (int, float, date)) else v)]
Day = Annotated[date, BeforeValidator(_iso_to_date)]


def Tuple(item: Any, **constraints: Any) -> Any:
    """A YAML list read as a tuple of `item`s (a list is the one non-tuple input accepted)."""
    return Annotated[tuple[item, ...], BeforeValidator(lambda v: tuple(v) if isinstance(v, list) else v),
                     Field(**constraints)]


def matching(pattern: re.Pattern, rule: str) -> AfterValidator:
    """A string that must match `pattern`; `rule` says what that allows."""
    def check(value: str) -> str:
        if not pattern.match(value):
            raise Invalid(f"{value!r} is not allowed: {rule}")
        return value
    return AfterValidator(check)


def strength(allow_auto: bool) -> AfterValidator:
    """A prior strength: a finite number > 0 (or `auto`). Hand-written: an int stays an int in the runs
    table, and pydantic words a union's failure as one error per member, not as one allowed set."""
    def check(k: Any) -> Any:
        if k == "auto" and allow_auto:
            return k
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not k > 0 or not math.isfinite(k):
            raise Invalid(f"{k!r} is not allowed; a number > 0" + (" or auto" if allow_auto else ""))
        return k
    return AfterValidator(check)


def distinct(values: tuple) -> tuple:
    if len(set(values)) < len(values):
        raise Invalid(f"{list(values)!r} is not allowed; the values must be distinct")
    return values


class Location:
    """Field marker: the string is a folder, file or URI. `Location[stage]` is an input file that stage
    reads (checked before the session starts); `Location[None]` is not read as an input."""

    def __init__(self, read_by: str | None) -> None:
        self.read_by = read_by

    def __class_getitem__(cls, read_by: str | None) -> Any:
        return Annotated[Text, cls(read_by)]


def _unwrap(tp: Any) -> tuple[Any, list, bool]:
    """(type, metadata, nullable) of an annotation without its Annotated and Optional layers."""
    meta, nullable = [], False
    while get_origin(tp) is Annotated or (get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)):
        if get_origin(tp) is Annotated:
            meta += [m for x in tp.__metadata__ for m in (x.metadata if isinstance(x, FieldInfo) else [x])]
            tp = tp.__origin__
        else:
            nullable, tp = True, next(a for a in get_args(tp) if a is not type(None))
    return tp, meta, nullable


def _field_type(field: FieldInfo) -> Any:
    # pydantic keeps a field's top-level constraints apart from its annotation
    return Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation


def _item_type(tp: Any) -> Any:
    """The type of a tuple's items or a dict's values."""
    return get_args(tp)[1 if get_origin(tp) is dict else 0]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def section_keys(tp: Any, parts: tuple[str, ...] = ()) -> dict[type, tuple[str, ...]]:
    """The key path of every section model under `tp`, found by walking the fields' types."""
    tp = _unwrap(tp)[0]
    if get_origin(tp) in (tuple, dict):
        return section_keys(_item_type(tp), parts)
    if not _is_model(tp):
        return {}
    nested = [section_keys(_field_type(field), (*parts, name)) for name, field in tp.model_fields.items()]
    return {section: key for found in nested for section, key in found.items()} | {tp: parts}


def map_locations(value: Any, tp: Any, key: str, fn: Callable[[str, str, Location, Any], str], owner: Any = None) -> Any:
    """`value` (of type `tp`, at `key`) with fn(key, location, marker, section) in place of every Location in it.
    A tuple's items are keyed by their name: evaluate.external[ncm].predictions."""
    tp, meta, _ = _unwrap(tp)
    marker = next((m for m in meta if isinstance(m, Location)), None)
    if value is None or marker is not None:
        return value if value is None else fn(key, value, marker, owner)
    if isinstance(value, BaseModel):
        return value.model_copy(update={
            name: map_locations(getattr(value, name), _field_type(field), f"{key}.{name}".lstrip("."), fn, value)
            for name, field in type(value).model_fields.items()})
    if get_origin(tp) is dict:
        return {k: map_locations(v, _item_type(tp), f"{key}.{k}", fn, owner) for k, v in value.items()}
    if get_origin(tp) is tuple:
        return tuple(map_locations(v, _item_type(tp), f"{key}[{getattr(v, 'name', i)}]", fn, owner)
                     for i, v in enumerate(value))
    return value


def _at(tp: Any, loc: tuple) -> tuple[list[str], Any, list, bool, Any]:
    """Follow pydantic's error location through the types: (key parts, type, constraints, nullable,
    innermost model). Tuple indices are left out of the key: evaluate.external.name."""
    parts, model, key_type = [], None, Any
    for part in loc:
        if part == "[key]":   # a mapping's key broke its type's rule (the part before it is the key)
            tp, parts[-1] = key_type, f"{parts[-1]} (a key)"
            continue
        tp = _unwrap(tp)[0]
        if get_origin(tp) is tuple and isinstance(part, int):
            tp = _item_type(tp)
            continue
        parts.append(str(part))
        if _is_model(tp):
            model, field = tp, tp.model_fields.get(part)
            tp = _field_type(field) if field else Any
        elif get_origin(tp) is dict:
            key_type, tp = get_args(tp)[0], _item_type(tp)
        else:
            tp = Any
    return parts, *_unwrap(tp), model


_EXPECTED = {"int": "an integer", "float": "a number", "bool": "true/false", "string": "a string", "tuple": "a list",
             "list": "a list", "dict": "a mapping", "model": "a mapping", "date": "a date YYYY-MM-DD"}
# an unknown key is reported first: it is often the misspelt name of one reported missing
_FIRST = {"extra_forbidden": 0, "missing": 1}
_BOUNDS = {"gt": (">", "("), "ge": (">=", "["), "lt": ("<", ")"), "le": ("<=", "]")}


def _allowed_range(meta: list) -> str:
    """What numeric constraints allow: `>= 1`, or `in (0, 1]` when both ends are bounded."""
    bounds = {op: getattr(m, op) for m in meta for op in _BOUNDS if isinstance(m, getattr(annotated_types, op.title()))}
    if len(bounds) == 2:
        (low, a), (high, b) = sorted(bounds.items(), key=lambda ob: ob[0] not in ("gt", "ge"))
        return f"in {_BOUNDS[low][1]}{a}, {b}{_BOUNDS[high][1]}"
    return " ".join(f"{_BOUNDS[op][0]} {v}" for op, v in bounds.items())


def config_error(exc: ValidationError, root: type[BaseModel], section: type[BaseModel]) -> ConfigError:
    """The first of pydantic's errors for `section` (a model under `root`) as one ConfigError line."""
    err = min(exc.errors(include_url=False), key=lambda e: _FIRST.get(e["type"], 2))
    parts, tp, meta, nullable, model = _at(section, err["loc"])
    key = ".".join((*section_keys(root)[section], *parts))
    kind, value, error = err["type"], err["input"], err.get("ctx", {}).get("error")
    value = list(value) if isinstance(value, tuple) else value   # as the YAML wrote it
    if isinstance(error, Invalid):
        return ConfigError(f"{'.'.join(filter(None, (key, error.key)))}: {error}")
    if kind == "extra_forbidden":
        text = f"unknown key; allowed keys: {sorted(model.model_fields)}"
    elif kind == "missing":
        text = "required key is missing"
    elif kind == "literal_error":
        text = f"{value!r} is not allowed; allowed: {list(get_args(tp))}"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        text = f"must be {_allowed_range(meta)}{' or null' if nullable else ''}, got {value!r}"
    elif kind == "too_short":
        item = _unwrap(_item_type(tp))[0]
        text = f"{value!r} is not allowed; a non-empty list" + (
            f" of {list(get_args(item))}" if get_origin(item) is Literal else "")
    else:
        expected = _EXPECTED.get(kind.partition("_")[0])
        text = f"expected {expected}, got {value!r}" if expected else f"{err['msg']}, got {value!r}"
    return ConfigError(f"{key or '<root>'}: {text}")
