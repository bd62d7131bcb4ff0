"""The embedded JVM's options: the young generation capped at 1 GB, and at a third of a smaller heap."""

import pytest

from clickeval_spark.session import EMBEDDED_JVM_OPTIONS, embedded_jvm_options


@pytest.mark.parametrize("memory, young_mib", [
    ("10g", 1024), ("6g", 1024), ("3g", 1024), ("2g", 682), ("1g", 341), (None, 341), ("512m", 170),
    ("2048", 682), ("1G", 341), ("4096m", 1024), ("3145728k", 1024), ("768mb", 256),
])
def test_the_young_generation_is_at_most_a_gigabyte_and_a_third_of_the_heap(memory, young_mib):
    assert embedded_jvm_options(memory) == f"{EMBEDDED_JVM_OPTIONS} -XX:MaxNewSize={young_mib}m"


@pytest.mark.parametrize("memory", ["lots", "4 gb", "-1g", "1.5g"])
def test_a_driver_memory_that_is_not_a_size_is_refused_by_name(memory):
    with pytest.raises(ValueError, match="spark.driver.memory"):
        embedded_jvm_options(memory)
