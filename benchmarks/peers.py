"""CLAX beside clickeval on the real TREC Session 2014 sample: test LL per click model (issue 37).

CLAX (PyPI `clax-models`, Hager et al.) fits the classic click models by gradient descent in JAX.
This benchmark fits every model CLAX has among ours on the train split of conf/trec-demo.yaml
and scores its conditional click probabilities on the test split with OUR log-likelihood
(DESIGN.md §5: p clipped to [eps, 1-eps], summed over positions, divided by the positions), next to
the LL our own EM fits get in the `metrics` table, with a paired session-bootstrap interval of the
difference. The SERPs are the ones our pipeline ingested (same parse, splits and max_rank cut): they
are read from the run's Delta tables with `deltalake`, so both sides see exactly the same rows.

CLAX side: (query, doc) pairs of the train split get ids 1..n; every pair not in train maps to
ONE shared id n+1 that no training SERP updates (id 0 is CLAX's padding). AdamW (optax defaults,
weight decay 1e-4) on CLAX's own loss, early stopping on the valid split's loss (per-position mean
binary cross-entropy = -LL without clipping) with our own copy of the best parameters, for each
batch size x learning rate of a small grid; the grid point with the lowest valid loss is kept.
Everything is seeded (model init, shuffling, bootstrap), so a rerun prints the same numbers.

Run (JAX needs its own venv: `python3.11 -m venv .venv-peers && .venv-peers/bin/pip install -e '.[peers]'`):

    .venv-peers/bin/python -m benchmarks.peers                      # our pipeline into a temp warehouse, then CLAX
    .venv-peers/bin/python -m benchmarks.peers --warehouse warehouse [--run-id trec-1]   # reuse a TREC run
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # CPU only: no CUDA probing (torch's CUDA wheels are installed)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from deltalake import DeltaTable  # noqa: E402
from flax import nnx  # noqa: E402

import clax  # noqa: E402
from clickeval_spark.config import load_config  # noqa: E402
from clickeval_spark.metrics.bootstrap import numpy_poisson_weights, percentile_interval  # noqa: E402
from clickeval_spark.tables import table_path  # noqa: E402

CONF = "conf/trec-demo.yaml"
DEFAULT_RUN_ID = "peers-clax"
OUR_STAGES = ("ingest", "fit", "predict", "evaluate")
# our model name -> CLAX constructor (M = positions, Q = query-doc ids incl. the shared unseen id)
CLAX_MODELS = {
    "gctr": lambda M, Q, rngs: clax.GlobalCTRModel(rngs=rngs),
    "rctr": lambda M, Q, rngs: clax.RankCTRModel(positions=M, rngs=rngs),
    "dctr": lambda M, Q, rngs: clax.DocumentCTRModel(query_doc_pairs=Q, rngs=rngs),
    "pbm": lambda M, Q, rngs: clax.PositionBasedModel(positions=M, query_doc_pairs=Q, rngs=rngs),
    "ubm": lambda M, Q, rngs: clax.UserBrowsingModel(positions=M, query_doc_pairs=Q, rngs=rngs),
    "cm": lambda M, Q, rngs: clax.CascadeModel(query_doc_pairs=Q, rngs=rngs),
    "dcm": lambda M, Q, rngs: clax.DependentClickModel(positions=M, query_doc_pairs=Q, rngs=rngs),
    "ccm": lambda M, Q, rngs: clax.ClickChainModel(query_doc_pairs=Q, rngs=rngs),
    "dbn": lambda M, Q, rngs: clax.DynamicBayesianNetwork(query_doc_pairs=Q, rngs=rngs),
    "sdbn": lambda M, Q, rngs: clax.DynamicBayesianNetwork(query_doc_pairs=Q, fix_continuation=True, rngs=rngs),
}
BATCH_SIZES = (16, 32, 128, 512)
LEARNING_RATES = (0.003, 0.01, 0.03, 0.1, 0.3)
WEIGHT_DECAY = 1e-4  # optax.adamw's default
MAX_EPOCHS = 200
PATIENCE = 5  # epochs without a valid-loss gain of MIN_DELTA before stopping
MIN_DELTA = 1e-5  # CLAX's default EarlyStopping(min_delta=1e-5)
SEED = 20210414


# ---------------------------------------------------------------------------------------------- our side

def run_our_pipeline(conf: str, warehouse: str, run_id: str) -> None:
    """Ingest, fit, predict and evaluate `conf` into `warehouse` under `run_id`, with the clickeval of this venv."""
    clickeval = str(Path(sys.executable).parent / "clickeval")
    for stage in OUR_STAGES:
        print(f"[ours] clickeval {stage} --conf {conf} --run-id {run_id} (warehouse {warehouse})", flush=True)
        subprocess.run([clickeval, stage, "--conf", conf, "--run-id", run_id, "--set", f"spark.warehouse={warehouse}"],
                       check=True, stdout=subprocess.DEVNULL)


def read_table(warehouse: str, name: str, **equal) -> pd.DataFrame:
    """A Delta table of the warehouse as pandas (deltalake, no JVM), rows where column == value for `equal`."""
    df = DeltaTable(table_path(warehouse, name)).to_pyarrow_table().to_pandas()
    for column, value in equal.items():
        df = df[df[column] == value]
    return df.reset_index(drop=True)


def latest_evaluated_run(warehouse: str, dataset: str) -> str:
    """The run id of the newest succeeded evaluate job on `dataset` in the warehouse's `runs` table."""
    runs = read_table(warehouse, "runs", job="evaluate", status="succeeded", dataset=dataset)
    if runs.empty:
        raise SystemExit(f"{warehouse}: no succeeded evaluate run on dataset {dataset}; give --run-id")
    return str(runs.sort_values("finished_at").iloc[-1]["run_id"])


