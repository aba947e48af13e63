"""The server never imports pyspark, and importing lanner.spark alone does not either."""
import subprocess
import sys


def test_server_and_package_do_not_import_pyspark():
    code = ("import sys\n"
            "import lanner.cli, lanner.server.supervisor, lanner.server.worker, lanner.server.cleaner\n"
            "import lanner.fronts.front, lanner.spark, lanner.spark.client, lanner.spark._journal\n"
            "import lanner.spark._cmdlog\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j', 'pyarrow'))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
