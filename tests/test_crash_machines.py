"""Run the crash state machines of :mod:`bucketstore.testing.state_machine` on the engine itself.

``BUCKETSTORE_EXAMPLES`` raises the example count (default 200).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from bucketstore.testing.state_machine import CrashMachine, JournalCrashMachine
from helpers import example_count

CrashMachine.TestCase.settings = settings(max_examples=example_count(200), stateful_step_count=40, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
TestCrashMachine = CrashMachine.TestCase

JournalCrashMachine.TestCase.settings = settings(max_examples=example_count(200), stateful_step_count=40,
                                                 deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestJournalCrashMachine = JournalCrashMachine.TestCase
