"""One EM pass of a block, numpy kernels against the compiled pass, per cascade model (DBN, CCM, DCM).

    .venv/bin/python -m benchmarks.chain_pass                       # one 262,144-SERP block, dbn,ccm,dcm
    .venv/bin/python -m benchmarks.chain_pass --serps 1000000 --models dbn --repeats 3

No Spark: `step.em_block` in this process on one block as the fit holds it (`step.BlockArrays`), M = 10,
a tenth of the rows held out. The log is simulated from the model itself: Zipf-like query frequencies
with SERPs / 25 queries (conf/bench.yaml's shape), each query's list drawn from a pool of 20 documents,
clicks sampled from random true parameters (`base.sample_clicks`). Each path runs a warm-up pass
(numba compiles or loads its cache there), then --repeats timed passes of one candidate from the same state
(the M-step of a beta prior, the LL of training and held-out rows, a new E-step); printed: the median seconds
per pass, numpy / compiled, and the largest relative difference between the two paths' states and sums.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from clickeval_spark.em.passes import PassMode, PassPlan
from clickeval_spark.em.step import BlockArrays, em_block
from clickeval_spark.models import get_model
from clickeval_spark.models.base import sample_clicks
from clickeval_spark.models.priors import model_prior

M, POOL = 10, 20


def simulated_block(model, serps: int, seed: int) -> BlockArrays:
    rng = np.random.default_rng(seed)
    n_queries = max(100, serps // 25)
    q = np.minimum(rng.zipf(1.3, serps), n_queries) - 1
    lens = np.where(rng.random(serps) < 0.8, M, rng.integers(1, M + 1, serps))
    mask = np.arange(M)[None, :] < lens[:, None]
    docs = np.argsort(rng.random((serps, POOL)) + np.arange(POOL) / 4, axis=1)[:, :M]   # top docs first, shuffled
    keys, pair = np.unique(np.where(mask, q[:, None] * POOL + docs, -1), return_inverse=True)
    pair = pair.reshape(serps, M) - int(keys[0] < 0)   # -1 where masked
    n_pairs = int((keys >= 0).sum())
    truth = {p: rng.uniform(0.05, 0.9, n_pairs) for p in model.qd_params}
    qd = {p: v[np.maximum(pair, 0)] for p, v in truth.items()}
    g = {k: rng.uniform(0.3, 0.9, s) for k, s in model.global_shapes(M).items()}
    clicks = sample_clicks(model, qd, g, mask, rng.random((serps, M)))
    return BlockArrays.of(model, clicks, pair.astype(np.int32), n_pairs, n_train=serps - serps // 10)


def timed_passes(model, block: BlockArrays, start: np.ndarray, compiled: bool, repeats: int):
    """(seconds per timed pass, the last pass's (state, stats)), every pass from the state ``start``."""
    prior = model_prior(model, M, "beta", 4.0)
    k = np.array([prior.qd[p].k for p in model.qd_params])
    update = (k, np.full(len(model.qd_params), 0.4))
    g = {name: np.full(s, 0.6) for name, s in model.global_shapes(M).items()}
    state, plan = start, PassPlan(PassMode.STEP, g, update, compiled=compiled)
    em_block(model, block, state, plan)   # warm-up: numba compiles or loads its cache
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = em_block(model, block, state, plan)
        times.append(time.perf_counter() - t)
    return times, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serps", type=int, default=262_144, help="rows of the block (em.blocks.BLOCK_SERPS)")
    ap.add_argument("--models", default="dbn,ccm,dcm")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    print("command: .venv/bin/python -m benchmarks.chain_pass " + " ".join(sys.argv[1:] if argv is None else argv))
    rows = []
    for name in args.models.split(","):
        model = get_model(name)
        block = simulated_block(model, args.serps, seed=7)
        from_half = PassPlan(PassMode.STEP, model.init_global(M), None, compiled=False)   # one E-step from 0.5
        start, _ = em_block(model, block, None, from_half)
        numpy_t, (state, vec) = timed_passes(model, block, start, False, args.repeats)
        comp_t, (c_state, c_vec) = timed_passes(model, block, start, True, args.repeats)
        both = np.concatenate([state.ravel(), vec]), np.concatenate([c_state.ravel(), c_vec])
        diff = float(np.max(np.abs(both[1] - both[0]) / np.maximum(np.abs(both[0]), 1e-300)))
        rows.append((name, block.n_train, len(block.weight) - block.n_train, block.n_pairs,
                     statistics.median(numpy_t), statistics.median(comp_t), diff))
        print(f"{name}: numpy {', '.join(f'{t:.3f}' for t in numpy_t)} s; "
              f"compiled {', '.join(f'{t:.3f}' for t in comp_t)} s", flush=True)
    print(f"\nM = {M}, medians of {args.repeats} passes\n")
    print("| model | training rows | held-out rows | pairs | numpy s per pass | compiled s per pass | numpy / compiled "
          "| max rel diff |\n|---|---|---|---|---|---|---|---|")
    for name, n_train, n_valid, n_pairs, numpy_s, comp_s, diff in rows:
        print(f"| {name} | {n_train:,} | {n_valid:,} | {n_pairs:,} | {numpy_s:.3f} | {comp_s:.3f} "
              f"| {numpy_s / comp_s:.1f} | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
