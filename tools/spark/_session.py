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

    spark = (SparkSession.builder.master(master).appName(app)
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    bucketstore.spark.register(spark)
    return spark
