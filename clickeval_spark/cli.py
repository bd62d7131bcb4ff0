"""`clickeval <stage> [--conf conf/<env>.yaml] [--run-id ID] [--set key=value ...]`."""

from __future__ import annotations

import importlib
import sys

# the pipeline's stages in run order: jobs/<stage>.py each, and one Airflow task each
PIPELINE_STAGES = ("ingest", "fit", "predict", "evaluate", "generate", "surrogate")
STAGES = (*PIPELINE_STAGES, "pipeline")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in STAGES:
        print(f"usage: clickeval {{{','.join(STAGES)}}} [--conf FILE] [--run-id ID] [--set KEY=VALUE ...]",
              file=sys.stderr)
        return 2
    job = importlib.import_module(f"jobs.{argv[0]}")
    return job.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
