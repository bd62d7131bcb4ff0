"""Ingestion: any source format -> validated, split serps and relevance_labels frames and their quarantine,
with the checks that must pass before anything is written (stages/ingest.py writes them)."""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from operator import itemgetter
from typing import Callable, Hashable, Iterable, Iterator

from pyspark.sql import DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F

from clickeval_spark.config import IngestConfig, names_day
from clickeval_spark.errors import ConfigError, InputError
from clickeval_spark.session import cache_level
from clickeval_spark.sources import canonical, per_query_text, tiangong, yandex
from clickeval_spark.sources.files import ensure_readable, input_files, same_file, shown
from clickeval_spark.splits import assign_splits
from clickeval_spark.validation import accepted_serps, check_labels, check_serps, quarantine_rows


@dataclass(frozen=True)
class IngestOutput:
    serps: DataFrame
    labels: DataFrame | None
    quarantine: DataFrame
    counts: dict[str, int]
    # {(target, rule): records quarantined}: serps and relevance_labels
    rule_counts: dict[tuple[str, str], int]
    # the (dataset, log_date) slices the write replaces (None: the undated slice)
    log_dates: tuple[date | None, ...] = (None,)
    label_log_dates: tuple[date | None, ...] = (None,)
    files: tuple[str, ...] = ()   # the files records were read from (SERPs', then labels'), as messages name them
    kept: tuple[DataFrame, ...] = ()   # the persisted checked records (and labels): `release` frees them

    def release(self) -> None:
        """Free what the ingest persisted (its checked records): in one session (`clickeval run`) it would
        otherwise stay cached through every later stage."""
        for df in self.kept:
            df.unpersist()


def parse_serps(spark: SparkSession, cfg: IngestConfig) -> DataFrame:
    """The configured source as parsed SERP records (sources.parsed.PARSED_SERPS)."""
    require_days(spark, cfg.log_date, zip(cfg.paths.values(), cfg.input_paths.values()))
    if cfg.format == "per_query_text":
        return per_query_text.read_serps(spark, cfg.input_paths, cfg.dataset, cfg.text_variant)
    single = _single_path(cfg)
    if cfg.format == "tiangong_xml":
        return tiangong.read_serps(spark, single, cfg.dataset)
    if cfg.format == "yandex":
        return yandex.read_serps(spark, single, cfg.dataset)
    if cfg.format in ("parquet", "delta"):
        return canonical.read_serps(spark, single, cfg.dataset, cfg.format)
    raise ConfigError(f"ingest.format: parse_serps does not read format {cfg.format!r}")  # synthetic has its own path


def parse_labels(spark: SparkSession, cfg: IngestConfig) -> DataFrame | None:
    if cfg.labels is None:
        return None
    require_days(spark, cfg.log_date, [(cfg.labels, cfg.input_labels)])
    labels = cfg.input_labels
    if cfg.format == "per_query_text":
        return per_query_text.read_labels(spark, labels, cfg.dataset, cfg.text_variant)
    if cfg.format == "tiangong_xml":
        return tiangong.read_labels(spark, labels, cfg.dataset, cfg.label_query_prefix, cfg.label_doc_prefix)
    if cfg.format == "yandex":
        return yandex.read_labels(spark, labels, cfg.dataset)
    raise ConfigError(f"ingest.labels is not supported for format {cfg.format!r}")


# what one record of a file looks like, per format: a file that gives none breaks rule empty_input
SERP_RECORDS = {
    "per_query_text": "tab-separated lines 'sid, qid, [docs], [vtypes], [clicks]'",
    "tiangong_xml": "<session num=...> elements",
    "yandex": "query lines 'SessionID TimePassed Q QueryID RegionID URL...' and click lines",
}
LABEL_RECORDS = {
    "per_query_text": "tab-separated lines 'sid, qid, [docs], [vtypes], [clicks], [relevances]'",
    "tiangong_xml": "lines 'id session query doc relevance'",
    "yandex": "lines 'QueryID RegionID URLID Relevance'",
}
_FAILED_READ = re.compile(r"FAILED_READ_FILE[^\]]*\]\s*Encountered error while reading file (.+?)\.?\s*(?:SQLSTATE:|$)",
                          re.M)


@contextmanager
def reading_inputs() -> Iterator[None]:
    """Spark reads input files lazily, in the first action: a file it cannot decode (a corrupt .gz, a
    file cut short) fails there, deep inside an executor. Report it as one line naming the file."""
    try:
        yield
    except Exception as exc:
        match = _FAILED_READ.search(str(exc))
        if not match:
            raise
        raise InputError(f"{shown(match.group(1))}: breaks rule unreadable_file: Spark cannot read it "
                         f"({_root_cause(exc)})") from None


def _root_cause(exc: Exception) -> str:
    cause = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    last = None
    while cause is not None:
        last = cause
        try:
            cause = cause.getCause()
        except Exception:  # not a Java throwable
            break
    text = str(last.toString()) if last is not None and hasattr(last, "toString") else str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def require_days(spark: SparkSession, log_date: date | None, inputs: Iterable[tuple[str, str]]) -> None:
    """Every (configured, filled) input location that names its day ({log_date}) exists, checked before
    any read: a missing day fails in one line naming the location expected (a scheduler retries, then
    alerts), not with Spark's error from inside the read."""
    for configured, location in inputs:
        if names_day(configured):
            ensure_readable(spark, location,
                            missing=f"no input for log_date {log_date}: {shown(location)} does not exist")


