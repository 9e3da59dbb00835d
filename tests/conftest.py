"""Shared fixtures: a fake clock and tracker factories for both implementations."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

import bucketstore
from bucketstore.format import bucket_summary
from helpers import FakeClock

settings.register_profile("ci", deadline=None, print_blob=True)
settings.load_profile("ci")

# BUCKETSTORE_TEST_PREFIX_ROWS=1 runs any test file with summaries that keep a prefix of that many
# rows (the default, 32, is longer than most tests' segments: they then keep none).
if os.environ.get("BUCKETSTORE_TEST_PREFIX_ROWS"):
    bucket_summary.PREFIX_ROWS = int(os.environ["BUCKETSTORE_TEST_PREFIX_ROWS"])


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path):
    s = bucketstore.open(tmp_path / "store")
    yield s
    s.close()


@pytest.fixture(params=["bucket", "memory", "timebucket"])
def make_tracker(request, tmp_path):
    """A factory ``make_tracker(config, clock)`` for each tracker implementation."""
    stores = []

    def make(config=None, clock=None):
        if request.param == "memory":
            return bucketstore.InMemoryTracker(config, clock)
        if request.param == "timebucket":  # precision 0: exact, so every scenario applies
            return bucketstore.TimeBucketTracker(config, clock)
        s = bucketstore.open(tmp_path / f"store{len(stores)}")
        stores.append(s)
        return s.tracker("sub", config, clock)

    yield make
    for s in stores:
        s.close()
