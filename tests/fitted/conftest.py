"""Fixtures of the fitted-model tests: the EM tests' builders (`tests.em.logs`)."""

import pytest

from tests.em import logs


@pytest.fixture(scope="session")
def make_log():
    """A factory of simulated logs: ``make_log(model, n_serps=..., M=..., seed=...)`` is a `logs.Log`."""
    return logs.Log


@pytest.fixture(scope="session")
def hand_fitted():
    """``hand_fitted(spark, model, log, seed)``: a FittedModel with random parameters for half of the log's pairs
    (`logs.hand_fitted`)."""
    return logs.hand_fitted
