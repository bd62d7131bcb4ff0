"""benchmarks.targets judges each target by its own limit: a value just past a limit is "no", one just inside is
"yes", and the learned model's seconds are the difference of the two `make run` medians."""

from __future__ import annotations

import pytest

from benchmarks.targets import main, table


def _results(fit_1m: float, dbn_10m: float, ratios: dict[str, float], classic: list[float],
             configured: list[float]) -> dict:
    med = {"classic": sorted(classic)[len(classic) // 2], "configured": sorted(configured)[len(configured) // 2]}
    return {
        "scale": {"1000000": {"fit_s": fit_1m, "fit_model_s": {"pbm": 10.0, "ubm": 10.0, "dbn": 20.0}, "pack_s": 5.0},
                  "10000000": {"fit_s": 250.0, "fit_model_s": {"pbm": 40.0, "ubm": 40.0, "dbn": dbn_10m},
                               "pack_s": 40.0}},
        "em": {m: {"ratio": r, "max_global_diff": 1e-12} for m, r in ratios.items()},
        "make-run": {"walls": {"classic": classic, "configured": configured}, "median_s": med,
                     "learned_s": med["configured"] - med["classic"]},
    }


def _verdicts(markdown: str) -> list[str]:
    return [line.rsplit("|", 2)[1].strip() for line in markdown.splitlines()[2:]]


def test_each_row_is_met_only_within_its_limit():
    inside = _verdicts(table(_results(89.9, 269.0, {"pbm": 1.0, "dbn": 20.0}, [89.0, 95.0, 80.0],
                                      [100.0, 104.0, 110.0])))
    assert inside == ["yes"] * 6
    outside = _verdicts(table(_results(90.4, 270.0, {"pbm": 0.99, "dbn": 20.0}, [91.0, 95.0, 80.0],
                                       [106.5, 104.0, 110.0])))
    # 1M fit, 10M fit (250 s: inside), CLAX (dbn 270 is not below 270), EM ratio, make run 91 s, learned 106.5 - 91
    assert outside == ["**no**", "yes", "**no**", "**no**", "**no**", "**no**"]
    assert "15.5 s" in table(_results(90.4, 270.0, {"pbm": 0.99}, [91.0, 95.0, 80.0], [106.5, 104.0, 110.0]))


def test_an_unknown_part_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        main(["--parts", "scale,make_run"])
    assert "--parts: unknown make_run; choose from scale, em, make-run" in capsys.readouterr().err
