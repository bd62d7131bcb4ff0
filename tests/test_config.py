from datetime import date, datetime

import pytest

from clickeval_spark.config import (AppConfig, FitConfig, IngestConfig, SparkConfig, WindowConfig, input_locations,
                                    load_config, resolve_locations, validate_run_id)
from clickeval_spark.errors import ConfigError
from pathlib import Path

CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize("name", ["local.yaml", "cluster.yaml", "trec-demo.yaml"])
def test_shipped_configs_load(name):
    cfg = load_config(CONF / name)
    assert cfg.fit.models and cfg.ingest.dataset


def test_checkpoint_settings():
    """Embedded runs keep local checkpoints; the cluster example checkpoints EM to object storage."""
    local, cluster = load_config(CONF / "local.yaml"), load_config(CONF / "cluster.yaml")
    assert (local.spark.checkpoint_dir, local.fit.checkpoint_interval) == (None, 10)
    assert cluster.spark.checkpoint_dir == "s3a://my-search-logs/clickeval/checkpoints"
    # both pick the engine for themselves: resident on static slots, stages (recovered from those checkpoints)
    # under dynamic allocation or after a lost resident stage
    assert (local.fit.engine, cluster.fit.engine) == ("auto", "auto")


def _load(tmp_path, text, **overrides):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return load_config(path, overrides)


@pytest.mark.parametrize("text,message", [
    ("ingest: {formatt: yandex}", "ingest.formatt: unknown key; allowed keys: ["),
    ("ingest: {format: csv, paths: {all: x}}", "ingest.format: 'csv' is not allowed; allowed: ['synthetic'"),
    ("fit: {models: [pbm, xyz]}", "fit.models: 'xyz' is not allowed; allowed: ['gctr'"),
    ("fit: {models: []}", "fit.models: [] is not allowed; a non-empty list of ['gctr'"),
    ("fit: {iterations: many}", "fit.iterations: expected an integer, got 'many'"),
    ("ingest: {text_variant: ncm}", "ingest.text_variant: 'ncm' is not allowed; allowed: ['auto', 'graphcm', 'aicm']"),
    ("spark: {mode: yarn}", "spark.mode: 'yarn' is not allowed; allowed: ['embedded', 'cluster']"),
    ("ingest: {synthetic: {model: ncm}}", "ingest.synthetic.model: 'ncm' is not allowed; allowed: ['pbm'"),
    ("ingest: {split: {ratios: {train: 1, holdout: 1}}}", "ingest.split.ratios: keys must be among"),
    ("run_id: \"x' OR 1=1\"", "run_id: \"x' OR 1=1\" is not allowed: use 1-128 of"),
    ("fit: {checkpoint_interval: 0}", "fit.checkpoint_interval: must be >= 1, got 0"),
    ("fit: {engine: fast}", "fit.engine: 'fast' is not allowed; allowed: ['auto', 'stages', 'resident']"),
    ("fit: {tol: -1}", "fit.tol: must be > 0 or null, got -1"),
    ("evaluate: {eps: 0.5}", "evaluate.eps: must be in (0, 0.5), got 0.5"),
    ("evaluate: {ndcg_cutoffs: [1, 0]}", "evaluate.ndcg_cutoffs: must be >= 1, got 0"),
    ("fit: {model_priors: {dbn: {k: 0}}}", "fit.model_priors.dbn.k: 0 is not allowed; a number > 0 or auto"),
    ("fit: {model_priors: {dbn: {kindd: beta}}}", "fit.model_priors.dbn.kindd: unknown key; allowed keys: ['k', 'kind']"),
    ("fit: 5", "fit: expected a mapping, got 5"),
    ("ingest: {synthetic: {docs_per_query: 5}}", "ingest.synthetic.docs_per_query: must be >= list_size (10), got 5"),
    ("evaluate: {external: [{name: a}]}", "evaluate.external.predictions: required key is missing"),
    ("spark: {checkpoint_dir: [a]}", "spark.checkpoint_dir: expected a string, got ['a']"),
    ("fit: {prior: {halving: {0: 0.001}}}", "fit.prior.halving.0 (a key): must be >= 1, got 0"),
    ("fit: {prior: {halving: {six: 0.001}}}", "fit.prior.halving.six (a key): expected an integer, got 'six'"),
    ("fit: {prior: {halving: {6: 0}}}", "fit.prior.halving.6: must be > 0, got 0"),
    ("fit: {prior: {reuse: {days: 0}}}", "fit.prior.reuse.days: must be >= 1 or null, got 0"),
    ("fit: {prior: {reuse: {margin: -1.0e-3}}}", "fit.prior.reuse.margin: must be > 0, got -0.001"),
    ("fit: {converge: {min_seen_share: 1.5}}", "fit.converge.min_seen_share: must be in [0, 1], got 1.5"),
])
def test_bad_config_names_the_key_and_allowed_values(tmp_path, text, message):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    assert message in str(err.value)


def test_a_date_yaml_cannot_build_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"c\.yaml: not valid YAML \(day is out of range for month\)"):
        _load(tmp_path, "ingest: {log_date: 2026-02-30}")


