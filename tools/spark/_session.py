"""The SparkSession the tools start (local mode unless --master says otherwise)."""

from __future__ import annotations

import os
import sys


def start(master: str, app: str):
    """Start (or join) a session whose Python workers run this interpreter, with the data source registered."""
    # Workers otherwise start whatever python3 is on PATH, which may not have bucketstore installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import bucketstore.spark

    # Spark's own stage bar (tasks done / total per stage) on a terminal; none in a pipe or a
    # log, where its carriage-return redraws would be noise. Spark's progress is its own: a
    # tqdm bar would have to poll the status tracker for what Spark already draws.
    progress = "true" if sys.stderr.isatty() else "false"
    spark = (SparkSession.builder.master(master).appName(app)
             .config("spark.ui.showConsoleProgress", progress).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    bucketstore.spark.register(spark)
    return spark
