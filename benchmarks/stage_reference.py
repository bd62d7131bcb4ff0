"""Single-process references for the stages around EM: ingest, predict and evaluate (issue 16).

Each does its Spark stage's work on the same input in one Python process, vectorised with
pyarrow and numpy, reading and writing Parquet files where the stage reads and writes Delta
tables. `benchmarks.run` times them beside the stages; tests/benchmarks/test_stage_reference.py
checks that they compute what the stages compute.

- `ingest`: a per-query text log (graphcm layout: sid, qid, [docs], [vtypes], [clicks], one
  SERP per line) -> the SERP rules of DESIGN §3 (missing id, empty list, length mismatch,
  non-binary click, rank out of range), serp_pos and serp_id in file order within each
  session, a seeded session-level split, the accepted SERPs to Parquet. It parses the lists
  as the benchmark writes them (flat JSON lists of plain ids and 0/1 integers) and counts a
  line that does not have five fields; it has no error recovery for other malformed JSON.
- `predict`: the SERPs and a fitted model's parameters -> the kernel's p_click_cond and
  p_click for every SERP (one row per SERP, arrays by rank, DESIGN §2) and a relevance score
  for every shown pair, to Parquet, and the LL per split. `run_params` gives the models the
  stage predicts: the run's fitted ones and, on a simulated dataset, the true model `truth`.
- `evaluate`: predictions, the SERPs' sessions, labels and relevance scores -> LL, PPL@t and
  total PPL (conditional and unconditional), NDCG@k, 95% intervals from a session-level
  Poisson(1) bootstrap (`replicates` replicates; the package's draws in numpy,
  `numpy_poisson_weights`, from a different 64-bit session hash than Spark's xxhash64, so
  intervals agree only up to resampling noise) and the paired differences against a reference model.

Not done here, and done by the Spark stages: Delta's transaction log and its commit, the
quarantine table's rows (counted here), the runs table, the reconciliation counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from clickeval_spark.config import SPLITS, AppConfig
from clickeval_spark.metrics.bootstrap import numpy_poisson_weights, percentile_interval
from clickeval_spark.metrics.evaluate import MetricOptions
from clickeval_spark.fitted.attach import list_array, padded
from clickeval_spark.models.base import ClickModel
from clickeval_spark.models import get_model
from clickeval_spark.fitted import FittedModel
from clickeval_spark.sources.synthetic import TRUTH_MODEL, load_truth

TEXT_FIELDS = ("session_id", "query_id", "doc_ids", "vtypes", "clicks")
_KEY_SEP = "\x1f"   # between query and doc id in a pair key: a character no id holds


# ----------------------------------------------------------------------------------------------- ingest

def _json_ids(field: pa.ChunkedArray) -> pa.ListArray:
    """'["a", "b"]' -> ['"a"', '"b"'] (items without blanks around them; quotes stay: `_unquoted`); '[]' -> []."""
    inner = pc.utf8_slice_codeunits(pc.utf8_trim_whitespace(field.combine_chunks()), 1, -1)
    items = pc.split_pattern(inner, ",")
    empty = pc.equal(inner, "").to_numpy(zero_copy_only=False)   # "[]" splits into one empty item
    lens = np.where(empty, 0, pc.list_value_length(items).to_numpy(zero_copy_only=False))
    flat = pc.utf8_trim_whitespace(
        pc.filter(pc.list_flatten(items), pa.array(~np.repeat(empty, pc.list_value_length(items)))))
    return pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(lens)].astype(np.int32)), flat)


def _unquoted(items: pa.Array) -> pa.Array:
    """The list's items without their JSON quotes."""
    flat = pc.utf8_trim(pc.list_flatten(items), '"')
    return pa.ListArray.from_arrays(items.offsets, flat)


def _per_list(items: pa.ListArray, bad_item: np.ndarray) -> np.ndarray:
    """True for every list holding at least one item flagged in `bad_item` (aligned with the flattened items)."""
    parents = pc.list_parent_indices(items).to_numpy()
    return np.bincount(parents, weights=bad_item, minlength=len(items)) > 0


