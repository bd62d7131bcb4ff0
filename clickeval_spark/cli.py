"""`clickeval <verb> [--conf conf/<env>.yaml] [--run-id ID] [--set key=value ...]`.

Verbs: every pipeline stage (each is jobs/<stage>.py), `run` / `pipeline` (all stages in
one session), `tables` (row counts and Delta versions) and `sql "<query>"`.
"""

from __future__ import annotations

import importlib
import sys

# the pipeline's stages in run order: jobs/<stage>.py each, and one Airflow task each
PIPELINE_STAGES = ("ingest", "fit", "predict", "evaluate", "generate", "surrogate", "report")
# verb -> module in jobs/
VERBS = {**{s: s for s in PIPELINE_STAGES}, "pipeline": "pipeline", "run": "pipeline", "tables": "tables",
         "sql": "sql"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in VERBS:
        print(f"usage: clickeval {{{','.join(VERBS)}}} [--conf FILE] [--run-id ID] [--set KEY=VALUE ...]\n"
              "  run: every stage in one session; tables: row counts and Delta versions; sql \"<query>\"",
              file=sys.stderr)
        return 2
    job = importlib.import_module(f"jobs.{VERBS[argv[0]]}")
    return job.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
