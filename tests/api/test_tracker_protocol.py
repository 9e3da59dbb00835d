"""Every tracker satisfies ``bucketstore.DelayedDeliveryTracker`` (and the read-only one ``TrackerView``).

``isinstance`` with a runtime-checkable Protocol only sees that the methods exist; the
signatures (parameter names, kinds, defaults and annotations, and the return annotation) are
compared here with ``inspect``, so a tracker whose method drifts from the others fails.
"""

from __future__ import annotations

import inspect

import pytest

import bucketstore
from bucketstore import DelayedDeliveryTracker, TrackerView

# A topic's Subscription is a tracker too: a broker swaps one in for a BucketTracker.
FULL = [bucketstore.BucketTracker, bucketstore.InMemoryTracker, bucketstore.TimeBucketTracker,
        bucketstore.Subscription]
READERS = FULL + [bucketstore.ReadOnlyTracker]


def members(protocol: type) -> list[str]:
    return sorted(name for name, value in vars(protocol).items()
                  if (inspect.isfunction(value) or isinstance(value, property)) and not name.startswith("_"))


def signature_problems(cls: type, protocol: type) -> list[str]:
    """Where ``cls``'s methods differ from the protocol's: a method or property missing, or a
    property where a method is wanted (or the reverse); a parameter missing, renamed, of another
    kind, default or annotation; a required parameter the protocol lacks; another return type
    (a class may return one member of a union the protocol returns)."""
    problems = []
    for proto_cls in protocol.__mro__:
        if proto_cls in (object,) or proto_cls.__name__ in ("Protocol", "Generic"):
            continue
        for name in members(proto_cls):
            wanted_member = inspect.getattr_static(proto_cls, name)
            had_member = inspect.getattr_static(cls, name, None)
            if had_member is None:
                problems.append(f"{cls.__name__} has no {name}")
                continue
            if isinstance(wanted_member, property) != isinstance(had_member, property):
                problems.append(f"{cls.__name__}.{name}: a property on one side only")
                continue
            if isinstance(wanted_member, property):
                wanted_member, had_member = wanted_member.fget, had_member.fget
            want = inspect.signature(wanted_member)
            have = inspect.signature(had_member)
            wanted = list(want.parameters.values())
            had = list(have.parameters.values())
            for w, h in zip(wanted, had):
                if (w.name, w.kind, w.default, w.annotation) != (h.name, h.kind, h.default, h.annotation):
                    problems.append(f"{cls.__name__}.{name}: {h} is not {w}")
            if len(had) < len(wanted):
                problems.append(f"{cls.__name__}.{name}: lacks {[str(p) for p in wanted[len(had):]]}")
            extra = [p for p in had[len(wanted):] if p.default is inspect.Parameter.empty
                     and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            if extra:
                problems.append(f"{cls.__name__}.{name}: requires {[str(p) for p in extra]} beyond the protocol")
            allowed = {want.return_annotation, *(part.strip() for part in str(want.return_annotation).split("|"))}
            if have.return_annotation not in allowed:
                problems.append(f"{cls.__name__}.{name} returns {have.return_annotation}, "
                                f"not {want.return_annotation}")
    return problems


def test_the_protocols_name_the_tracker_api() -> None:
    view = members(TrackerView)
    assert "last_delivery_time" in view and "next_delivery_time" in view
    assert set(view).isdisjoint(members(DelayedDeliveryTracker))
    assert {"add_message", "get_scheduled_messages", "wait_scheduled", "confirm_delivered", "close"} \
        <= set(members(DelayedDeliveryTracker))


@pytest.mark.parametrize("cls", FULL, ids=lambda c: c.__name__)
def test_each_tracker_satisfies_the_protocol(cls: type) -> None:
    assert signature_problems(cls, DelayedDeliveryTracker) == []


@pytest.mark.parametrize("cls", READERS, ids=lambda c: c.__name__)
def test_each_tracker_answers_the_view(cls: type) -> None:
    assert signature_problems(cls, TrackerView) == []


def test_instances_pass_isinstance(tmp_path) -> None:
    memory = [bucketstore.InMemoryTracker(), bucketstore.TimeBucketTracker()]
    for tracker in memory:
        assert isinstance(tracker, DelayedDeliveryTracker) and isinstance(tracker, TrackerView)
    with bucketstore.open(str(tmp_path / "s"), durability="journal") as store:
        tracker = store.tracker("t")
        tracker.add_message(1, 0, 2**41)
        assert isinstance(tracker, DelayedDeliveryTracker)
    with bucketstore.open(str(tmp_path / "s"), read_only=True) as view:
        reader = view.tracker("t")
        assert isinstance(reader, TrackerView) and reader.last_delivery_time() == 2**41
    with bucketstore.open(str(tmp_path / "s")) as store:
        subscription = store.topic("orders").subscription("s")
        assert isinstance(subscription, DelayedDeliveryTracker) and isinstance(subscription, TrackerView)
    assert not isinstance(object(), TrackerView)


def test_the_topic_types_are_public() -> None:
    """``Topic`` and ``Subscription`` are reachable from the package, as its other public types."""
    assert {"Topic", "Subscription"} <= set(bucketstore.__all__)
    assert bucketstore.Topic.subscription.__annotations__["return"] in ("Subscription", bucketstore.Subscription)


def test_a_drifting_signature_is_caught() -> None:
    class Drifted(bucketstore.InMemoryTracker):
        def contains_message(self, ledger: int, entry_id: int) -> bool:  # a renamed parameter
            return False

        def next_delivery_time(self) -> float:  # another return type
            return 0.0

        def number_of_delayed_messages(self) -> int:  # a method where every tracker has a property
            return 0

    problems = signature_problems(Drifted, DelayedDeliveryTracker)
    assert len(problems) == 3, problems
    assert [p.split(":")[0].split(" ")[0] for p in sorted(problems)] == \
        ["Drifted.contains_message", "Drifted.next_delivery_time", "Drifted.number_of_delayed_messages"]


def test_bucket_tracker_implements_the_job_interface() -> None:
    """The seal and merge jobs are typed with ``JobHost``: every member it lists exists on
    ``BucketTracker`` with the same signature."""
    from bucketstore.engine.maintenance.bucket_job import JobHost

    assert members(JobHost), "JobHost lists nothing"
    assert signature_problems(bucketstore.BucketTracker, JobHost) == []
