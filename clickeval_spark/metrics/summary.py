"""The metrics table as text: one line per (model, split) with the headline metrics and their intervals."""

from __future__ import annotations

from typing import Iterable, Mapping

HEADLINE = (("LL", None), ("PPL", None), ("PPL_cond", None),
            ("NDCG", 1), ("NDCG", 3), ("NDCG", 5), ("NDCG", 10))


def _cell(row: Mapping | None) -> str:
    if row is None or row["value"] is None:
        return "-"
    if row["ci_low"] is None:
        return f"{row['value']:.4f}"
    return f"{row['value']:.4f} [{row['ci_low']:.4f}, {row['ci_high']:.4f}]"


def metrics_table(rows: Iterable[Mapping], model_order: Iterable[str] = ()) -> str:
    """Rows in the metrics contract → an aligned text table (95% intervals in brackets)."""
    by_key: dict[tuple, dict] = {}
    for r in rows:
        if r["reference_model"] is None:
            by_key.setdefault((r["model"], r["split"]), {})[(r["metric"], r["cutoff"])] = r
    order = {m: i for i, m in enumerate(model_order)}
    keys = sorted(by_key, key=lambda k: (k[1], order.get(k[0], len(order)), k[0]))
    header = ["model", "split", *[f"{m}@{c}" if c else m for m, c in HEADLINE]]
    body = [[model, split, *[_cell(by_key[(model, split)].get(h)) for h in HEADLINE]] for model, split in keys]
    widths = [max(len(str(line[i])) for line in [header, *body]) for i in range(len(header))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(line, widths)).rstrip() for line in [header, *body])
