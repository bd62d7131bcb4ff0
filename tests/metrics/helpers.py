"""Literal frames in the click_predictions / serps / labels contracts for metric tests."""

from __future__ import annotations

import numpy as np
import pandas as pd

PREDICTIONS_SCHEMA = ("model string, dataset string, split string, serp_id string, rank int, click int, "
                      "p_click_cond double, p_click double")
SERPS_SCHEMA = ("dataset string, split string, session_id string, serp_id string, query_id string, "
                "doc_ids array<string>, clicks array<int>")
LABELS_SCHEMA = ("dataset string, query_id string, doc_id string, relevance int, serp_id string, "
                 "rank int, session_id string")
SCORES_SCHEMA = "model string, query_id string, doc_id string, score double"


def random_log(rng: np.random.Generator, n_sessions: int, models=("a", "b"), dataset="d", split="test",
               max_len=10):
    """SERPs of random length with random clicks, and random predictions per model (some 0 and 1 to clip)."""
    serps, preds = [], []
    for s in range(n_sessions):
        for j in range(int(rng.integers(1, 4))):
            serp_id, length = f"s{s}-{j}", int(rng.integers(3, max_len + 1))
            clicks = rng.integers(0, 2, size=length)
            serps.append((dataset, split, f"s{s}", serp_id, f"q{s % 7}", [f"d{i}" for i in range(length)],
                          clicks.tolist()))
            for m in models:
                pc, pu = rng.uniform(0, 1, size=length), rng.uniform(0, 1, size=length)
                pc[rng.uniform(size=length) < 0.05] = 0.0
                pu[rng.uniform(size=length) < 0.05] = 1.0
                for t in range(length):
                    preds.append((m, dataset, split, serp_id, t + 1, int(clicks[t]), float(pc[t]), float(pu[t])))
    return serps, pd.DataFrame(preds, columns=["model", "dataset", "split", "serp_id", "rank", "click",
                                               "p_click_cond", "p_click"])