def require_records(spark: SparkSession, paths: list[str], records_per_source: dict[str, int], what: str) -> None:
    """Every input file gave at least one record (line, <session>, ...), else fail naming it: an empty
    or wholly unreadable file, or a folder without files (a day's folder that came empty), would otherwise
    pass as an input with nothing in it."""
    seen = {same_file(source) for source, n in records_per_source.items() if n}
    for path in paths:
        files = input_files(spark, path)
        if not files:
            raise InputError(f"{shown(path)}: breaks rule empty_input: no input file in it (expected {what})")
        for file in files:
            if same_file(file) not in seen:
                raise InputError(f"{shown(file)}: breaks rule empty_input: no records in it (expected {what})")


def _read_files(records_per_source: dict[str, int]) -> list[str]:
    """The files records came from, as messages name them (for `runs.details`)."""
    return sorted({shown(source) for source in records_per_source if source})


def _single_path(cfg: IngestConfig) -> str:
    if set(cfg.paths) != {"all"}:
        raise ConfigError(f"ingest.paths: format {cfg.format!r} reads one input, give it as 'all'")
    return cfg.input_paths["all"]


def attach_labels_to_serps(labels: DataFrame, serps: DataFrame) -> DataFrame:
    """Tie session-level labels (serp_id null, session_id known) to the SERP that shows the doc.

    TianGong-ST labels name a session and a query; the SERP is that session's
    first interaction with the query showing the document. Labels that match no
    SERP keep serp_id null and are counted, not dropped.
    """
    shown = serps.select(
        "session_id", "query_id", "serp_id", "serp_pos", "log_date", F.posexplode("doc_ids").alias("pos", "doc_id"),
    )
    candidates = labels.where(F.col("serp_id").isNull() & F.col("session_id").isNotNull()).join(
        shown.withColumnRenamed("serp_id", "matched_serp_id"),
        on=["session_id", "query_id", "doc_id"],
        how="left",
    )
    first = Window.partitionBy("dataset", "session_id", "query_id", "doc_id").orderBy(
        F.col("serp_pos").asc_nulls_last(), "pos"
    )
    resolved = (
        candidates.withColumn("k", F.row_number().over(first)).where("k = 1")
        .select("dataset", "query_id", "doc_id", "relevance",
                F.col("matched_serp_id").alias("serp_id"),
                (F.col("pos") + 1).cast("int").alias("rank"), "session_id", "log_date")
    )
    # a label tied to a SERP of this ingest takes its day; serp_id is unique among accepted SERPs
    untouched = labels.where(F.col("serp_id").isNotNull() | F.col("session_id").isNull()).join(
        serps.select("dataset", "serp_id", "log_date"), on=["dataset", "serp_id"], how="left")
    return untouched.unionByName(resolved)


def run_ingest(spark: SparkSession, cfg: IngestConfig, serps_parsed: DataFrame,
               labels_parsed: DataFrame | None, run_id: str) -> IngestOutput:
    """Validate parsed records and split the sessions; returns the frames to write and their counts.

    The checked records (every input record with its rule) are persisted once, since the counts and both
    outputs read them. Input files are read here, in the first count: a file that cannot be read, or that
    holds no record, fails the job with an InputError naming it.
    """
    parsed = assign_splits(with_log_date(serps_parsed, cfg.log_date), cfg.split)
    numbered_by_reader = cfg.format == "per_query_text"   # lines and positions counted within file splits
    # a daily input holds its day: a record whose own time (TianGong-ST starttime, a canonical log_date) gives
    # another day is quarantined (rule other_day), never written, so the ingest replaces its day's slice only
    checked = check_serps(parsed, max_rank=cfg.max_rank, keep=cache_level(spark), numbered_ids=numbered_by_reader,
                          day=cfg.log_date if cfg.daily else None)
    accepted, kept = checked.accepted, [checked.ruled]
    quarantine = checked.quarantined
    with reading_inputs():
        # one job fills the cache and counts what the checks need (records per file, per rule, the days)
        tally = _tally(checked.ruled, day="log_date", per_split=numbered_by_reader)
        per_source = _summed(tally, itemgetter("source"))
        if cfg.format in SERP_RECORDS:
            require_records(spark, list(cfg.input_paths.values()), per_source, SERP_RECORDS[cfg.format])
        files = _read_files(per_source)
        # the days this ingest replaces: a handful of values (one per day of the input), never per-SERP data
        log_dates = tuple(sorted({r["day"] for r in tally if r["rule"] is None},
                                 key=lambda d: (d is None, d or date.min))) or (cfg.log_date,)
        if numbered_by_reader:
            accepted = accepted_serps(per_query_text.settled_positions(checked.ruled))
            lines_per_split = _summed(tally, itemgetter("source", "block_start"))
            quarantined = checked.ruled.where(F.col("rule").isNotNull())
            quarantine = quarantine_rows(per_query_text.settled_lines(quarantined, lines_per_split), "serps")
    serps = accepted.withColumn("ingest_run_id", F.lit(run_id))
    counts = {"serps_read": sum(per_source.values())}
    rule_counts = _per_rule(tally, "serps")

    labels = None
    if labels_parsed is not None:
        labels_parsed = labels_parsed.persist(cache_level(spark))
        label_check = check_labels(labels_parsed)
        labels = with_log_date(attach_labels_to_serps(label_check.accepted, accepted), cfg.log_date).withColumn(
            "ingest_run_id", F.lit(run_id)
        )
        quarantine = quarantine.unionByName(label_check.quarantined)
        with reading_inputs():
            tally = _tally(label_check.ruled)
            per_source = _summed(tally, itemgetter("source"))
            if cfg.format in LABEL_RECORDS:
                require_records(spark, [cfg.input_labels], per_source, LABEL_RECORDS[cfg.format])
            files += _read_files(per_source)
            counts["labels_read"] = sum(per_source.values())
            counts["labels_accepted"] = sum(r["n"] for r in tally if r["rule"] is None)
            rule_counts.update(_per_rule(tally, "relevance_labels"))

    return IngestOutput(serps=serps, labels=labels, quarantine=quarantine.withColumn("run_id", F.lit(run_id)),
                        counts=counts, rule_counts=rule_counts, log_dates=log_dates, files=tuple(files),
                        # labels fall in the SERPs' days or, untied, in ingest.log_date's slice
                        label_log_dates=tuple(dict.fromkeys((*log_dates, cfg.log_date))),
                        kept=tuple(kept) if labels_parsed is None else (*kept, labels_parsed))


