"""Progress for people, logs for machines: what a command shows while its stages run.

At an interactive terminal (stderr a TTY, not under CI, Airflow or spark-submit, not --verbose) `Bars` draws
a bar for the pipeline, one for the running stage and one per EM fit, advancing per pass; the lines the
stages print and the log records go above them, and the bars are gone when the command ends. Anywhere else
`Plain` draws nothing: the stages' own lines (one when a stage starts, one when it ends, one per fitted
model) and the fits' INFO lines are the progress.

The stages ask `current()` for the reporter and hand the EM loop a plain callback (`em`); the EM code knows
nothing of this module. `session` picks the reporter for a command and makes it current.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

#: after every EM pass: (passes done, the iteration cap, "" on the fit's log or "sample" on a selection sample)
OnPass = Callable[[int, int, str], None]

#: set under a CI runner, an Airflow task, or spark-submit (PYSPARK_GATEWAY_PORT: the driver's Python that
#: spark-submit started, whose JVM writes to the same stderr): no bars there
UNATTENDED = ("CI", "AIRFLOW_CTX_DAG_ID", "PYSPARK_GATEWAY_PORT")


def interactive(stream: TextIO | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether someone watches ``stream`` (stderr by default): a TTY, not a dumb one, and none of `UNATTENDED`."""
    stream = sys.stderr if stream is None else stream
    environ = os.environ if environ is None else environ
    isatty = getattr(stream, "isatty", None)
    return (bool(isatty and isatty()) and environ.get("TERM") != "dumb"
            and not any(environ.get(name) for name in UNATTENDED))


def _ignore(done: int, total: int, phase: str) -> None:
    pass


class Plain:
    """No display: the stages' lines and the log's are the progress (a scheduler's log, a pipe, a file)."""

    @contextmanager
    def pipeline(self, stages: list[str]) -> Iterator[None]:
        yield

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        yield

    @contextmanager
    def em(self, label: str) -> Iterator[OnPass]:
        """The callback for one EM fit's passes (`em.fit`'s ``on_pass``)."""
        yield _ignore

    @contextmanager
    def shown(self) -> Iterator[None]:
        yield


class Bars(Plain):
    """rich progress bars on ``console``: the pipeline's stages, the running stage, the running fit's passes."""

    def __init__(self, console: Console, redirect_stdout: bool = True):
        self.bars = Progress(SpinnerColumn(), TextColumn("{task.description:<22}"), BarColumn(bar_width=32),
                             TextColumn("{task.fields[note]:<13}"), TimeElapsedColumn(), console=console,
                             transient=True, redirect_stdout=redirect_stdout, redirect_stderr=True)
        self._run: TaskID | None = None
        self._stages = (0, 0)   # the pipeline's (stages done, stages)

    @contextmanager
    def shown(self) -> Iterator[None]:
        """The live display, for the command's stages; cleared when they end (or fail)."""
        with self.bars:
            yield

    @contextmanager
    def pipeline(self, stages: list[str]) -> Iterator[None]:
        self._stages = (0, len(stages))
        self._run = self.bars.add_task("run", total=len(stages), note=f"0/{len(stages)} stages")
        try:
            yield
        finally:
            self.bars.remove_task(self._run)
            self._run = None
            self.bars.refresh()   # gone before the pipeline's summary prints

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        task = self.bars.add_task(name, total=None, note="")
        try:
            yield
        finally:
            self.bars.remove_task(task)
            if self._run is not None:
                done, n = self._stages = self._stages[0] + 1, self._stages[1]
                self.bars.update(self._run, completed=done, note=f"{done}/{n} stages")
            self.bars.refresh()

    @contextmanager
    def em(self, label: str) -> Iterator[OnPass]:
        task = self.bars.add_task(f"  {label}", total=None, note="")

        def on_pass(done: int, total: int, phase: str) -> None:
            self.bars.update(task, completed=done, total=total, note=f"{done}/{total} passes",
                             description=f"  {label}" + (f" ({phase})" if phase else ""))
            self.bars.refresh()

        try:
            yield on_pass
        finally:
            self.bars.remove_task(task)
            self.bars.refresh()


_current: Plain = Plain()


def current() -> Plain:
    """The reporter of the running command (`Plain` outside `session`: a notebook, a test, a library call)."""
    return _current


@contextmanager
def session(verbose: bool = False, stream: TextIO | None = None,
            environ: Mapping[str, str] | None = None) -> Iterator[Plain]:
    """The command's reporter, current and shown while the block runs: `Bars` when `interactive` and not
    ``verbose`` (whose DEBUG lines and JVM output would scroll the bars away), else `Plain`."""
    global _current
    stream = sys.stderr if stream is None else stream
    if interactive(stream, environ) and not verbose:
        # soft_wrap: a line printed above the bars (a wide metrics table) is left for the terminal to wrap
        reporter: Plain = Bars(Console(file=stream, soft_wrap=True), redirect_stdout=sys.stdout.isatty())
    else:
        reporter = Plain()
    before, _current = _current, reporter
    try:
        with reporter.shown():
            yield reporter
    finally:
        _current = before


class StderrHandler(logging.StreamHandler):
    """A StreamHandler on whatever sys.stderr is when a record comes, not when the handler was made: under
    `Bars` that is the live display's proxy, which prints the line above the bars."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:   # logging.StreamHandler sets it; sys.stderr is what counts
        pass