# ---------------------------------------------------------------------------------------------- LL (DESIGN §5)

def serp_ll(clicks: np.ndarray, p: np.ndarray, mask: np.ndarray, eps: float) -> np.ndarray:
    """Per SERP: Σ_t [c ln p + (1-c) ln(1-p)] over its positions, p clipped to [eps, 1-eps] (DESIGN §5 LL terms)."""
    q = np.clip(np.asarray(p, dtype=np.float64), eps, 1.0 - eps)
    return np.where(mask, np.where(clicks == 1, np.log(q), np.log1p(-q)), 0.0).sum(axis=1)


def as_matrix(lists: pd.Series, M: int, dtype, fill) -> np.ndarray:
    """A column of lists as an (n, M) array: the first M elements of each, `fill` after its end."""
    out = np.full((len(lists), M), fill, dtype=dtype)
    for i, values in enumerate(lists):
        values = list(values)[:M]
        out[i, :len(values)] = values
    return out


# ---------------------------------------------------------------------------------------------- CLAX side

@dataclass
class Split:
    """One split's SERPs as CLAX batch arrays (positions 1-based, 0 = padding; query_doc_ids 0 = padding)."""
    serp_ids: np.ndarray
    arrays: dict[str, np.ndarray]


def clax_splits(serps: pd.DataFrame, M: int) -> tuple[dict[str, Split], int]:
    """train/valid/test as CLAX arrays and the id count Q: train pairs are 1..Q-1, every other pair is Q."""
    train = serps[serps["split"] == "train"]
    pair_ids: dict[tuple[str, str], int] = {}
    for query, docs in zip(train["query_id"], train["doc_ids"]):
        for doc in list(docs)[:M]:
            pair_ids.setdefault((query, doc), len(pair_ids) + 1)
    unseen = len(pair_ids) + 1
    out = {}
    for split in ("train", "valid", "test"):
        rows = serps[serps["split"] == split].sort_values("serp_id")
        lengths = np.array([min(len(d), M) for d in rows["doc_ids"]])
        mask = np.arange(M)[None, :] < lengths[:, None]
        ids = np.zeros((len(rows), M), dtype=np.int32)
        for i, (query, docs) in enumerate(zip(rows["query_id"], rows["doc_ids"])):
            ids[i, :lengths[i]] = [pair_ids.get((query, d), unseen) for d in list(docs)[:M]]
        out[split] = Split(rows["serp_id"].to_numpy(), {
            "query_doc_ids": ids,
            "positions": np.where(mask, np.arange(1, M + 1)[None, :], 0).astype(np.int32),
            "mask": mask,
            "clicks": np.where(mask, as_matrix(rows["clicks"], M, np.float32, 0), 0).astype(np.float32),
        })
    return out, unseen


