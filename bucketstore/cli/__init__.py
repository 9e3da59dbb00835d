"""The ``bucketstore`` command line: dump, verify, catalog, stats, checkpoint, repair and simulate.

``commands`` parses arguments and maps errors to exit codes (0 ok, 1 damage, 2 usage), ``dump`` and
``verify`` print what ``bucketstore.checking`` finds in files and stores, ``repair`` rebuilds a lost
catalog (through ``engine.store.rebuild``), ``simulate`` is the main job (``simulate_journal`` its
journal mode, a broker process SIGKILLed and checked against a ``side_log`` it fsyncs), ``plot`` draws ``stats --plot`` and
``progress`` is the one place that shows progress (on stderr: a tqdm bar on a terminal, one
line or nothing in a pipe).

May import: the root leaves, ``format``, ``memory``, ``engine``, ``bucketstore.checking`` (``verify``,
``catalog``, ``stats``) and ``bucketstore.metrics`` (``stats --prometheus``). Never ``bucketstore.testing``
or ``bucketstore.spark``.
Third-party: tqdm (``progress``), and matplotlib in ``plot`` only, imported when a plot is asked for.
"""

from .commands import main

__all__ = ["main"]
