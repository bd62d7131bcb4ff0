"""Progress for people, logs for machines: a fit logs one INFO line per model and every pass at DEBUG; at a
terminal (stderr a TTY, nobody's scheduler) the stages and the EM passes show as bars, anywhere else
nothing but the plain lines."""

from __future__ import annotations

import io
import logging
import re

import pytest
from pyspark.sql import functions as F

from clickeval_spark import cli, progress
from clickeval_spark.em.blocks import pack_log, pack_serps
from clickeval_spark.em.driver import fit, fit_groups
from clickeval_spark.models import get_model
from tests.em.logs import SERPS_SCHEMA, Log, fit_values

ITERATIONS = 3
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal(io.StringIO):
    """What a terminal sees: a stream whose isatty() is True."""

    def isatty(self) -> bool:
        return True


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def at(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


@pytest.fixture
def logger():
    """A logger of its own at INFO, as the CLI's are without --verbose, and what it was told."""
    log = logging.getLogger("tests.progress")
    log.setLevel(logging.INFO)
    log.propagate = False
    said = Records()
    log.addHandler(said)
    yield log, said
    log.removeHandler(said)
    log.setLevel(logging.NOTSET)
    log.propagate = True


@pytest.fixture(scope="module")
def small(spark):
    """PBM's log, 400 SERPs of 30 queries, its last quarter held out to choose a prior strength on."""
    model = get_model("pbm")
    log = Log(model, n_serps=400, M=4, seed=11)
    train = spark.createDataFrame(log.rows[:300], SERPS_SCHEMA)
    valid = spark.createDataFrame(log.rows[300:], SERPS_SCHEMA)
    packed = pack_serps(train, max_rank=4, held_out=valid)
    yield model, log, packed
    packed.unpersist()


# ---------------------------------------------------------------------------
# the logs: one INFO line per fit, every pass at DEBUG
# ---------------------------------------------------------------------------

def test_a_fit_logs_one_info_line_per_model_and_every_pass_at_debug(small, logger):
    model, _, packed = small
    log, said = logger
    calls = []
    fitted = fit(packed, model, iterations=ITERATIONS, tol=None, logger=log, k_grid=(1.0, 8.0),
                 on_pass=lambda *a: calls.append(a))
    assert said.at(logging.DEBUG) == []
    [line] = said.at(logging.INFO)
    chosen = fitted.selection["chosen_k"]
    assert re.fullmatch(rf"pbm: {ITERATIONS} passes, prior (k=\S+|eb)( seen->rank)? chosen by valid LL, "
                        r"(resident EM stage: \d+ tasks up|a Spark job per pass), \d+\.\d s", line), line
    assert (f"k={chosen:g}" if chosen != "eb" else "prior eb") in line
    # the progress hook: once per pass, up to the iteration cap
    assert calls == [(it, ITERATIONS, "") for it in range(1, ITERATIONS + 1)]

    # the same fit at DEBUG: every candidate's every pass, the engine, the scoring pass, the selection
    log.setLevel(logging.DEBUG)
    again = fit(packed, model, iterations=ITERATIONS, tol=None, logger=log, k_grid=(1.0, 8.0))
    debug = said.at(logging.DEBUG)
    n_cands = len(fitted.selection["grid"])
    assert sum(" iteration " in m for m in debug) == n_cands * (ITERATIONS + 1), debug
    assert any(m.startswith("pbm final pass: ") for m in debug), debug
    assert any(m.startswith("pbm prior strength by valid LL per position: ") for m in debug), debug
    assert len(said.at(logging.INFO)) == 2
    # logging changes no bit of the fit
    assert fit_values(again) == fit_values(fitted)


def test_grouped_fits_log_one_line_for_all_their_groups(spark, logger):
    model = get_model("dcm")
    log, said = logger
    # two groups of one packed log (as the surrogate's real log and a generator's sequences): even and odd SERPs
    serps = Log(model, n_serps=240, M=4, seed=5).df(spark)
    packed = pack_log(serps.select("serp_id", "query_id", F.slice("doc_ids", 1, 4).alias("doc_ids"),
                                   F.slice("clicks", 1, 4).alias("clicks"), F.lit(False).alias("held_out"),
                                   (F.substring("serp_id", -1, 1).cast("int") % 2).alias("group")), 4)
    try:
        fits = fit_groups(packed, model, iterations=2, tol=None, logger=log, select_on_held_out=False)
    finally:
        packed.unpersist()
    assert len(fits) == 2
    [line] = said.at(logging.INFO)
    assert line.startswith("dcm: 2 fits, 2 passes, prior "), line


# ---------------------------------------------------------------------------
# where bars go: a terminal only
# ---------------------------------------------------------------------------

def test_interactive_is_a_terminal_that_no_scheduler_runs():
    assert progress.interactive(Terminal(), {})
    assert progress.interactive(Terminal(), {"TERM": "xterm-256color", "CI": ""})
    assert not progress.interactive(io.StringIO(), {})                      # a pipe, a file
    assert not progress.interactive(Terminal(), {"CI": "true"})
    assert not progress.interactive(Terminal(), {"AIRFLOW_CTX_DAG_ID": "clickeval_daily"})
    assert not progress.interactive(Terminal(), {"PYSPARK_GATEWAY_PORT": "40123"})   # under spark-submit
    assert not progress.interactive(Terminal(), {"TERM": "dumb"})


def test_the_session_shows_bars_at_a_terminal_only():
    assert isinstance(progress.current(), progress.Plain) and not isinstance(progress.current(), progress.Bars)
    with progress.session(stream=Terminal(), environ={}) as shown:
        assert isinstance(shown, progress.Bars) and progress.current() is shown
    assert not isinstance(progress.current(), progress.Bars)   # put back
    for kwargs in ({"stream": io.StringIO(), "environ": {}}, {"stream": Terminal(), "environ": {"CI": "1"}},
                   {"stream": Terminal(), "environ": {}, "verbose": True}):
        with progress.session(**kwargs) as shown:
            assert type(shown) is progress.Plain, kwargs


def test_a_terminal_sees_a_bar_per_stage_and_per_fit_advancing_per_pass(small, logger):
    model, _, packed = small
    log, said = logger
    screen = Terminal()
    above = logging.getLogger("tests.progress.above")
    above.addHandler(progress.StderrHandler())
    above.propagate = False
    try:
        with progress.session(stream=screen, environ={}) as bars:
            with bars.pipeline(["ingest", "fit"]):
                with bars.stage("ingest"):
                    pass
                with bars.stage("fit"):
                    with bars.em("pbm") as on_pass:
                        fit(packed, model, iterations=ITERATIONS, tol=None, logger=log, k_grid=(1.0,),
                            on_pass=on_pass)
                    above.warning("a log line while the bars show")
    finally:
        above.handlers.clear()
        above.propagate = True
    text = screen.getvalue()
    assert ANSI.search(text), text                                   # cursor moves: a live display
    lines = ANSI.sub("", text).replace("\r", "\n").splitlines()
    assert any(re.search(rf"pbm +━+ +{ITERATIONS}/{ITERATIONS} passes", line) for line in lines), lines
    assert any(re.search(r"run +[━╺╸ ]+ +1/2 stages", line) for line in lines), lines
    assert any(re.search(r"fit +[━╺╸ ]+ +\d:\d\d:\d\d", line) for line in lines), lines
    # a log line goes above the bars, whole, through the display's proxy
    assert "a log line while the bars show" in lines
    # the INFO line of the fit is still one
    assert len(said.at(logging.INFO)) == 1


def test_plain_progress_draws_nothing(small, logger):
    model, _, packed = small
    log, said = logger
    out = io.StringIO()
    with progress.session(stream=out, environ={}) as plain:
        with plain.pipeline(["fit"]), plain.stage("fit"), plain.em("pbm") as on_pass:
            fit(packed, model, iterations=2, tol=None, logger=log, k_grid=(1.0,), on_pass=on_pass)
    assert out.getvalue() == ""
    [line] = said.at(logging.INFO)
    assert line.startswith("pbm: 2 passes, ")


# ---------------------------------------------------------------------------
# the CLI: -v / --verbose
# ---------------------------------------------------------------------------

def test_verbose_puts_the_project_loggers_at_debug_while_the_command_runs():
    args = cli.build_parser().parse_args(["fit", "-v"])
    assert args.verbose
    assert not cli.build_parser().parse_args(["fit"]).verbose
    clickeval = logging.getLogger("clickeval")
    before = clickeval.level
    with cli.project_logs_at(logging.DEBUG):
        assert clickeval.isEnabledFor(logging.DEBUG)
        assert logging.getLogger("clickeval_spark.em.driver").isEnabledFor(logging.DEBUG)
        assert not logging.getLogger("numba").isEnabledFor(logging.DEBUG)   # not every library's
    assert clickeval.level == before
