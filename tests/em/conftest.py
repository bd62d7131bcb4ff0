"""Fixtures of the EM tests. The builders behind them are in the helper module `tests.em.logs`, shared with the
fitted-model and prior tests (their own conftests give them the same fixtures) and the few modules with no
conftest of their own."""

import pytest

from tests.em.logs import Log


@pytest.fixture(scope="session")
def make_log():
    """A factory of simulated logs: ``make_log(model, n_serps=..., M=..., seed=...)`` is a `logs.Log` (its Spark
    rows and the padded numpy view of its first M ranks)."""
    return Log
