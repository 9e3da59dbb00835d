"""Run the crash state machines of :mod:`bucketstore.testing.state_machine` on the engine itself.

``BUCKETSTORE_EXAMPLES`` raises the example count (default 200).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from bucketstore.testing.state_machine import (BackgroundCrashMachine, BackgroundJournalCrashMachine,
                                               BackgroundMergingCrashMachine, BackgroundMergingJournalCrashMachine,
                                               CrashMachine, JournalAtMostOnceCrashMachine, JournalCrashMachine,
                                               JournalGroupedConfirmCrashMachine, JournalPrecisionCrashMachine)
from helpers import example_count

CrashMachine.TestCase.settings = settings(max_examples=example_count(200), stateful_step_count=40, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
TestCrashMachine = CrashMachine.TestCase

JournalCrashMachine.TestCase.settings = settings(max_examples=example_count(200), stateful_step_count=40,
                                                 deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestJournalCrashMachine = JournalCrashMachine.TestCase

# precision_bits=5: trimmed times, and adds due within a step kept exact behind the frontier.
JournalPrecisionCrashMachine.TestCase.settings = settings(
    max_examples=example_count(100), stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestJournalPrecisionCrashMachine = JournalPrecisionCrashMachine.TestCase

JournalAtMostOnceCrashMachine.TestCase.settings = settings(
    max_examples=example_count(100), stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestJournalAtMostOnceCrashMachine = JournalAtMostOnceCrashMachine.TestCase

# Confirmations group-committed (confirm_sync_ms longer than the run): the oracle is the window
# of model states since the last journal commit.
JournalGroupedConfirmCrashMachine.TestCase.settings = settings(
    max_examples=example_count(100), stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestJournalGroupedConfirmCrashMachine = JournalGroupedConfirmCrashMachine.TestCase

# Seals and merges in the background, on a worker the machine steps: the background_work
# rule runs the next job's write, its install, everything, or nothing, between adds,
# deliveries, trims, flushes, clears and crashes.
BackgroundCrashMachine.TestCase.settings = settings(max_examples=example_count(150), stateful_step_count=40,
                                                    deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestBackgroundCrashMachine = BackgroundCrashMachine.TestCase

BackgroundJournalCrashMachine.TestCase.settings = settings(
    max_examples=example_count(150), stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestBackgroundJournalCrashMachine = BackgroundJournalCrashMachine.TestCase

# With merges (max_num_buckets=2): seals and merges pending together, the second one's write
# run first at random points (background_work_second), between the other rules and crashes.
BackgroundMergingCrashMachine.TestCase.settings = settings(
    max_examples=example_count(100), stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestBackgroundMergingCrashMachine = BackgroundMergingCrashMachine.TestCase

BackgroundMergingJournalCrashMachine.TestCase.settings = settings(
    max_examples=example_count(50), stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestBackgroundMergingJournalCrashMachine = BackgroundMergingJournalCrashMachine.TestCase
