"""``bucketstore simulate --subscriptions N``: one topic, N subscriptions, each held to an oracle."""

from __future__ import annotations

import re

from bucketstore.cli import commands as cli
from bucketstore.cli.simulate_topics import TopicSimulation, run_topic_simulation
from bucketstore.engine.topics.topic_reader import describe_topics


def test_simulate_with_subscriptions_agrees_with_the_oracles(tmp_path, capsys) -> None:
    code = cli.main(["simulate", str(tmp_path / "s"), "--subscriptions", "3", "--messages", "3000", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "3 subscription(s), 1 restart(s)" in out
    assert "delivered: sub-0 3,000, sub-1 3,000, sub-2 3,000" in out
    assert "every batch and count agreed" in out
    assert re.search(r"topic index file [\d,]+ bytes \([\d,]+ in use", out)
    # The consumers confirmed their last batches: a restarted broker gets nothing back.
    for sub in describe_topics(tmp_path / "s")["simulate-topic"]["subscriptions"].values():
        assert sub["number_of_delayed_messages"] == 0 and sub["due_undelivered"] == 0, sub
    # A second run starts the topic afresh.
    assert cli.main(["simulate", str(tmp_path / "s"), "--subscriptions", "2", "--messages", "500",
                     "--durability", "journal", "--no-progress"]) == 0


def test_the_topic_is_stored_once_and_the_lagging_subscription_holds_rows(tmp_path) -> None:
    sim = run_topic_simulation(str(tmp_path), TopicSimulation(subscriptions=4, messages=4000, rate_per_s=400,
                                                               delay_window_ms=30_000, entries_per_ledger=500),
                               progress=False)
    assert sim.mismatches == 0 and sim.restarts == 1
    assert sim.peak_rows <= 4000 and sim.rows_at_end == 0
    assert sim.held_by_lagging > 0
    assert set(sim.delivered.values()) == {4000}


def test_bad_subscription_count_is_a_usage_error(tmp_path, capsys) -> None:
    assert cli.main(["simulate", str(tmp_path / "s"), "--subscriptions", "-2", "--no-progress"]) == 2
    assert "--subscriptions must be at least 1" in capsys.readouterr().err
