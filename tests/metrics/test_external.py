"""External models: every contract violation fails with its rule and the first offending rows."""

import pytest

from clickeval_spark.config import ExternalModelConfig
from clickeval_spark.errors import ClickevalError
from clickeval_spark.metrics.external import checked_predictions, checked_scores

SERPS = "dataset string, split string, serp_id string, query_id string, doc_ids array<string>, clicks array<int>"
EXT = ExternalModelConfig(name="ncm", predictions="/data/ncm_preds", relevance_scores="/data/ncm_scores")
BY_RANK = "serp_id string, rank int, click int, p_click_cond double, p_click double"
PER_SERP = "serp_id string, clicks array<int>, p_click_cond array<double>, p_click array<double>"


@pytest.fixture(scope="module")
def serps(spark):
    # s1 (test) has 4 results, of which max_rank = 3 are evaluated; s0 is a train SERP
    rows = [("d", "test", "s1", "q", ["u1", "u2", "u3", "u4"], [1, 0, 0, 1]),
            ("d", "train", "s0", "q", ["u1", "u2", "u3"], [0, 0, 0])]
    return spark.createDataFrame(rows, SERPS)


def good_rows():
    return [("s1", 1, 1, 0.6, 0.5), ("s1", 2, 0, 0.2, 0.3), ("s1", 3, 0, 0.1, 0.1)]


def _check(spark, serps, rows, schema=BY_RANK):
    return checked_predictions(spark.createDataFrame(rows, schema), serps, 3, ("test",), EXT)


EXPECTED = [("ncm", "d", "test", "s1", [1, 0, 0], [0.6, 0.2, 0.1], [0.5, 0.3, 0.1])]


def test_valid_predictions_pass_in_either_shape_as_one_row_per_serp(spark, serps):
    by_rank = _check(spark, serps, good_rows() + [("s0", 1, 0, 0.5, 0.5)]).collect()
    per_serp = _check(spark, serps, [("s1", None, [0.6, 0.2, 0.1], [0.5, 0.3, 0.1]),
                                     ("s0", [0, 0, 0], [0.5] * 3, [0.5] * 3)], PER_SERP).collect()
    assert [tuple(r) for r in by_rank] == [tuple(r) for r in per_serp] == EXPECTED
    assert by_rank[0].asDict().keys() == {"model", "dataset", "split", "serp_id", "clicks", "p_click_cond",
                                          "p_click"}


@pytest.mark.parametrize("rows, rule", [
    (good_rows() + [("s1", 2, 0, 0.2, 0.3)], "duplicate_prediction"),
    (good_rows()[:2], "missing_prediction"),
    (good_rows() + [("s9", 1, 0, 0.5, 0.5)], "unknown_position"),
    (good_rows() + [("s1", 4, 0, 0.5, 0.5)], "unknown_position"),   # rank 4 is beyond max_rank
    ([good_rows()[0], ("s1", 2, 0, float("nan"), 0.3), good_rows()[2]], "probability_out_of_range"),
    ([good_rows()[0], ("s1", 2, 0, 0.2, 1.5), good_rows()[2]], "probability_out_of_range"),
    ([good_rows()[0], ("s1", 2, 0, 0.2, None), good_rows()[2]], "probability_out_of_range"),
    ([good_rows()[0], ("s1", 2, 1, 0.2, 0.3), good_rows()[2]], "click_differs_from_log"),
])
def test_each_violation_names_rule_path_and_rows(spark, serps, rows, rule):
    with pytest.raises(ClickevalError) as err:
        _check(spark, serps, rows)
    message = str(err.value)
    assert "external model 'ncm': /data/ncm_preds:" in message and f"rule {rule}" in message
    assert "first rows:\n    {" in message


GOOD = ("s1", None, [0.6, 0.2, 0.1], [0.5, 0.3, 0.1])


@pytest.mark.parametrize("rows, rule", [
    ([GOOD, GOOD], "duplicate_prediction"),
    ([("s0", None, [0.5], [0.5])], "missing_prediction"),
    ([GOOD, ("s9", None, [0.5], [0.5])], "unknown_position"),
    ([("s1", None, [0.6, 0.2], [0.5, 0.3])], "length_mismatch"),
    ([("s1", None, [0.6, 0.2, 0.1, 0.1], [0.5, 0.3, 0.1, 0.1])], "length_mismatch"),  # rank 4 > max_rank
    ([("s1", None, None, [0.5, 0.3, 0.1])], "length_mismatch"),
    ([("s1", None, [0.6, float("nan"), 0.1], [0.5, 0.3, 0.1])], "probability_out_of_range"),
    ([("s1", None, [0.6, 0.2, 0.1], [0.5, None, 0.1])], "probability_out_of_range"),
    ([("s1", None, [0.6, 0.2, 0.1], [0.5, 1.5, 0.1])], "probability_out_of_range"),
    ([("s1", [1, 1, 0], [0.6, 0.2, 0.1], [0.5, 0.3, 0.1])], "click_differs_from_log"),
])
def test_per_serp_predictions_are_held_to_the_same_rules(spark, serps, rows, rule):
    with pytest.raises(ClickevalError) as err:
        _check(spark, serps, rows, PER_SERP)
    assert f"rule {rule}" in str(err.value)


def test_missing_columns_are_named(spark, serps):
    with pytest.raises(ClickevalError, match=r"missing column\(s\) \['p_click'\]"):
        _check(spark, serps, [("s1", 1, 0.5)], "serp_id string, rank int, p_click_cond double")
    with pytest.raises(ClickevalError, match=r"missing column\(s\) \['p_click'\]"):
        _check(spark, serps, [("s1", [0.5])], "serp_id string, p_click_cond array<double>")


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
