"""The canonical Delta tables: their schemas (schemas.py) and how they are read and written (delta_io.py,
with the slice predicates of predicates.py and the conflict retries of retries.py).

Every table lives at <warehouse>/<name>. Stages reach them through `StageContext` (context.py), which
names tables and slices, never paths; the names below are that layer's vocabulary.
"""

from clickeval_spark.tables.delta_io import (conform, create_table, ensure_table, exists, last_commit, merge_rows,
                                             observed, read_table, replace_slice, rows_written, table_path)
from clickeval_spark.tables.predicates import in_window, log_date_predicate, slice_predicate
from clickeval_spark.tables.retries import (CONCURRENT_MODIFICATION_ERRORS, is_concurrent_modification,
                                            with_conflict_retries)
from clickeval_spark.tables.schemas import (CLICK_PREDICTIONS, DISTRIBUTIONAL_METRICS, GENERATED_SERP_FIELDS,
                                            METRICS, MODEL_PARAMS, PARTITION_COLUMNS, QUARANTINE,
                                            RELEVANCE_LABELS, RELEVANCE_SCORES, RUNS, SCHEMAS, SERPS,
                                            SYNTHETIC_SERPS, WRITTEN_BY)

__all__ = [
    "CLICK_PREDICTIONS", "CONCURRENT_MODIFICATION_ERRORS", "DISTRIBUTIONAL_METRICS", "GENERATED_SERP_FIELDS",
    "METRICS", "MODEL_PARAMS", "PARTITION_COLUMNS", "QUARANTINE", "RELEVANCE_LABELS", "RELEVANCE_SCORES", "RUNS",
    "SCHEMAS", "SERPS", "SYNTHETIC_SERPS", "WRITTEN_BY",
    "conform", "create_table", "ensure_table", "exists", "in_window", "is_concurrent_modification", "last_commit",
    "log_date_predicate", "merge_rows", "observed", "read_table", "replace_slice", "rows_written",
    "slice_predicate", "table_path", "with_conflict_retries",
]