def _tally(ruled: DataFrame, day: str | None = None, per_split: bool = False) -> list[Row]:
    """Records per (source file, rule broken: null for accepted, the accepted record's `day`), and per file
    split (`block_start`) with `per_split`: a few rows per input file (or split) and rule, never per-record
    data."""
    accepted_day = F.when(F.col("rule").isNull(), F.col(day)) if day else F.lit(None)
    return (ruled.groupBy("source", *(["block_start"] if per_split else []), "rule", accepted_day.alias("day"))
            .agg(F.count(F.lit(1)).alias("n")).collect())


def _summed(tally: list[Row], key: Callable[[Row], Hashable | None]) -> dict:
    """The tally's record counts summed by `key` of each row (per file, per file split, per rule); rows whose
    key is None are left out."""
    sums: dict = {}
    for r in tally:
        k = key(r)
        if k is not None:
            sums[k] = sums.get(k, 0) + r["n"]
    return sums


def _per_rule(tally: list[Row], target: str) -> dict[tuple[str, str], int]:
    """{(target, rule): records quarantined} (`quarantine_check`'s counts)."""
    return _summed(tally, lambda r: None if r["rule"] is None else (target, r["rule"]))


def with_log_date(records: DataFrame, log_date: date | None) -> DataFrame:
    """Records whose source gives no day take ingest.log_date (null when unset: undated)."""
    return records.withColumn("log_date", F.coalesce(F.col("log_date"), F.lit(log_date).cast("date")))


def quarantine_check(out: IngestOutput, cfg: IngestConfig) -> tuple[dict[str, int], str | None]:
    """Counts per target before any write, and why the ingest must stop (None: it may write).

    An input whose records of serps (or of labels) are all quarantined, or more than
    `ingest.max_quarantine_share` of them, must not replace a dataset's slice: a binary or
    mostly broken file would otherwise leave the dataset empty or gutted with exit 0. The counts per
    rule are `run_ingest`'s (`IngestOutput.rule_counts`): no Spark job here.
    """
    targets = [("serps", "serps", out.counts["serps_read"], list(cfg.input_paths.values()) or ["synthetic log"])]
    if "labels_read" in out.counts:
        targets.append(("relevance_labels", "labels", out.counts["labels_read"],
                        [cfg.input_labels or "synthetic labels"]))
    counts, refusals = {}, []
    for target, key, read, files in targets:
        rules = sorted(((n, rule) for (t, rule), n in out.rule_counts.items() if t == target),
                       key=lambda x: (-x[0], x[1]))
        quarantined = sum(n for n, _ in rules)
        accepted = read - quarantined
        counts[f"{key}_quarantined"] = quarantined
        share = quarantined / read if read else 1.0
        if accepted > 0 and share <= cfg.max_quarantine_share:
            continue
        why = ("no record accepted" if accepted <= 0 else
               f"{share:.1%} quarantined > ingest.max_quarantine_share {cfg.max_quarantine_share:g}")
        top = ", ".join(f"{rule} {n}" for n, rule in rules[:3]) or "none"
        refusals.append(f"{', '.join(shown(f) for f in files)}: {target} read {read}, accepted {accepted}, "
                        f"quarantined {quarantined} ({why}; most frequent rules: {top})")
    if not refusals:
        return counts, None
    return counts, "ingest refused, nothing written: " + "; ".join(refusals)
