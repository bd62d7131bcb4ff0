import pytest

from clickeval_spark.config import load_config, validate_run_id
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
    # the cluster example recovers EM from those checkpoints (the stage engine); embedded runs pick for themselves
    assert (local.fit.engine, cluster.fit.engine) == ("auto", "stages")


def _load(tmp_path, text, **overrides):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return load_config(path, overrides)


@pytest.mark.parametrize("text,message", [
    ("ingest: {formatt: yandex}", "ingest.formatt: unknown key; allowed keys: ["),
    ("ingest: {format: csv, paths: {all: x}}", "ingest.format: 'csv' is not allowed; allowed: ['synthetic'"),
    ("fit: {models: [pbm, xyz]}", "fit.models: ['xyz'] not allowed; allowed: ['gctr'"),
    ("fit: {iterations: many}", "fit.iterations: expected an integer, got 'many'"),
    ("ingest: {text_variant: ncm}", "ingest.text_variant: 'ncm' is not allowed; allowed: ['auto', 'graphcm', 'aicm']"),
    ("spark: {mode: yarn}", "spark.mode: 'yarn' is not allowed; allowed: ['embedded', 'cluster']"),
    ("ingest: {synthetic: {model: ncm}}", "ingest.synthetic.model: 'ncm' is not allowed; allowed: ['pbm'"),
    ("ingest: {split: {ratios: {train: 1, holdout: 1}}}", "ingest.split.ratios: keys must be among"),
    ("run_id: \"x' OR 1=1\"", "run_id \"x' OR 1=1\" is not allowed"),
    ("fit: {checkpoint_interval: 0}", "fit.checkpoint_interval: must be >= 1"),
    ("fit: {engine: fast}", "fit.engine: 'fast' not allowed; allowed: ['auto', 'stages', 'resident']"),
    ("spark: {checkpoint_dir: [a]}", "spark.checkpoint_dir: expected a string, got ['a']"),
])
def test_bad_config_names_the_key_and_allowed_values(tmp_path, text, message):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    assert message in str(err.value)


def test_overrides_are_validated_too(tmp_path):
    cfg = _load(tmp_path, "fit: {iterations: 3}", **{"fit.iterations": 5, "ingest.dataset": "x"})
    assert (cfg.fit.iterations, cfg.ingest.dataset) == (5, "x")
    with pytest.raises(ConfigError, match="fit.tol: must be > 0"):
        _load(tmp_path, "{}", **{"fit.tol": -1})


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
