"""The crash-testing kit: crash your use of bucketstore at every I/O point and check what survives.

The engine's own crash tests are built from these parts; an embedder uses the same ones on
the layer they put above the store (see docs/testing-kit.md).

* :mod:`~bucketstore.testing.faults`: :class:`FaultyFileSystem`, a real file layer that numbers
  every durable call, crashes before any of them (:class:`SimulatedCrash`), fails them with
  EIO, ENOSPC or short writes (:meth:`FaultyFileSystem.fail`), and rewrites the disk as a
  power loss could leave it (:meth:`FaultyFileSystem.materialize` with one of :data:`DAMAGES`).
* :mod:`~bucketstore.testing.crash_points`: :func:`crash_each_point` runs a workload function
  you write, crashes it before each numbered call under each damage mode, and hands back each
  crash state reopened (:class:`CrashState`).
* :mod:`~bucketstore.testing.oracle`: the reference :class:`Model` of one tracker (what it must
  deliver, when), :class:`JournalBounds` (what a journal-mode tracker must hold after a crash
  in the middle of a call) and the checks (:func:`check_journal_recovered`,
  :func:`check_deliveries`, :func:`check_recovered` / :func:`expect` for sealed mode,
  :func:`check_files`).
* :mod:`~bucketstore.testing.stepped_worker`: :class:`SteppedWorker`, a maintenance worker
  that runs background seals and merges only when told (``Store(background=True,
  maintenance=SteppedWorker())``), so crashes inside them can be enumerated.
* :mod:`~bucketstore.testing.topic_crash` (POSIX): :class:`~bucketstore.testing.topic_crash.DurableSteps`
  numbers a process's durable steps, the topics' LMDB commits and syncs included, and SIGKILLs it
  before one; ``run_ops`` runs topic calls in a forked child killed so, ``check_killed_store``
  holds the store it left to :mod:`~bucketstore.testing.topic_model`'s ``TopicModel``, the
  specification of a topic's subscriptions. Not imported here.
* :mod:`~bucketstore.testing.clock`: :class:`FakeClock`.
* :mod:`bucketstore.testing.state_machine` (needs hypothesis: ``pip install
  'bucketstore[testing]'``, not imported here): :class:`CrashMachine` and
  :class:`JournalCrashMachine`, hypothesis ``RuleBasedStateMachine`` base classes to subclass.

``import bucketstore.testing`` needs only the core dependencies.

May import: the whole product except ``bucketstore.spark`` and ``bucketstore.cli`` (files are checked
through ``bucketstore.checking``). Nothing in the product imports it.
"""

from __future__ import annotations

from .clock import FakeClock
from .crash_points import CrashState, crash_each_point
from .faults import (ALL_SURVIVES, DAMAGES, DIRS_UNDONE, ONLY_SYNCED, TORN_AND_UNDONE, TORN_TAILS, ZEROED_TAILS,
                     Damage, DataLoss, DirLoss, FaultRule, FaultyFileSystem, SimulatedCrash, abandon_store)
from .stepped_worker import SteppedWorker
from .oracle import (CatalogState, Expectation, JournalBounds, Model, check_deliveries, check_files,
                     check_journal_files, check_journal_recovered, check_recovered, expect, reseed)

__all__ = [
    "FakeClock",
    "SteppedWorker",
    "crash_each_point",
    "CrashState",
    "FaultyFileSystem",
    "FaultRule",
    "SimulatedCrash",
    "abandon_store",
    "Damage",
    "DataLoss",
    "DirLoss",
    "DAMAGES",
    "ALL_SURVIVES",
    "ONLY_SYNCED",
    "TORN_TAILS",
    "ZEROED_TAILS",
    "DIRS_UNDONE",
    "TORN_AND_UNDONE",
    "Model",
    "JournalBounds",
    "CatalogState",
    "Expectation",
    "expect",
    "check_recovered",
    "check_journal_recovered",
    "check_deliveries",
    "check_files",
    "check_journal_files",
    "reseed",
]
