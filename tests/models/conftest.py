"""Fixtures of the model and prior tests: the EM tests' log builder (`tests.em.logs`)."""

import pytest

from tests.em import logs


@pytest.fixture(scope="session")
def sparse_log():
    """``sparse_log(model, seed=4)``: a simulated log (`logs.Log`) of many queries with few SERPs each, where
    priors matter (`logs.sparse_log`)."""
    return logs.sparse_log
