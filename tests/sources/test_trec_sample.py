"""The real TREC Session 2014 sample (data/trec-session-2014-demo), ingested end to end into Delta and queried with SQL."""


import pytest

from clickeval_spark.config import IngestConfig
from clickeval_spark.catalog import register_temp_views
from clickeval_spark.context import StageContext
from clickeval_spark.stages import STAGES
from clickeval_spark.config import AppConfig
from tests.data import TREC_SAMPLE

DATA = TREC_SAMPLE


@pytest.mark.slow
def test_trec_sample_counts_and_sql(spark, warehouse):
    cfg = AppConfig(ingest=IngestConfig(
        dataset="trec2014", format="per_query_text", text_variant="graphcm",
        paths={s: str(DATA / f"{s}_per_query_quid.txt") for s in ("train", "valid", "test")},
        labels=str(DATA / "human_label_for_GraphCM_per_query_quid.txt"),
    ))
    counts = STAGES["ingest"](StageContext(spark, cfg, warehouse, "trec-test"))
    assert counts["read"] == counts["accepted"] + counts["quarantined"]
    assert (counts["serps_read"], counts["quarantined"]) == (3596, 0)
    assert (counts["labels_read"], counts["labels_accepted"], counts["label_rows"]) == (856, 856, 8560)

    register_temp_views(spark, warehouse)
    by_split = dict(spark.sql("SELECT split, count(*) FROM serps GROUP BY split").collect())
    assert by_split == {"train": 2872, "valid": 361, "test": 363}
    labelled = spark.sql("SELECT count(DISTINCT serp_id) FROM relevance_labels").first()[0]
    assert labelled == 856
    # facts measured on the raw files (README of the sample): sessions, queries and CTR@1 in train
    train = spark.sql("SELECT count(DISTINCT session_id), count(DISTINCT query_id), avg(clicks[0]) "
                      "FROM serps WHERE split = 'train'").first()
    assert (train[0], train[1]) == (1003, 2055) and abs(train[2] - 0.132) < 0.0005
    grades = dict(spark.sql("SELECT relevance, count(*) FROM relevance_labels GROUP BY relevance").collect())
    assert grades == {0: 5063, 1: 2170, 2: 692, -2: 497, 3: 101, 4: 37}

    run = spark.sql("SELECT status, counts FROM runs WHERE run_id = 'trec-test' AND job = 'ingest'").first()
    assert run["status"] == "succeeded" and run["counts"]["read"] == 3596 + 856

    # a rerun with the same run id replaces, never duplicates
    STAGES["ingest"](StageContext(spark, cfg, warehouse, "trec-test"))
    register_temp_views(spark, warehouse)
    assert spark.sql("SELECT count(*) FROM serps").first()[0] == 3596
    assert spark.sql("SELECT count(*) FROM runs WHERE run_id = 'trec-test'").first()[0] == 1
