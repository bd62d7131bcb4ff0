"""How the candidates of `k: auto` are chosen between: by valid LL at the end (`chosen_slot`, `grid_selection`),
by successive halving on the way (`halve`), or not at all when a daily run reuses a recent choice
(`reused_candidate`, `reused_selection`). The EM loop that runs them is `driver`'s."""

from __future__ import annotations

import logging
from dataclasses import replace

from clickeval_spark.em.candidates import Candidate
from clickeval_spark.em.context import FitContext
from clickeval_spark.em.options import RecentChoice
from clickeval_spark.models.base import ClickModel
from clickeval_spark.models.priors import Strength


def chosen_slot(cands: list[Candidate], g: int) -> tuple[list[int], int]:
    """Group g's candidates (indices) and the slot of the one with the best valid LL (the first on a tie)."""
    mine = [i for i, c in enumerate(cands) if c.group == g]
    went_on = [j for j, i in enumerate(mine) if cands[i].chosen_at is not None]
    if went_on:   # chosen before it went on (`driver._run`): its valid LL has moved since, the others' have not
        return mine, went_on[0]
    left = [j for j, i in enumerate(mine) if cands[i].dropped_at is None]   # successive halving's (`halve`)
    slot = max(left, key=lambda j: (cands[mine[j]].valid_ll if len(mine) > 1 else 0.0, -j))
    return mine, slot


def _when_chosen(c: Candidate) -> tuple[float, int]:
    """``c``'s valid LL and passes when valid chose (the chosen one may have gone on since: `driver._run`)."""
    return c.chosen_at or (c.valid_ll, c.done)


def _grid_entry(c: Candidate, k: float | Strength, seen_means: str) -> dict:
    """``c``'s entry in a selection record's grid: its strength, seen-pair means, valid LL and passes when valid
    chose, EB's strengths, and where successive halving stopped it (its valid LL is then that iteration's)."""
    ll, done = _when_chosen(c)
    return {"k": k, "seen_means": seen_means, "valid_ll": ll, "iterations": done,
            **({"strengths": c.strengths()} if k == Strength.EB else {}),
            **({"dropped_at": c.dropped_at} if c.dropped_at is not None else {})}


def grid_selection(cands: list[Candidate], mine: list[int], slot: int, grid: list, n_valid: int,
                   model: ClickModel, log: logging.Logger) -> dict | None:
    """What the valid split chose among a group's candidates (None: there was one)."""
    if len(mine) < 2:
        return None
    log.debug("%s prior strength by valid LL per position: %s -> %s", model.name,
              ", ".join(f"{cands[i].label}: {_when_chosen(cands[i])[0]:.6f}" for i in mine), cands[mine[slot]].label)
    return {"grid": [_grid_entry(cands[i], k, v) for (k, v), i in zip(grid, mine)],
            "chosen_k": grid[slot][0], "chosen_seen_means": grid[slot][1], "n_valid_serps": n_valid}


def halve(stepped: list[Candidate], ctx: FitContext) -> None:
    """Successive halving (`EMOptions.halving`) after a pass of the ``stepped`` candidates: in each group, once
    its competing candidates have scored a round's iteration on the valid split, the active ones whose valid LL
    per position trails the best of them by more than the round's margin stop (`Candidate.dropped_at`): no
    more passes, no scoring pass, not chosen.

    Why it keeps the choice: a candidate's passes do not depend on the others', so the ones left run as they
    would among all of them; and early valid LL ranks the candidates well enough that the margins, which
    shrink as the fits settle, never dropped the winner of a full selection where it was measured
    (benchmarks/RESULTS.md, "Successive halving").
    """
    margins = dict(ctx.opts.halving)
    if not margins or not ctx.opts.select_on_held_out:
        return
    for g in {c.group for c in stepped}:
        # the group's candidates whose valid LL this pass read, at a round's iteration
        at = [c for c in stepped if c.group == g and c.competes and c.valid_at in margins
              and c.valid_at == c.history[-1][0]]
        if len(at) < 2:
            continue
        it = at[0].valid_at
        lead = max(c.valid_ll for c in at)
        for c in at:
            if c.active and c.valid_ll < lead - margins[it]:
                c.active, c.dropped_at = False, it
                ctx.log.debug("%s %s out after iteration %d: valid LL per position %.6f trails the best %.6f by "
                              "more than %g", ctx.model.name, c.label, it, c.valid_ll, lead, margins[it])


def reused_candidate(ctx: FitContext, cands: list[Candidate], grids: list) -> list[Candidate] | None:
    """With ``opts.reuse`` (fit.prior.reuse: a recent fit's choice, found by the fit stage), that candidate
    alone, fresh; None: the candidates compete (no recent choice, one candidate anyway, a grouped log, or a
    choice that is not one of today's).

    A candidate's passes do not depend on the others', so it fits as it would among all of them: the fit is
    the one the whole selection would give whenever it would choose the same. Whether the choice still
    holds is read after the fit, from its valid LL (`driver._fit`)."""
    recent = ctx.opts.reuse
    if recent is None or len(grids) != 1 or len(cands) < 2:
        return None
    entry = (Strength.EB if recent.k == Strength.EB.value else float(recent.k), recent.seen_means)
    if entry not in grids[0]:
        ctx.log.info("%s: the choice of run %s (k %s, seen means %s) is not one of today's candidates; selecting",
                     ctx.model.name, recent.run_id, recent.k, recent.seen_means)
        return None
    return [replace(cands[grids[0].index(entry)], competes=False)]


def reuse_record(c: Candidate, recent: RecentChoice) -> dict:
    """What runs.details says of reusing ``recent`` for candidate ``c`` after its fit (`reused` or
    `reuse_refused`)."""
    return {"run_id": recent.run_id, "valid_ll_then": recent.valid_ll, "margin": recent.margin,
            "valid_ll_now": c.valid_ll, "held": recent.holds(c.valid_ll)}


def reused_selection(c: Candidate, recent: RecentChoice, n_valid: int) -> dict:
    """The selection record of the reused choice ``c`` after its fit: `grid_selection`'s keys (its grid holds ``c``
    alone) and the reuse (`reuse_record`)."""
    k, seen_means = c.choice, c.prior.seen_means[0]
    return {"grid": [_grid_entry(c, k, seen_means)],
            "chosen_k": k, "chosen_seen_means": seen_means, "n_valid_serps": n_valid,
            "reused": reuse_record(c, recent)}
