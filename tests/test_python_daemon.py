"""The worker daemon's zipimport patch (clickeval_spark/python_daemon.py)."""

import subprocess
import sys
import textwrap

import pytest

# Runs in a fresh interpreter: the patch changes the process's zipimport for good.
SCRIPT = textwrap.dedent("""
    import importlib, sys, zipfile, zipimport
    from clickeval_spark.python_daemon import patch_zipimport

    archive = sys.argv[1]
    def write(value):   # a different value: a different module name and a different archive size
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("pkg/__init__.py", "")
            z.writestr(f"pkg/mod_{value}.py", f"VALUE = {value}")
    write(1)
    sys.path.insert(0, archive)
    import pkg.mod_1            # two importers of the archive: its root and pkg/
    reads = []
    real = zipimport._read_directory
    zipimport._read_directory = lambda path: reads.append(path) or real(path)
    print("patched", patch_zipimport())
    print("reads at patch", len(reads))        # importers made before the patch: read once more
    reads.clear()
    for _ in range(5):          # what PySpark's worker does before every task
        importlib.invalidate_caches()
    print("reads unchanged", len(reads))
    write(22)                   # a changed archive is re-read by each importer, and its new module found
    importlib.invalidate_caches()
    import pkg.mod_22
    print("reads changed", len(reads), pkg.mod_22.VALUE)
    reads.clear()
    for _ in range(3):
        importlib.invalidate_caches()
    print("reads unchanged again", len(reads))
""")


@pytest.mark.skipif(sys.version_info[:2] >= (3, 12), reason="Python 3.12 invalidates zip caches lazily itself")
def test_invalidate_caches_rereads_a_zip_only_when_it_changed(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "lib.zip")],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    # without the patch every invalidate_caches() re-reads the archive: 10 reads for 5 calls, 2 importers
    assert out[:5] == ["patched True", "reads at patch 2", "reads unchanged 0", "reads changed 2 22",
                       "reads unchanged again 0"]


def test_embedded_workers_run_the_patched_daemon(spark):
    assert spark.conf.get("spark.python.daemon.module") == "clickeval_spark.python_daemon"

    def probe(_):
        import zipimport
        yield getattr(zipimport.zipimporter.invalidate_caches, "_clickeval", False)

    patched = spark.sparkContext.parallelize(range(2), 2).mapPartitions(probe).collect()
    assert patched == [sys.version_info[:2] < (3, 12)] * 2
