"""External models: every contract violation fails with its rule and the first offending rows."""

import pytest

from clickeval_spark.config import ExternalModelConfig
from clickeval_spark.errors import ClickevalError
from clickeval_spark.metrics.external import checked_predictions, checked_scores

POSITIONS = "dataset string, split string, serp_id string, query_id string, doc_id string, rank int, click int"
EXT = ExternalModelConfig(name="ncm", predictions="/data/ncm_preds", relevance_scores="/data/ncm_scores")


@pytest.fixture(scope="module")
def positions(spark):
    rows = [("d", "test", "s1", "q", f"u{r}", r, int(r == 1)) for r in (1, 2, 3)]
    rows += [("d", "train", "s0", "q", f"u{r}", r, 0) for r in (1, 2, 3)]
    return spark.createDataFrame(rows, POSITIONS)


def good_rows():
    return [("s1", 1, 1, 0.6, 0.5), ("s1", 2, 0, 0.2, 0.3), ("s1", 3, 0, 0.1, 0.1)]


def _check(spark, positions, rows, schema="serp_id string, rank int, click int, p_click_cond double, p_click double"):
    return checked_predictions(spark.createDataFrame(rows, schema), positions, ("test",), EXT)


def test_valid_predictions_pass_and_take_keys_from_the_log(spark, positions):
    out = _check(spark, positions, good_rows() + [("s0", 1, 0, 0.5, 0.5)]).orderBy("rank").collect()
    assert [(r["model"], r["split"], r["doc_id"], r["rank"], r["click"]) for r in out] == [
        ("ncm", "test", "u1", 1, 1), ("ncm", "test", "u2", 2, 0), ("ncm", "test", "u3", 3, 0)]


@pytest.mark.parametrize("rows, rule", [
    (good_rows() + [("s1", 2, 0, 0.2, 0.3)], "duplicate_prediction"),
    (good_rows()[:2], "missing_prediction"),
    (good_rows() + [("s9", 1, 0, 0.5, 0.5)], "unknown_position"),
    (good_rows() + [("s1", 4, 0, 0.5, 0.5)], "unknown_position"),
    ([good_rows()[0], ("s1", 2, 0, float("nan"), 0.3), good_rows()[2]], "probability_out_of_range"),
    ([good_rows()[0], ("s1", 2, 0, 0.2, 1.5), good_rows()[2]], "probability_out_of_range"),
    ([good_rows()[0], ("s1", 2, 0, 0.2, None), good_rows()[2]], "probability_out_of_range"),
    ([good_rows()[0], ("s1", 2, 1, 0.2, 0.3), good_rows()[2]], "click_differs_from_log"),
])
def test_each_violation_names_rule_path_and_rows(spark, positions, rows, rule):
    with pytest.raises(ClickevalError) as err:
        _check(spark, positions, rows)
    message = str(err.value)
    assert "external model 'ncm': /data/ncm_preds:" in message and f"rule {rule}" in message
    assert "first rows:\n    {" in message


def test_missing_columns_are_named(spark, positions):
    with pytest.raises(ClickevalError, match=r"missing column\(s\) \['p_click'\]"):
        _check(spark, positions, [("s1", 1, 0.5)], "serp_id string, rank int, p_click_cond double")


@pytest.mark.parametrize("rows, rule", [
    ([("q", "u1", 0.3), ("q", "u1", 0.4), ("q", "u2", 0.1)], "duplicate_score"),
    ([("q", "u1", 0.3), ("q", "u2", float("nan"))], "score_not_a_number"),
    ([("q", "u1", 0.3)], "missing_score"),
])
def test_scores_rules(spark, rows, rule):
    needed = spark.createDataFrame([("q", "u1"), ("q", "u2")], "query_id string, doc_id string")
    with pytest.raises(ClickevalError, match=f"/data/ncm_scores: .* rule {rule}"):
        checked_scores(spark.createDataFrame(rows, "query_id string, doc_id string, score double"), needed, EXT)
    ok = checked_scores(spark.createDataFrame([("q", "u1", 0.3), ("q", "u2", 0.1)],
                                              "query_id string, doc_id string, score double"), needed, EXT)
    assert ok.count() == 2
