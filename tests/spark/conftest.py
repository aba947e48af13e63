"""One local[2] SparkSession for the Spark tests (package scope), set up as the research
notes advise: workers run this interpreter, everything binds to 127.0.0.1, no UI.

Without pyspark or Java the modules skip on a developer's machine; CI sets
LANNER_REQUIRE_SPARK=1 (`.ci/run`), which turns that into an error, so the Spark
tests can never silently skip there.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

MISSING = [m for m in ("pyspark", "pyarrow") if importlib.util.find_spec(m) is None]
if shutil.which("java") is None:
    MISSING.append("java")
if MISSING and os.environ.get("LANNER_REQUIRE_SPARK") == "1":
    raise RuntimeError(f"LANNER_REQUIRE_SPARK=1 but {', '.join(MISSING)} missing: "
                       "pip install -e '.[spark]' and a Java 17 runtime")


def pytest_collection_modifyitems(config, items):
    if not MISSING:
        return
    skip = pytest.mark.skip(reason=f"Spark tests need {', '.join(MISSING)} (pip install -e '.[spark]')")
    for item in items:
        if "tests/spark/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


@pytest.fixture(scope="package")
def spark():
    from pyspark.sql import SparkSession

    from lanner.spark import register
    s = (SparkSession.builder.master("local[2]").appName("lanner-tests")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.default.parallelism", "2")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.memory", "1g")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    register(s)
    yield s
    s.stop()
