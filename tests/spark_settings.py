"""Spark settings the test suite shares between its session and the jobs it starts as processes."""

# Expressions evaluated interpreted, never as generated Java (Janino) code. The suite runs thousands of
# small queries on a few hundred rows each: compiling each new plan's code costs far more than it saves.
# The reliability pipeline (tests/reliability/baseline.py: 300 SERPs, every stage) in a warm test session
# took 30.5-33.8 s with these two settings against 46.3-57.8 s without (two processes), and its JVM's CPU
# over four runs was 193 s against 289-294 s (benchmarks/RESULTS.md). Spark's own suites run its expressions both ways, and
# `factoryMode` is the internal switch they use for it.
# The test session, the commands and SQL clients it starts as processes, the jobs started to prove what a
# fault does (the crash-recovery fit, em_faults' local cluster) and the standalone cluster's spark-submits run
# this way. One job keeps Spark's generated code, so production's code path runs in every CI: the concurrent
# pipeline process, whose metrics test_reproducibility holds bit-identical to the baseline's, computed in the
# test session without codegen.
INTERPRETED = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}

# A JVM the suite starts as a process (a command's, a SQL client's, the test cluster's) lives a minute or two
# on a 2-core machine: C2 compiling the same hot code in each of them costs more CPU than it wins back (C1
# only cut ingest + fit from 441 to 260 CPU-seconds here), and one GC thread is enough. Verifying the bytecode
# of every class loaded from a jar is a seventh of such a JVM's CPU (a session's start and a Delta write:
# 14.8 -> 13.0 CPU-s, benchmarks/RESULTS.md): the jars here are pyspark's and Maven Central's, so they skip it.
SHORT_LIVED_JVM = ("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
                   "-XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote")

#: the spark.conf of a command the suite starts as a process (a stage, `clickeval sql`, a catalog check):
#: its JVM short-lived, its expressions interpreted; what it prints and writes is the same
PROCESS_CONF = {"spark.driver.extraJavaOptions": SHORT_LIVED_JVM, **INTERPRETED}