def session_hash(sessions: np.ndarray, seed: int) -> np.ndarray:
    """A seeded 64-bit hash (uint64) per session id: pandas' SipHash (Spark's split and bootstrap use
    xxhash64, so the reference draws other, equally distributed values)."""
    return pd.util.hash_array(sessions.astype(object), hash_key=f"{seed:016d}"[-16:], categorize=False)


def session_uniform(sessions: np.ndarray, seed: int) -> np.ndarray:
    """U[0, 1) per session id from `session_hash`."""
    return (session_hash(sessions, seed) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def ingest(path: str | Path, out: str | Path, *, dataset: str, max_rank: int, split_seed: int,
           ratios: Mapping[str, float]) -> dict[str, int]:
    """The per-query text log at `path` -> accepted SERPs in Parquet at `out`; counts read / accepted /
    quarantined per rule / per split."""
    bad_lines: list[int] = []

    def wrong_field_count(row) -> str:   # pyarrow calls this for a line without five fields
        bad_lines.append(row.actual_columns)
        return "skip"

    log = pcsv.read_csv(
        path,
        read_options=pcsv.ReadOptions(column_names=list(TEXT_FIELDS), block_size=1 << 26),
        parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False,
                                        invalid_row_handler=wrong_field_count),
        convert_options=pcsv.ConvertOptions(column_types={f: pa.string() for f in TEXT_FIELDS}),
    )
    n = log.num_rows
    session = pc.utf8_trim_whitespace(log["session_id"]).combine_chunks()
    query = pc.utf8_trim_whitespace(log["query_id"]).combine_chunks()
    docs = _unquoted(_json_ids(log["doc_ids"]))
    vtypes = _unquoted(_json_ids(log["vtypes"]))
    click_items = _json_ids(log["clicks"])
    clicks = pa.ListArray.from_arrays(click_items.offsets, pc.cast(pc.list_flatten(click_items), pa.int32()))

    n_docs = pc.list_value_length(docs).to_numpy(zero_copy_only=False)
    blank_doc = pc.equal(pc.list_flatten(docs), "").to_numpy(zero_copy_only=False)
    flat_clicks = pc.list_flatten(clicks).to_numpy(zero_copy_only=False)
    rules = {   # DESIGN §3's SERP rules in their order; a record is quarantined by the first it breaks
        "missing_id": (pc.equal(session, "").to_numpy(zero_copy_only=False)
                       | pc.equal(query, "").to_numpy(zero_copy_only=False) | _per_list(docs, blank_doc)),
        "empty_result_list": n_docs == 0,
        "length_mismatch": ((pc.list_value_length(clicks).to_numpy(zero_copy_only=False) != n_docs)
                            | (pc.list_value_length(vtypes).to_numpy(zero_copy_only=False) != n_docs)),
        "click_not_binary": _per_list(clicks, (flat_clicks != 0) & (flat_clicks != 1)),
        "rank_out_of_range": n_docs > max_rank,
    }
    broken = np.zeros(n, dtype=bool)
    counts = {"serps_read": n + len(bad_lines), "quarantined:unparseable": len(bad_lines)}
    for rule, hit in rules.items():
        counts[f"quarantined:{rule}"] = int((hit & ~broken).sum())
        broken |= hit

    # serp_pos: 1-based position in file order within the session (a stable sort by session keeps it)
    encoded = pc.dictionary_encode(session)
    codes = encoded.indices.to_numpy()
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
    pos = np.empty(n, dtype=np.int32)
    pos[order] = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n])) + 1
    serp_id = pc.binary_join_element_wise(session, pc.cast(pa.array(pos), pa.string()), "-")

    names = [s for s in SPLITS if ratios.get(s, 0) > 0]
    edges = np.cumsum([ratios[s] for s in names]) / sum(ratios[s] for s in names)
    uniques = encoded.dictionary.to_numpy(zero_copy_only=False)
    split_of_session = np.minimum(np.searchsorted(edges, session_uniform(uniques, split_seed), side="right"),
                                  len(names) - 1)
    split = pa.DictionaryArray.from_arrays(pa.array(split_of_session[codes], pa.int32()), pa.array(names))

    keep = pa.array(~broken)
    accepted = pa.table({
        "dataset": pa.array(np.full(n, dataset, dtype=object), pa.string()),
        "split": split.cast(pa.string()),
        "session_id": session, "serp_id": serp_id, "serp_pos": pa.array(pos),
        "query_id": query, "doc_ids": docs, "vtypes": vtypes, "clicks": clicks,
    }).filter(keep)
    pq.write_table(accepted, out)
    counts["serps_accepted"] = accepted.num_rows
    counts["serps_quarantined"] = counts["serps_read"] - accepted.num_rows
    for name, k in zip(*np.unique(split_of_session[codes][~broken], return_counts=True)):
        counts[f"serps_{names[name]}"] = int(k)
    return counts


