"""``store.topic(name)`` without ``config`` opens the topic with the configuration it recorded,
as ``store.tracker(name)`` does (it used the defaults); an explicit one is the topic's from then on."""

from __future__ import annotations

from pathlib import Path

import pytest

import bucketstore
from bucketstore import TrackerConfig

CFG = TrackerConfig(min_index_count_per_bucket=7, tick_time_ms=0)
OTHER = TrackerConfig(min_index_count_per_bucket=9, tick_time_ms=5)


@pytest.mark.parametrize("durability", ["journal", "sealed"])
def test_a_topic_reopens_with_its_recorded_config(tmp_path: Path, durability: str) -> None:
    with bucketstore.open(tmp_path, durability=durability) as store:
        store.topic("orders", CFG, clock=lambda: 1_000).add_message(1, 0, 60_000)
    with bucketstore.open(tmp_path, durability=durability) as store:
        orders = store.topic("orders", clock=lambda: 1_000)
        assert orders.config == CFG
        assert store.topic("orders") is orders  # open: no config asks for no change
        with pytest.raises(ValueError, match="different config"):
            store.topic("orders", OTHER)
        orders.close()
        store.topic("orders", OTHER, clock=lambda: 1_000).add_message(1, 1, 60_000)
    with bucketstore.open(tmp_path, durability=durability) as store:
        assert store.topic("orders").config == OTHER
        assert store.topic("fresh").config == TrackerConfig()