def compiled_functions(graphdef, rest):
    """Jitted (train_epoch, split_loss, cond_log_probs) over a model's parameters, functional nnx style:
    train_epoch runs one epoch of AdamW steps in a lax.scan over the stacked batches."""

    def loss_fn(params, batch):
        return nnx.merge(graphdef, params, rest).compute_loss(batch).mean()  # CLAX's own training loss

    @jax.jit
    def train_epoch(params, opt_state, batches, lr):
        tx = optax.adamw(lr, weight_decay=WEIGHT_DECAY)

        def step(carry, batch):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, batch)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), batches)
        return params, opt_state, losses.mean()

    @jax.jit
    def split_loss(params, data):
        """Per-position mean binary cross-entropy over a whole split (-LL, unclipped)."""
        loss = nnx.merge(graphdef, params, rest).compute_loss(data, aggregate=False)
        return jnp.where(data["mask"], loss, 0.0).sum() / data["mask"].sum()

    @jax.jit
    def cond_log_probs(params, data):
        return nnx.merge(graphdef, params, rest).predict_conditional_clicks(data)

    return train_epoch, split_loss, cond_log_probs


def epoch_batches(train: dict[str, np.ndarray], batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The train SERPs shuffled into (n_batches, batch_size, ...) arrays; the last batch is filled up with the
    epoch's first SERPs (fixed shapes for lax.scan)."""
    n = len(train["mask"])
    n_batches = -(-n // batch_size)
    order = rng.permutation(n)
    order = np.concatenate([order, order[:n_batches * batch_size - n]])
    return {k: v[order].reshape(n_batches, batch_size, *v.shape[1:]) for k, v in train.items()}


@dataclass
class Fit:
    batch_size: int
    lr: float
    valid_loss: float
    best_epoch: int
    epochs: int
    params: object


def fit_one(name: str, splits: dict[str, Split], M: int, Q: int, batch_size: int, lr: float, fns) -> Fit:
    """AdamW from a seeded init until the valid loss stops improving (PATIENCE epochs); the best epoch's params."""
    model = CLAX_MODELS[name](M, Q, nnx.Rngs(SEED))
    _, params, _ = nnx.split(model, nnx.Param, ...)
    train_epoch, split_loss, _ = fns
    opt_state = optax.adamw(lr, weight_decay=WEIGHT_DECAY).init(params)
    valid = {k: jnp.asarray(v) for k, v in splits["valid"].arrays.items()}
    rng = np.random.default_rng(SEED)
    # flax 0.11's nnx.state(model) is a live view, so CLAX's Trainer "restores" the last epoch; the
    # parameters here are immutable jax arrays, and the best ones are copied all the same
    best_loss, best_epoch, best_params = float(split_loss(params, valid)), 0, jax.tree.map(jnp.copy, params)
    epoch = 0
    for epoch in range(1, MAX_EPOCHS + 1):
        batches = {k: jnp.asarray(v) for k, v in epoch_batches(splits["train"].arrays, batch_size, rng).items()}
        params, opt_state, _ = train_epoch(params, opt_state, batches, lr)
        loss = float(split_loss(params, valid))
        if loss < best_loss - MIN_DELTA:
            best_loss, best_epoch, best_params = loss, epoch, jax.tree.map(jnp.copy, params)
        elif epoch - best_epoch >= PATIENCE:
            break
    return Fit(batch_size, lr, best_loss, best_epoch, epoch, best_params)


def fit_clax(name: str, splits: dict[str, Split], M: int, Q: int) -> tuple[Fit, np.ndarray, list[Fit]]:
    """The grid for one model: every (batch size, learning rate) fitted; the fit of lowest valid loss and its
    conditional click probabilities on the test split (float64, (n_test, M))."""
    graphdef, _, rest = nnx.split(CLAX_MODELS[name](M, Q, nnx.Rngs(SEED)), nnx.Param, ...)
    fns = compiled_functions(graphdef, rest)
    fits = [fit_one(name, splits, M, Q, b, lr, fns) for b in BATCH_SIZES for lr in LEARNING_RATES]
    best = min(fits, key=lambda f: f.valid_loss)
    test = {k: jnp.asarray(v) for k, v in splits["test"].arrays.items()}
    p = np.exp(np.asarray(fns[2](best.params, test), dtype=np.float64))
    return best, p, fits


# ---------------------------------------------------------------------------------------------- bootstrap

def session_hashes(session_ids: np.ndarray, seed: int) -> np.ndarray:
    """A seeded int64 hash per session (blake2b of seed and id), the input of bootstrap.numpy_poisson_weights."""
    return np.array([int.from_bytes(hashlib.blake2b(f"{seed}:{s}".encode(), digest_size=8).digest(), "little",
                                    signed=True) for s in session_ids], dtype=np.int64)


def paired_interval(sessions: np.ndarray, ours: np.ndarray, theirs: np.ndarray, positions: np.ndarray,
                    seed: int, replicates: int, confidence: float) -> tuple[float, float]:
    """Percentile interval of LL(ours) - LL(theirs) over session-bootstrap replicates (Poisson(1) weights shared
    by the SERPs of a session, as the evaluate stage draws them)."""
    uniq, idx = np.unique(sessions, return_inverse=True)
    sums = np.zeros((len(uniq), 3))
    np.add.at(sums, idx, np.column_stack([ours, theirs, positions]))
    w = numpy_poisson_weights(session_hashes(uniq, seed), replicates).astype(np.float64)
    rep = w.T @ sums  # (replicates + 1, 3); row 0 = the data
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = (rep[:, 0] - rep[:, 1]) / rep[:, 2]
    return percentile_interval(diff[1:], confidence)


# ---------------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conf", default=CONF)
    ap.add_argument("--warehouse", help="reuse this warehouse's TREC run (default: run ours into a temp folder)")
    ap.add_argument("--run-id", help=f"our run to compare (default: {DEFAULT_RUN_ID}, or with --warehouse the "
                                     "newest evaluated run on the dataset)")
    ap.add_argument("--pyclick-warehouse", help="also compare with this warehouse's TREC run fitted with "
                                                "fit.prior.kind pyclick (PyClick's estimator)")
    ap.add_argument("--pyclick-run-id", help="that run (default: its newest evaluated run on the dataset)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    cfg = load_config(args.conf)
    dataset, M, eps, ecfg = cfg.ingest.dataset, cfg.fit.max_rank, cfg.evaluate.eps, cfg.evaluate
    models = [m for m in cfg.fit.models if m in CLAX_MODELS]

    tmp = None
    if args.warehouse:
        warehouse = os.path.abspath(args.warehouse)
        run_id = args.run_id or latest_evaluated_run(warehouse, dataset)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="peers-warehouse-")
        warehouse, run_id = tmp.name, args.run_id or DEFAULT_RUN_ID
        run_our_pipeline(args.conf, warehouse, run_id)
    ours_seconds = time.perf_counter() - started
    print(f"[ours] run {run_id} in {warehouse} ({ours_seconds:.0f} s)", flush=True)

    serps = read_table(warehouse, "serps", dataset=dataset)
    predictions = read_table(warehouse, "click_predictions", run_id=run_id, dataset=dataset, split="test")
    metrics = read_table(warehouse, "metrics", run_id=run_id, dataset=dataset, split="test", metric="LL")
    metrics = metrics[metrics["cutoff"].isna() & metrics["reference_model"].isna()].set_index("model")["value"]
    if tmp is not None:
        tmp.cleanup()
    pyclick = None
    if args.pyclick_warehouse:
        pyc_wh = os.path.abspath(args.pyclick_warehouse)
        pyc_run = args.pyclick_run_id or latest_evaluated_run(pyc_wh, dataset)
        pyclick = read_table(pyc_wh, "click_predictions", run_id=pyc_run, dataset=dataset, split="test")

    splits, Q = clax_splits(serps, M)
    test = splits["test"]
    sessions = serps.set_index("serp_id").loc[test.serp_ids, "session_id"].to_numpy()
    positions = test.arrays["mask"].sum(axis=1)
    clicks = test.arrays["clicks"].astype(np.int64)
    print(f"[data] {dataset}: train/valid/test SERPs {len(splits['train'].serp_ids)}/{len(splits['valid'].serp_ids)}/"
          f"{len(test.serp_ids)}, {Q - 1} train (query, doc) pairs, test positions on an unseen pair "
          f"{int((test.arrays['query_doc_ids'] == Q).sum())} of {int(positions.sum())}", flush=True)

    rows, chosen, vs_pyclick = [], [], []
    for name in models:
        # our LL per SERP from our own click_predictions, checked against the metrics table
        ours_rows = predictions[predictions["model"] == name].set_index("serp_id").loc[test.serp_ids]
        if not np.array_equal(as_matrix(ours_rows["clicks"], M, np.int64, 0), clicks):
            raise SystemExit(f"{name}: our click_predictions' clicks differ from the serps table's")
        ours_serp = serp_ll(clicks, as_matrix(ours_rows["p_click_cond"], M, np.float64, 0.5), test.arrays["mask"], eps)
        ours_ll = ours_serp.sum() / positions.sum()
        if abs(ours_ll - metrics[name]) > 1e-9:
            raise SystemExit(f"{name}: recomputed LL {ours_ll:.12f} != metrics table {metrics[name]:.12f}")

        t0 = time.perf_counter()
        best, p_clax, fits = fit_clax(name, splits, M, Q)
        seconds = time.perf_counter() - t0
        clax_serp = serp_ll(clicks, p_clax, test.arrays["mask"], eps)
        clax_ll = clax_serp.sum() / positions.sum()
        low, high = paired_interval(sessions, ours_serp, clax_serp, positions, ecfg.seed, ecfg.replicates,
                                    ecfg.confidence)
        clipped = int(((p_clax < eps) | (p_clax > 1 - eps))[test.arrays["mask"]].sum())
        rows.append((name, clax_ll, float(metrics[name]), ours_ll - clax_ll, low, high, clipped))
        if pyclick is not None:
            pyc_rows = pyclick[pyclick["model"] == name].set_index("serp_id").loc[test.serp_ids]
            pyc_serp = serp_ll(clicks, as_matrix(pyc_rows["p_click_cond"], M, np.float64, 0.5), test.arrays["mask"],
                               eps)
            vs_pyclick.append((name, pyc_serp.sum() / positions.sum(), ours_ll - pyc_serp.sum() / positions.sum(),
                               *paired_interval(sessions, ours_serp, pyc_serp, positions, ecfg.seed, ecfg.replicates,
                                                ecfg.confidence)))
        chosen.append((name, best.batch_size, best.lr, best.best_epoch, best.epochs, best.valid_loss, seconds))
        print(f"[clax] {name}: test LL {clax_ll:.4f} (ours {ours_ll:.4f}); batch {best.batch_size}, lr {best.lr}, "
              f"best epoch {best.best_epoch} of {best.epochs}, valid loss {best.valid_loss:.5f}; "
              f"grid {len(fits)} fits in {seconds:.0f} s", flush=True)

    print(f"\nTest LL on {dataset} ({len(test.serp_ids)} SERPs, {int(positions.sum())} positions; p clipped to "
          f"[{eps:g}, 1-{eps:g}]; our run {run_id}). diff = ours - CLAX; "
          f"{ecfg.confidence:.0%} paired session bootstrap, {ecfg.replicates} replicates:")
    print(f"{'model':<6} {'CLAX LL':>9} {'ours LL':>9} {'diff':>9}  {'interval of diff':>20} {'CLAX clipped':>12}")
    for name, c, o, d, low, high, clipped in rows:
        print(f"{name:<6} {c:>9.4f} {o:>9.4f} {d:>+9.4f}  [{low:+.4f}, {high:+.4f}] {clipped:>12d}")
    if vs_pyclick:
        print(f"\nAgainst prior: pyclick (PyClick's estimator) in {args.pyclick_warehouse}; diff = ours - pyclick:")
        print(f"{'model':<6} {'pyclick LL':>10} {'diff':>9}  {'interval of diff':>20}")
        for name, p_ll, d, low, high in vs_pyclick:
            print(f"{name:<6} {p_ll:>10.4f} {d:>+9.4f}  [{low:+.4f}, {high:+.4f}]")
    print(f"\nCLAX hyper-parameters chosen by valid loss (grid: batch {list(BATCH_SIZES)} x lr {list(LEARNING_RATES)}; "
          f"AdamW wd {WEIGHT_DECAY:g}, early stopping patience {PATIENCE}, min delta {MIN_DELTA:g}, "
          f"max {MAX_EPOCHS} epochs, seed {SEED}):")
    print(f"{'model':<6} {'batch':>5} {'lr':>6} {'best ep':>7} {'epochs':>6} {'valid loss':>10} {'grid s':>7}")
    for name, b, lr, be, ep, vl, s in chosen:
        print(f"{name:<6} {b:>5d} {lr:>6g} {be:>7d} {ep:>6d} {vl:>10.5f} {s:>7.1f}")
    total = time.perf_counter() - started
    print(f"\nwall time {total:.0f} s (ours {ours_seconds:.0f} s, CLAX {total - ours_seconds:.0f} s)")


if __name__ == "__main__":
    main()
