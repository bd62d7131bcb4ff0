"""`clickeval tables`: every result table with its row count, latest Delta version and last write."""

import sys

from delta.tables import DeltaTable

from clickeval_spark import tables
from clickeval_spark.runtime import run_job


def list_tables(spark, cfg, warehouse, run_id) -> None:
    print(f"warehouse: {warehouse}")
    print(f"{'table':<24}{'rows':>12}{'version':>9}  last write")
    for name in tables.SCHEMAS:
        path = tables.table_path(warehouse, name)
        if not DeltaTable.isDeltaTable(spark, path):
            print(f"{name:<24}{'-':>12}{'-':>9}  (not written yet)")
            continue
        last = DeltaTable.forPath(spark, path).history(1).select("version", "timestamp", "userMetadata").first()
        rows = tables.read_table(spark, warehouse, name).count()
        print(f"{name:<24}{rows:>12}{last['version']:>9}  {last['timestamp']:%Y-%m-%d %H:%M:%S} "
              f"{last['userMetadata'] or ''}")


def main(argv=None) -> int:
    return run_job("tables", argv, list_tables)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
