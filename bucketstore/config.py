"""Tracker settings: Pulsar's delayed-delivery settings, with its defaults."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["TrackerConfig", "config_or_default", "config_from_record"]

_MAX_INT = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class TrackerConfig:
    """How a tracker cuts, seals, merges and delivers. Immutable; validated on creation.

    ========================================  ========  =====================================================
    field                                     default   Pulsar setting
    ========================================  ========  =====================================================
    ``tick_time_ms``                          1000      delayedDeliveryTickTimeMillis
    ``deliver_at_time_strict``                False     isDelayedDeliveryDeliverAtTimeStrict
    ``min_index_count_per_bucket``            50000     delayedDeliveryMinIndexCountPerBucket
    ``max_time_step_per_segment_ms``          300000    delayedDeliveryMaxTimeStepPerBucketSnapshotSegmentSeconds x 1000
    ``max_indexes_per_segment``               5000      delayedDeliveryMaxIndexesPerBucketSnapshotSegment (-1 = no cap)
    ``max_num_buckets``                       -1        delayedDeliveryMaxNumBuckets (-1 = no merging)
    ``precision_bits``                        0         (TimeBucket: timestamps trimmed by this many bits)
    ``max_resident_ledgers``                  8192      (memory: ledgers the index holds before idle sealed
                                                        buckets are paged out to the membership spill)
    ========================================  ========  =====================================================

    The cutoff is ``now + tick_time_ms``, or ``now`` when ``deliver_at_time_strict``:
    indexes at or before it are due, so a non-strict tracker may deliver up to one
    tick early.

    ``max_resident_ledgers`` bounds memory, not behaviour: once the tracker's index holds
    more ledgers than this (and twice what the last sweep left), the bitmaps of sealed
    buckets delivery does not need now are paged out of memory; answers stay the same.
    With 0 only the doubling counts; a value above the backlog's ledger count never pages.

    :raises ValueError: a field out of range, naming the field.
    :raises TypeError: a field of the wrong type, naming the field.
    """

    tick_time_ms: int = 1000
    deliver_at_time_strict: bool = False
    min_index_count_per_bucket: int = 50000
    max_time_step_per_segment_ms: int = 300000
    max_indexes_per_segment: int = 5000
    max_num_buckets: int = -1
    precision_bits: int = 0
    max_resident_ledgers: int = 8192

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "deliver_at_time_strict":
                if not isinstance(value, bool):
                    raise TypeError(f"TrackerConfig.{f.name} must be a bool, not {type(value).__name__}")
            elif isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"TrackerConfig.{f.name} must be an int, not {type(value).__name__}")
            elif value > _MAX_INT:
                # Pulsar's settings are Java longs; larger values would only fail later, inside
                # msgpack or numpy, far from the mistake.
                raise ValueError(f"TrackerConfig.{f.name} must be at most 2**63 - 1, not {value}")
        _require(self.tick_time_ms >= 0, "tick_time_ms", "must be >= 0")
        _require(self.min_index_count_per_bucket >= 1, "min_index_count_per_bucket", "must be >= 1")
        _require(self.max_time_step_per_segment_ms >= 1, "max_time_step_per_segment_ms", "must be >= 1")
        _require(self.max_indexes_per_segment == -1 or self.max_indexes_per_segment >= 1,
                 "max_indexes_per_segment", "must be -1 (no cap) or >= 1")
        _require(self.max_num_buckets == -1 or self.max_num_buckets >= 1,
                 "max_num_buckets", "must be -1 (no merging) or >= 1")
        _require(0 <= self.precision_bits <= 32, "precision_bits", "must be in 0..32")
        _require(self.max_resident_ledgers >= 0, "max_resident_ledgers", "must be >= 0")


def _require(ok: bool, name: str, what: str) -> None:
    if not ok:
        raise ValueError(f"TrackerConfig.{name} {what}")


def config_or_default(config: object) -> TrackerConfig:
    """``config`` itself if it is a :class:`TrackerConfig`, the defaults for None; TypeError otherwise."""
    if config is None:
        return TrackerConfig()
    if not isinstance(config, TrackerConfig):
        raise TypeError(f"config must be a bucketstore.TrackerConfig, not {type(config).__name__}")
    return config


def config_from_record(recorded: object) -> TrackerConfig:
    """The configuration a tracker or topic recorded on disk (a field -> value map), for an
    open that names none: the defaults where it records none. Fields this version does not
    know are left out, and a record this version cannot accept gives the defaults: the
    catalog of a newer version must still open."""
    if not isinstance(recorded, dict):
        return TrackerConfig()
    known = {k: v for k, v in recorded.items() if k in TrackerConfig.__dataclass_fields__}
    try:
        return TrackerConfig(**known)
    except (TypeError, ValueError):
        return TrackerConfig()