def test_overrides_are_validated_too(tmp_path):
    cfg = _load(tmp_path, "fit: {iterations: 3}", **{"fit.iterations": 5, "ingest.dataset": "x"})
    assert (cfg.fit.iterations, cfg.ingest.dataset) == (5, "x")
    with pytest.raises(ConfigError, match="fit.tol: must be > 0"):
        _load(tmp_path, "{}", **{"fit.tol": -1})


def test_an_override_under_a_mapping_override_leaves_the_callers_mapping_alone(tmp_path):
    shared = {"fit.prior": {"kind": "beta", "k": "auto"}}   # a module constant, as benchmarks.run's PACKAGE_FIT
    on = _load(tmp_path, "{}", **shared, **{"fit.prior.reuse.days": 1})
    off = _load(tmp_path, "{}", **shared)
    assert (on.fit.prior.reuse.days, off.fit.prior.reuse.days) == (1, None)
    assert shared == {"fit.prior": {"kind": "beta", "k": "auto"}}


def test_run_id_pattern():
    assert validate_run_id("scheduled__2026-11-29T00:00:00") == "scheduled__2026-11-29T00:00:00"
    for bad in ["", "a b", "a;b", "-x", "x" * 200]:
        with pytest.raises(ConfigError):
            validate_run_id(bad)


def test_catalog_database_is_a_sql_identifier(tmp_path):
    """tables.catalog.database goes into SQL text (CREATE DATABASE, the view): an identifier, or catalog.schema."""
    assert _load(tmp_path, "{}").tables.catalog is None
    assert _load(tmp_path, "tables: {catalog: {database: clickeval}}").tables.catalog.database == "clickeval"
    assert _load(tmp_path, "tables: {catalog: {database: main.clickeval_prod}}").tables.catalog.database == "main.clickeval_prod"
    for bad in ("click-eval", "a.b.c", "x; DROP TABLE metrics", "1abc", "`x`"):
        with pytest.raises(ConfigError, match=r"^tables\.catalog\.database: .* is not allowed: a SQL identifier"):
            _load(tmp_path, "tables: {catalog: {database: '%s'}}" % bad)
    with pytest.raises(ConfigError, match=r"^tables\.catalog\.schema: unknown key; allowed keys: \['database'\]"):
        _load(tmp_path, "tables: {catalog: {schema: x}}")
    with pytest.raises(ConfigError, match=r"^tables\.catalog\.database: required key is missing"):
        _load(tmp_path, "tables: {catalog: {}}")


@pytest.mark.parametrize("text,get,expected", [
    # an int where a float is meant; a list where a tuple is meant; a number where a string is meant
    ("ingest: {split: {ratios: {train: 1, test: 2}}}", lambda c: c.ingest.split.ratios, {"train": 1.0, "test": 2.0}),
    ("fit: {models: [pbm]}", lambda c: c.fit.models, ("pbm",)),
    ("ingest: {dataset: 2026}", lambda c: c.ingest.dataset, "2026"),
    ("spark: {conf: {spark.sql.shuffle.partitions: 8}}", lambda c: c.spark.conf, {"spark.sql.shuffle.partitions": "8"}),
    ("ingest: {log_date: '2026-11-03'}", lambda c: c.ingest.log_date, date(2026, 11, 3)),
    ("fit: {prior: {k: 16}}", lambda c: c.fit.prior.k, 16),   # a strength keeps its type in the runs table
])
def test_the_conversions_yaml_needs_are_made(tmp_path, text, get, expected):
    assert repr(get(_load(tmp_path, text))) == repr(expected)


@pytest.mark.parametrize("overrides,message", [
    ({"fit.iterations": True}, "fit.iterations: expected an integer, got True"),
    ({"fit.iterations": 2.0}, "fit.iterations: expected an integer, got 2.0"),
    ({"evaluate.eps": "0.1"}, "evaluate.eps: expected a number, got '0.1'"),
    ({"report.trend": "yes"}, "report.trend: expected true/false, got 'yes'"),
    ({"evaluate.splits": "test"}, "evaluate.splits: expected a list, got 'test'"),
    ({"ingest.log_date": datetime(2026, 11, 3, 10)}, "ingest.log_date: expected a date YYYY-MM-DD"),
    ({"report.path": None}, "report.path: expected a string, got None"),
])
def test_no_other_conversion_is_made(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, "{}", **overrides)
    assert str(err.value).startswith(message)


def test_sections_built_in_python_are_checked_like_yaml():
    """Library callers and tests build sections directly: the same checks, the same key paths."""
    with pytest.raises(ConfigError, match=r"^ingest\.max_rank: must be >= 1, got 0$"):
        IngestConfig(max_rank=0)
    with pytest.raises(ConfigError, match=r"^fit\.model_priors\.ncm: unknown model 'ncm'"):
        AppConfig(fit=FitConfig(model_priors={"ncm": {"k": 1}}))
    assert WindowConfig(date(2026, 11, 1), date(2026, 11, 2)) == WindowConfig(start="2026-11-01", end="2026-11-02")
    with pytest.raises(ConfigError, match=r"^window: start 2026-11-02 is after end 2026-11-01$"):
        WindowConfig(date(2026, 11, 2), date(2026, 11, 1))