# ---------------------------------------------------------------------------------------------- predict

@dataclass(frozen=True)
class Params:
    """A fitted model as the reference reads it: per-pair parameters in Parquet (query_id, doc_id and one
    column per qd parameter), globals and the unseen-pair prior in memory (a few hundred numbers)."""
    model: ClickModel
    qd_path: str
    glob: Mapping[str, np.ndarray]
    prior: Mapping[str, float]
    #: a qd parameter's value for an unseen pair at ranks 1..M when clicks are predicted
    unseen_by_rank: Mapping[str, Sequence[float]]


def _pair_keys(queries: pa.Array, docs: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(queries, docs, _KEY_SEP)


def _first_ranks(column: pa.ChunkedArray, mask: np.ndarray, dtype) -> np.ndarray:
    """A list column's first M elements as a (B, M) matrix, 0 where masked."""
    return padded(pc.list_slice(column.combine_chunks(), 0, mask.shape[1]), mask, dtype)


@dataclass(frozen=True)
class Padded:
    """SERPs as (B, M) arrays: truncated lists' lengths, mask, clicks, pair keys (flattened, by rank)."""
    lens: np.ndarray
    mask: np.ndarray
    clicks: np.ndarray
    keys: pa.Array

    @classmethod
    def of(cls, serps: pa.Table, M: int) -> "Padded":
        """`serps`' first M results; clicks all 0 when the table has no clicks column."""
        docs = pc.list_slice(serps["doc_ids"].combine_chunks(), 0, M)
        lens = pc.list_value_length(docs).to_numpy(zero_copy_only=False)
        mask = np.arange(M)[None, :] < lens[:, None]
        clicks = (_first_ranks(serps["clicks"], mask, np.int8) if "clicks" in serps.column_names
                  else np.zeros(mask.shape, dtype=np.int8))
        queries = pc.take(serps["query_id"].combine_chunks(), pa.array(np.repeat(np.arange(len(lens)), lens)))
        return cls(lens, mask, clicks, _pair_keys(queries, pc.list_flatten(docs)))

    def rows(self, values: np.ndarray) -> pa.ListArray:
        """(B, M) values as one list per SERP."""
        return list_array(values, self.mask, self.lens)


def predict(serps_path: str | Path, params: Params, out_dir: str | Path, M: int,
            eps: float = 1e-6) -> dict[str, float]:
    """One model's click_predictions (predictions.parquet) and relevance_scores (scores.parquet) of
    every SERP at `serps_path`; returns the LL per position of p_click_cond per split."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    serps = pq.read_table(serps_path, columns=["dataset", "split", "serp_id", "query_id", "doc_ids", "clicks"])
    padded = Padded.of(serps, M)
    model, names = params.model, list(params.model.qd_params)
    qd_table = pq.read_table(params.qd_path, columns=["query_id", "doc_id", *names])
    known = _pair_keys(qd_table["query_id"].combine_chunks(), qd_table["doc_id"].combine_chunks())
    at = pc.index_in(padded.keys, value_set=known).to_numpy(zero_copy_only=False)   # NaN: unseen in training
    seen = ~np.isnan(at)
    qd = {}
    rank_of = np.nonzero(padded.mask)[1]   # each flattened position's 0-based rank
    for p in names:
        flat = np.asarray(params.unseen_by_rank[p], dtype=np.float64)[rank_of]
        flat[seen] = qd_table[p].to_numpy()[at[seen].astype(np.int64)]
        qd[p] = np.zeros(padded.mask.shape)
        qd[p][padded.mask] = flat
    p_cond = np.asarray(model.cond_probs(qd, params.glob, padded.clicks, padded.mask), dtype=np.float64)
    p_click = np.asarray(model.click_probs(qd, params.glob, padded.mask), dtype=np.float64)
    pq.write_table(pa.table({
        "dataset": serps["dataset"], "split": serps["split"], "serp_id": serps["serp_id"],
        "clicks": padded.rows(padded.clicks.astype(np.int32)), "p_click_cond": padded.rows(p_cond),
        "p_click": padded.rows(p_click),
    }), out_dir / "predictions.parquet")
    if names:
        # every pair of the training log, and the shown pairs it never saw (scored from the prior)
        unseen = pc.unique(pc.filter(padded.keys, pa.array(~seen)))
        extra = (params.glob,) if model.relevance_uses_globals else ()   # lcm's relevance needs its weights
        score = np.concatenate([
            np.asarray(model.relevance({p: qd_table[p].to_numpy() for p in names}, *extra),
                       dtype=np.float64).reshape(-1),
            np.asarray(model.relevance({p: np.full(len(unseen), float(params.prior[p])) for p in names}, *extra),
                       dtype=np.float64).reshape(-1)])
        pq.write_table(pa.table({"pair": pa.concat_arrays([known, unseen]), "score": score}),
                       out_dir / "scores.parquet")
    # the stage's own LL per split (predict prints it)
    p = np.clip(p_cond, eps, 1 - eps)
    ll = np.where(padded.mask, np.where(padded.clicks == 1, np.log(p), np.log1p(-p)), 0.0)
    split = serps["split"].to_numpy()
    return {s: float(ll[split == s].sum() / padded.mask[split == s].sum()) for s in np.unique(split)}


# --------------------------------------------------------------------------------------------- evaluate

def ndcg_at(grades: np.ndarray, scores: np.ndarray, cutoffs: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(NDCG@k (L, len(cutoffs)), IDCG == 0 (L,)) per labelled SERP with exponential gain: grades NaN where
    unjudged (gain 0), scores NaN where unscored (ranked last); ties keep the shown order (DESIGN §5)."""
    gain = np.where(np.isnan(grades), 0.0, 2.0 ** np.maximum(np.nan_to_num(grades), 0.0) - 1.0)
    order = np.argsort(np.where(np.isnan(scores), np.inf, -scores), axis=1, kind="stable")
    discount = 1.0 / np.log2(np.arange(2, gain.shape[1] + 2))
    dcg = np.cumsum(np.take_along_axis(gain, order, axis=1) * discount, axis=1)
    idcg = np.cumsum(-np.sort(-gain, axis=1) * discount, axis=1)
    at = np.minimum(np.asarray(cutoffs), gain.shape[1]) - 1
    zero = idcg[:, -1] <= 0
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(zero[:, None], 0.0, dcg[:, at] / idcg[:, at]), zero


def _click_stats(pred: pa.Table, M: int, eps: float) -> np.ndarray:
    """Per prediction row: n_serps, clipped_cond, clipped_uncond, n_t, ln_cond_t, ln_uncond_t (t = 1..M)."""
    lens = np.minimum(pc.list_value_length(pred["p_click_cond"].combine_chunks()).to_numpy(zero_copy_only=False), M)
    mask = np.arange(M)[None, :] < lens[:, None]
    clicks = _first_ranks(pred["clicks"], mask, np.int8)
    clipped, ln = [], []
    for column in ("p_click_cond", "p_click"):
        p = _first_ranks(pred[column], mask, np.float64)
        clip = np.clip(p, eps, 1 - eps)
        clipped.append(((clip != p) & mask).sum(axis=1, keepdims=True))
        ln.append(np.where(mask, np.where(clicks == 1, np.log(clip), np.log1p(-clip)), 0.0))
    return np.hstack([np.ones((len(lens), 1)), *clipped, mask, *ln])


def _sum_by(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct keys ascending, the rows of `values` summed per key)."""
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    return k[starts], np.add.reduceat(values[order], starts, axis=0)


def _replicate_sums(stats: np.ndarray, hashes: np.ndarray, replicates: int, chunk: int = 1 << 16) -> np.ndarray:
    """(replicates + 1, K): Σ_sessions w_r(session) · stats, session rows of `stats`, in bounded chunks."""
    out = np.zeros((replicates + 1, stats.shape[1]))
    for lo in range(0, len(stats), chunk):
        w = numpy_poisson_weights(hashes[lo:lo + chunk].view(np.int64), replicates).astype(np.float64)
        out += w.T @ stats[lo:lo + chunk]
    return out


def _metrics(sums: np.ndarray, M: int, cutoffs: Sequence[int], labelled: bool) -> dict[tuple, np.ndarray]:
    """{(metric, cutoff): value per replicate} from the replicate sums (`_click_stats`' columns, then
    n_labelled and the NDCG@k sums)."""
    n_t, cond, uncond = (sums[:, 3 + i * M: 3 + (i + 1) * M] for i in range(3))
    observed = n_t[0] > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        out = {("LL", None): cond.sum(axis=1) / n_t.sum(axis=1)}
        for name, ln in (("PPL", uncond), ("PPL_cond", cond)):
            ppl = np.exp(-ln / n_t)
            out.update({(name, t + 1): ppl[:, t] for t in np.flatnonzero(observed)})
            out[(name, None)] = ppl[:, observed].mean(axis=1)
        if labelled:
            n = sums[:, 3 + 3 * M]
            out.update({("NDCG", k): sums[:, 4 + 3 * M + i] / n for i, k in enumerate(cutoffs)})
    return out


def evaluate(predictions: Mapping[str, str | Path], serps_path: str | Path, labels_path: str | Path | None,
             scores: Mapping[str, str | Path], opts: MetricOptions, splits: Sequence[str],
             reference_model: str | None = None) -> list[dict]:
    """Metric rows (model, split, metric, cutoff, value, ci_low, ci_high) of every model's predictions
    (`predict`'s Parquet) of `splits` on the SERPs at `serps_path`; NDCG for the models in `scores` from
    the labels tied to SERPs (labels_path: serp_id, rank, relevance). `opts` as the stage's (the evaluate
    config); NDCG here is exponential gain over each SERP's own grades only."""
    if (opts.ndcg_gain, opts.ndcg_ideal) != ("exponential", "serp"):
        raise ValueError(f"the reference computes NDCG with exponential gain and the SERP's own ideal order, "
                         f"not ndcg_gain={opts.ndcg_gain!r}, ndcg_ideal={opts.ndcg_ideal!r}")
    M = opts.max_rank
    serps = pq.read_table(serps_path, columns=["serp_id", "session_id", "query_id", "doc_ids"])
    serp_ids = serps["serp_id"].combine_chunks()
    sessions = pc.dictionary_encode(serps["session_id"].combine_chunks())
    session_of_serp = sessions.indices.to_numpy()
    hashes = session_hash(sessions.dictionary.to_numpy(zero_copy_only=False), opts.seed)
    graded = None
    if labels_path is not None:
        labels = pq.read_table(labels_path, columns=["serp_id", "rank", "relevance"]).filter(
            pc.is_valid(pc.field("serp_id")))
        at = pc.index_in(labels["serp_id"], value_set=serp_ids).to_numpy(zero_copy_only=False)
        rank = labels["rank"].to_numpy(zero_copy_only=False)
        ok = ~np.isnan(at) & (rank >= 1) & (rank <= M)
        rows, where = np.unique(at[ok].astype(np.int64), return_inverse=True)
        grades = np.full((len(rows), M), np.nan)
        rel = labels["relevance"].to_numpy(zero_copy_only=False)[ok].astype(np.float64)
        by_grade = np.argsort(rel, kind="stable")   # a doc graded twice keeps its best grade: the last write
        grades[where[by_grade], (rank[ok] - 1)[by_grade]] = rel[by_grade]
        graded = (rows, grades, Padded.of(serps.take(pa.array(rows)), M))

    rows_out, per_model = [], {}
    for model, path in predictions.items():
        pred = pq.read_table(path, columns=["split", "serp_id", "clicks", "p_click_cond", "p_click"],
                             filters=[("split", "in", list(splits))])
        serp_row = pc.index_in(pred["serp_id"], value_set=serp_ids).to_numpy(zero_copy_only=False).astype(np.int64)
        stats = _click_stats(pred, M, opts.eps)
        with_ndcg = graded is not None and model in scores
        if with_ndcg:
            rows, grades, shown = graded
            table = pq.read_table(scores[model])
            at = pc.index_in(shown.keys, value_set=table["pair"].combine_chunks()).to_numpy(zero_copy_only=False)
            flat = np.full(len(at), np.nan)
            flat[~np.isnan(at)] = table["score"].to_numpy()[at[~np.isnan(at)].astype(np.int64)]
            score = np.full(shown.mask.shape, np.nan)
            score[shown.mask] = flat
            ndcg, zero = ndcg_at(grades, score, opts.ndcg_cutoffs)
            extra = np.zeros((len(serps), 1 + len(opts.ndcg_cutoffs)))
            extra[rows, 0], extra[rows, 1:] = ~zero, ndcg
            stats = np.hstack([stats, extra[serp_row]])
        split = pred["split"].to_numpy(zero_copy_only=False)
        session = session_of_serp[serp_row]
        for s in sorted(set(split)):
            # per session of the split, in session order: the bootstrap's unit
            sel = split == s
            uniq, per_session = _sum_by(session[sel], stats[sel])
            sums = _replicate_sums(per_session, hashes[uniq], opts.replicates)
            reps = _metrics(sums, M, opts.ndcg_cutoffs, with_ndcg and sums[0, 3 + 3 * M] > 0)
            per_model[model, s] = reps
            for (metric, cutoff), values in reps.items():
                rows_out.append(_row(model, s, metric, cutoff, values, opts.confidence))
    if reference_model:
        for (model, s), reps in per_model.items():
            ref = per_model.get((reference_model, s))
            if model == reference_model or ref is None:
                continue
            for (metric, cutoff), values in reps.items():
                if (metric, cutoff) in ref and (cutoff is None or metric == "NDCG"):
                    rows_out.append(_row(model, s, f"{metric}_diff", cutoff, values - ref[metric, cutoff],
                                         opts.confidence))
    return rows_out


def _row(model: str, split: str, metric: str, cutoff: int | None, values: np.ndarray, confidence: float) -> dict:
    low, high = percentile_interval(values[1:], confidence)
    return {"model": model, "split": split, "metric": metric, "cutoff": cutoff, "value": float(values[0]),
            "ci_low": low, "ci_high": high}


# ------------------------------------------------------------- inputs, exported from the tables (untimed)

def export_text(serps: DataFrame, directory: str | Path) -> str:
    """`serps` as one per-query text file (graphcm layout), each session's SERPs in serp_pos order; its path."""
    line = F.concat_ws("\t", "session_id", "query_id", F.to_json("doc_ids"), F.to_json("vtypes"), F.to_json("clicks"))
    (serps.repartition(1).sortWithinPartitions("session_id", "serp_pos").select(line.alias("value"))
     .write.mode("overwrite").text(str(directory)))
    [part] = Path(directory).glob("part-*")
    return str(part)


def export_parquet(rows: DataFrame, directory: str | Path) -> str:
    rows.write.mode("overwrite").parquet(str(directory))
    return str(directory)


def export_params(fitted: FittedModel, directory: str | Path) -> Params:
    cols = ["query_id", "doc_id", *fitted.model.qd_params]
    unseen = {p: fitted.unseen_at_ranks(p) for p in fitted.model.qd_params}
    return Params(fitted.model, export_parquet(fitted.qd.select(*cols), directory), fitted.glob, fitted.prior,
                  unseen)


def run_params(params: DataFrame, cfg: AppConfig, run_id: str, directory: str | Path) -> dict[str, Params]:
    """{model: its exported parameters} of every model the predict stage predicts for run ``run_id``: the
    fitted models (``fit.models``) and, on a simulated dataset, the true model as `truth` (the parameters the
    log was drawn from, `synthetic.load_truth`), each under ``directory``/params-<model>."""
    M = cfg.fit.max_rank
    fitted = {name: FittedModel.from_rows(params, get_model(name), run_id, M) for name in cfg.fit.models}
    truth, _ = load_truth(params, cfg)
    if truth is not None:
        fitted[TRUTH_MODEL] = truth
    return {name: export_params(f, Path(directory) / f"params-{name}") for name, f in fitted.items()}
