"""benchmarks.targets judges each target by its own limit (a value just past a limit is "no", one just inside
"yes"), and times `make run` warm: an untimed first run, then rounds of both variants, the learned model's own
seconds the median of the rounds' differences."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import targets
from benchmarks.targets import main, make_run_part, table
from clickeval_spark.models import LEARNED


def _results(fit_1m: float, fit_10m: float, dbn_10m: float, ratios: dict[str, float], classic: float,
             learned: float) -> dict:
    return {
        "scale": {"1000000": {"fit_s": fit_1m, "fit_model_s": {"pbm": 10.0, "ubm": 10.0, "dbn": 20.0}, "pack_s": 5.0},
                  "10000000": {"fit_s": fit_10m, "fit_model_s": {"pbm": 40.0, "ubm": 40.0, "dbn": dbn_10m},
                               "pack_s": 40.0}},
        "em": {m: {"ratio": r, "max_global_diff": 1e-12} for m, r in ratios.items()},
        "make-run": {"walls": {"classic": [classic], "configured": [classic + learned]},
                     "median_s": {"classic": classic, "configured": classic + learned}, "learned_s": learned},
    }


def _verdicts(markdown: str) -> list[str]:
    return [line.rsplit("|", 2)[1].strip() for line in markdown.splitlines()[2:]]


def test_each_row_is_met_only_within_its_limit():
    inside = table(_results(90.0, 300.0, 269.0, {"pbm": 1.0, "dbn": 20.0}, 90.0, 15.0))
    assert _verdicts(inside) == ["yes"] * 6
    # each limit passed by a little, the 1M and 10M fits each on its own
    assert _verdicts(table(_results(90.4, 300.0, 269.0, {"pbm": 1.0}, 90.0, 15.0)))[:2] == ["**no**", "yes"]
    assert _verdicts(table(_results(90.0, 300.5, 269.0, {"pbm": 1.0}, 90.0, 15.0)))[:2] == ["yes", "**no**"]
    outside = _verdicts(table(_results(90.0, 250.0, 270.0, {"pbm": 0.99, "dbn": 20.0}, 91.0, 15.5)))
    assert outside == ["yes", "yes", "**no**", "**no**", "**no**", "**no**"]


def test_make_run_is_timed_after_an_untimed_run_and_the_learned_seconds_are_the_median_difference(monkeypatch,
                                                                                                  tmp_path):
    walls = {"classic": iter([100.0, 90.0, 95.0]), "configured": iter([112.0, 106.0, 125.0])}
    calls = []

    def fake_make_run(out: Path, models: list[str]) -> float:
        calls.append((out.name, tuple(models)))
        return 999.0 if out.name == "warm-up" else next(walls[out.name.rsplit("-", 1)[0]])

    monkeypatch.setattr(targets, "_make_run", fake_make_run)
    got = make_run_part(tmp_path, rounds=3)
    assert calls[0][0] == "warm-up" and [c[0] for c in calls[1:]] == [
        "classic-0", "configured-0", "classic-1", "configured-1", "classic-2", "configured-2"]
    assert not set(calls[1][1]) & set(LEARNED) and set(calls[2][1]) & set(LEARNED)
    assert got["median_s"] == {"classic": 95.0, "configured": 112.0}
    assert got["learned_s"] == 16.0   # the differences 12, 16, 30; the medians' difference would be 17


def test_an_unknown_part_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        main(["--parts", "scale,make_run"])
    assert "--parts: unknown make_run; choose from scale, em, make-run" in capsys.readouterr().err