def test_every_location_is_resolved_and_inputs_are_listed(tmp_path, monkeypatch):
    """The location fields are found by walking the models: resolve_locations and input_locations agree."""
    monkeypatch.chdir(tmp_path)
    cfg = _load(tmp_path, "{}", **{"spark.checkpoint_dir": "ckpt", "ingest.format": "yandex",
                                   "ingest.paths": {"all": "log.txt"}, "ingest.labels": "labels.txt"})
    resolved = resolve_locations(cfg)
    assert resolved.spark.checkpoint_dir == str(tmp_path / "ckpt")
    assert input_locations(resolved, ("ingest",)) == [("ingest.paths.all", str(tmp_path / "log.txt")),
                                                      ("ingest.labels", str(tmp_path / "labels.txt"))]
    # the synthetic format generates its log: nothing of ingest is read
    assert input_locations(AppConfig(ingest=IngestConfig(paths={"all": "x"})), ("ingest",)) == []
    assert resolve_locations(AppConfig(spark=SparkConfig(warehouse="s3a://b/wh"))).spark.warehouse == "s3a://b/wh"


def test_daily_locations_are_filled_from_log_date(tmp_path, monkeypatch):
    """{log_date} (or {log_date:<format>}) in ingest.paths and ingest.labels is the logical day; Hadoop globs
    pass as they are; the config keeps the location as written, input_paths gives it filled."""
    monkeypatch.chdir(tmp_path)
    cfg = resolve_locations(_load(tmp_path, "{}", **{
        "ingest.format": "tiangong_xml", "ingest.log_date": "2026-11-28",
        "ingest.paths": {"all": "s3a://logs/dt={log_date}/h={00,01}/"}, "ingest.labels": "labels/{log_date:%Y/%m%d}.txt"}))
    assert cfg.ingest.paths == {"all": "s3a://logs/dt={log_date}/h={00,01}/"}
    assert cfg.ingest.input_paths == {"all": "s3a://logs/dt=2026-11-28/h={00,01}/"}
    assert cfg.ingest.input_labels == str(tmp_path / "labels" / "2026" / "1128.txt")
    assert cfg.ingest.daily
    plain = IngestConfig(format="yandex", paths={"all": "log-{a,b}.txt"}, log_date=date(2026, 11, 28))
    assert (plain.input_paths, plain.input_labels, plain.daily) == ({"all": "log-{a,b}.txt"}, None, False)
    # the synthetic format reads no input: its paths are not checked nor daily
    assert not IngestConfig(paths={"all": "x/{log_date}"}).daily


@pytest.mark.parametrize("location, error", [
    ("s3a://b/dt={ds}/", r"^ingest\.paths\.all: .*\{ds\} is not allowed; the one placeholder is \{log_date\}"),
    ("s3a://b/{log_date:%H}.xml", r"^ingest\.paths\.all: .*\{log_date:%H\} is not allowed; a format uses only"),
    ("s3a://b/{log_date:day}.xml", r"\{log_date:day\} is not allowed"),
])
def test_bad_placeholders_are_config_errors_when_the_config_loads(location, error):
    for log_date in (None, date(2026, 11, 28)):
        with pytest.raises(ConfigError, match=error):
            IngestConfig(format="tiangong_xml", paths={"all": location}, log_date=log_date)
        with pytest.raises(ConfigError, match=error.replace(r"paths\.all", "labels")):
            IngestConfig(format="tiangong_xml", paths={"all": "x"}, labels=location, log_date=log_date)


def test_a_day_without_log_date_is_a_config_error_where_the_location_is_read():
    """The DAG's later stages share the ingest's config without ingest.log_date: only reading a daily
    location needs it (the ingest, and the input check before its session starts)."""
    cfg = load_config(CONF / "cluster.yaml")
    error = (r"^ingest\.paths\.all: 's3a://my-search-logs/tiangong-st/dt=\{log_date\}/' names its day with "
             r"\{log_date\}, but ingest\.log_date is not set; set it \(YYYY-MM-DD\)")
    with pytest.raises(ConfigError, match=error):
        input_locations(cfg, ("ingest",))
    with pytest.raises(ConfigError, match=error):
        cfg.ingest.input_paths
    assert input_locations(cfg, ("fit", "evaluate")) == []
    labels = IngestConfig(format="yandex", paths={"all": "x"}, labels="l/{log_date}.txt")
    with pytest.raises(ConfigError, match=r"^ingest\.labels: 'l/\{log_date\}\.txt' names its day"):
        input_locations(AppConfig(ingest=labels), ("ingest",))

    daily = load_config(CONF / "cluster.yaml", {"ingest.log_date": "2026-11-28"})
    assert daily.ingest.input_paths == {"all": "s3a://my-search-logs/tiangong-st/dt=2026-11-28/"}
    assert input_locations(daily, ("ingest",))[0] == ("ingest.paths.all", "s3a://my-search-logs/tiangong-st/dt={log_date}/")
