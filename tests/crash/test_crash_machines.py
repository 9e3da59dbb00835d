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


def _case(machine: type, examples: int) -> type:
    """The machine's test case with ``examples`` examples (scaled by ``BUCKETSTORE_EXAMPLES``) of 40 steps."""
    machine.TestCase.settings = settings(max_examples=example_count(examples), stateful_step_count=40,
                                         deadline=None, suppress_health_check=[HealthCheck.too_slow])
    return machine.TestCase


TestCrashMachine = _case(CrashMachine, 200)

TestJournalCrashMachine = _case(JournalCrashMachine, 200)

# precision_bits=5: trimmed times, and adds due within a step kept exact behind the frontier.
TestJournalPrecisionCrashMachine = _case(JournalPrecisionCrashMachine, 100)

TestJournalAtMostOnceCrashMachine = _case(JournalAtMostOnceCrashMachine, 100)

# Confirmations group-committed (confirm_sync_ms longer than the run): the oracle is the window
# of model states since the last journal commit.
TestJournalGroupedConfirmCrashMachine = _case(JournalGroupedConfirmCrashMachine, 100)

# Seals and merges in the background, on a worker the machine steps: the background_work
# rule runs the next job's write, its install, everything, or nothing, between adds,
# deliveries, trims, flushes, clears and crashes.
TestBackgroundCrashMachine = _case(BackgroundCrashMachine, 150)

TestBackgroundJournalCrashMachine = _case(BackgroundJournalCrashMachine, 150)

# With merges (max_num_buckets=2): seals and merges pending together, the second one's write
# run first at random points (background_work_second), between the other rules and crashes.
TestBackgroundMergingCrashMachine = _case(BackgroundMergingCrashMachine, 100)

TestBackgroundMergingJournalCrashMachine = _case(BackgroundMergingJournalCrashMachine, 50)
