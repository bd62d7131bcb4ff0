"""The session's Java serialization streams forget each object once written (`spark.serializer.objectStreamReset`
1): EM's block rows are MBs each, and a stream that keeps every row it wrote, as Spark's default does for 100
rows, held a task's whole partition (benchmarks/RESULTS.md, the cluster-memory run)."""


def _stream_bytes(spark, bits: int, times: int) -> int:
    """Bytes SparkEnv's serializer writes for the same JVM object (a BitSet of `bits` set bits) written `times`
    times in one stream: once plus back-references while the stream remembers it, in full each time once it
    forgets it."""
    jvm = spark.sparkContext._jvm
    any_tag = getattr(jvm.scala.reflect, "ClassTag$").__getattr__("MODULE$").Any()
    out = jvm.java.io.ByteArrayOutputStream()
    stream = jvm.org.apache.spark.SparkEnv.get().serializer().newInstance().serializeStream(out)
    obj = jvm.java.util.BitSet()   # (a byte[] would come back to Python as bytes, a new array every call)
    obj.set(0, bits)
    for _ in range(times):
        stream.writeObject(obj, any_tag)
    stream.close()
    return out.size()


def test_each_object_is_written_in_full_so_the_stream_holds_none_of_them(spark):
    assert spark.sparkContext.getConf().get("spark.serializer.objectStreamReset") == "1"
    one = _stream_bytes(spark, 800_000, 1)
    assert one > 100_000 and _stream_bytes(spark, 800_000, 5) > 4.9 * one
