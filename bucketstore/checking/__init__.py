"""Offline checking and inspection of stores and ledger files: the engine's fsck, as a library.

``report`` is the public face (:func:`check`, :func:`check_file`, :class:`CheckReport`, exported as
``bucketstore.check`` and so on); ``ledger_check`` checks one ledger file completely (every CRC,
order, bound, bitmap and count) and reports every problem as a typed finding; ``store_check``
reads a whole store as one consistent view (catalog against ledger and journal files, beside a live writer or not) for
checking and for the ``catalog``/``stats`` overviews. Nothing here writes: repairs are what
``open`` does by itself and what ``engine.store.rebuild`` does when asked.

May import: the root leaves, ``format``, ``memory`` and ``engine``. Imported by ``cli`` (which only
parses arguments and prints), ``testing``, ``spark`` and the package root. Never prints.
"""

from .ledger_check import Finding, FindingKind
from .report import CheckReport, check, check_file

__all__ = ["check", "check_file", "CheckReport", "Finding", "FindingKind"]
