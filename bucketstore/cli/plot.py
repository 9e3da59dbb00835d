"""``bucketstore stats STORE --plot due.png``: what is due when, per bucket, as a PNG.

One panel per tracker: a stacked histogram of the due times (``deliver_at``) of
every index in its sealed buckets, one colour per bucket (the largest ones; the
rest stacked as "other buckets"), time on the x axis in UTC. It is the picture
``tools/spark/report.py`` draws from a Spark scan, drawn here from the files
directly, read-only, beside a live writer too.

matplotlib is the optional ``plot`` extra (``pip install 'bucketstore[plot]'``):
it is imported only when a plot is asked for, with the non-interactive Agg
backend, so ``import bucketstore.cli`` never needs it. The plot shows the
sealed buckets as their files record them: indexes still in a journal or a
mutable bucket are not in a file yet, and a sealed bucket keeps the indexes
already delivered from it until it is merged or deleted.
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import Any

import numpy as np

from ..errors import BucketStoreError
from ..format.snapshot import BucketFile
from ..checking.store_check import describe_store

__all__ = ["PlotUnavailable", "due_times", "write_due_plot", "run"]

#: Bin widths a reader can count in, smallest first (milliseconds, label).
_BINS = [(1_000, "second"), (5_000, "5 s"), (10_000, "10 s"), (30_000, "30 s"), (60_000, "minute"),
         (300_000, "5 min"), (600_000, "10 min"), (900_000, "15 min"), (1_800_000, "30 min"),
         (3_600_000, "hour"), (10_800_000, "3 h"), (21_600_000, "6 h"), (43_200_000, "12 h"),
         (86_400_000, "day"), (604_800_000, "week")]
_MAX_BINS = 90
_MAX_SERIES = 8  # buckets drawn in their own colour; the rest are stacked together


class PlotUnavailable(Exception):
    """matplotlib (the ``plot`` extra) is not installed."""


def due_times(store: str) -> dict[str, list[tuple[str, np.ndarray]]]:
    """Per tracker, per sealed bucket (label, due times in ms), in key order. Damaged files are skipped."""
    doc = describe_store(store)
    out: dict[str, list[tuple[str, np.ndarray]]] = {}
    for name, tracker in doc["trackers"].items():
        series = []
        for b in tracker["buckets"]:
            if "error" in b or "in_flight" in b:
                continue
            try:
                bucket = BucketFile(b["file"])
                stamps = [bucket.read_segment(n).timestamps for n in range(1, bucket.segment_count + 1)]
            except (OSError, ValueError, BucketStoreError):
                continue  # damage is verify's to report; the plot draws what reads
            label = f"ledgers [{b.get('start_ledger', '?')}, {b.get('end_ledger', '?')}]"
            series.append((label, np.concatenate(stamps) if stamps else np.empty(0, dtype=np.int64)))
        out[name] = series
    return out


def _bin_width(span_ms: int) -> tuple[int, str]:
    for width, label in _BINS:
        if span_ms / width <= _MAX_BINS:
            return width, label
    return _BINS[-1]


def _import_pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib, the 'plot' extra: pip install 'bucketstore[plot]' "
                              "(or pip install -e '.[plot]' in a checkout)") from None
    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    return plt, mdates


def tick_labels(ticks: list[datetime]) -> list[str]:
    """A label for every major tick that reads on its own: ``22:25:10``, not ``10``; ``00:00``
    with its date under it where the day changes, not ``Nov-15`` in place of a time.

    One format for the whole axis, chosen by the tick spacing (seconds, minutes, days, months);
    below a day, the first tick and each tick on a new date also carry the date.
    """
    if len(ticks) < 2:
        return [f"{t:%Y-%m-%d %H:%M:%S}" for t in ticks]
    step = min((b - a).total_seconds() for a, b in zip(ticks, ticks[1:]))
    if step >= 28 * 86_400:
        return [f"{t:%b %Y}" for t in ticks]
    if step >= 86_400:
        return [f"{t:%b %d}" for t in ticks]
    fmt = "%H:%M:%S" if step < 60 else "%H:%M"
    labels = []
    for i, t in enumerate(ticks):
        new_day = i == 0 or t.date() != ticks[i - 1].date()
        labels.append(t.strftime(fmt) + (t.strftime("\n%b %d") if new_day else ""))
    return labels


def _label_time_axis(ax: Any, mdates: Any) -> None:
    """Major ticks where matplotlib's date locator puts them, each labelled by :func:`tick_labels`."""
    lo, hi = ax.get_xlim()  # autoscaled to the bars
    locator = mdates.AutoDateLocator(minticks=5, maxticks=12)
    values = [v for v in locator.tick_values(mdates.num2date(lo), mdates.num2date(hi)) if lo <= v <= hi]
    ticks = [mdates.num2date(v).astimezone(timezone.utc) for v in values]
    ax.set_xticks(values)
    ax.set_xticklabels(tick_labels(ticks))
    ax.set_xlim(lo, hi)
    year = f", {ticks[0]:%Y}" if ticks and not tick_labels(ticks)[0].endswith(f"{ticks[0]:%Y}") else ""
    ax.set_xlabel(f"due time (UTC{year})")


def write_due_plot(store: str, out_png: str) -> dict[str, int]:
    """Draw the due-time histogram of ``store`` into ``out_png``; return counts (indexes, buckets).

    :raises PlotUnavailable: matplotlib is not installed.
    """
    plt, mdates = _import_pyplot()
    data = due_times(store)
    trackers = sorted(data) or ["(no trackers)"]
    fig, axes = plt.subplots(len(trackers), 1, figsize=(11, 3.6 * len(trackers) + 0.6), squeeze=False)
    total_indexes = total_buckets = 0
    for ax, name in zip(axes[:, 0], trackers):
        series = [(label, t) for label, t in data.get(name, []) if len(t)]
        total_buckets += len(series)
        n = sum(len(t) for _, t in series)
        total_indexes += n
        ax.set_title(f"tracker {name!r}: {n:,} indexes in {len(series)} sealed bucket(s)", fontsize=10)
        if not series:
            ax.text(0.5, 0.5, "no sealed bucket holds an index", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        lo = min(int(t.min()) for _, t in series)
        hi = max(int(t.max()) for _, t in series)
        width, width_label = _bin_width(max(hi - lo, 1))
        edges = np.arange(lo // width * width, (hi // width + 2) * width, width, dtype=np.int64)
        big = set(sorted(range(len(series)), key=lambda i: -len(series[i][1]))[:_MAX_SERIES])
        shown = [s for i, s in enumerate(series) if i in big]  # in key order, for a readable legend
        rest = [s[1] for i, s in enumerate(series) if i not in big]
        if rest:
            shown.append((f"{len(rest)} other bucket(s)", np.concatenate(rest)))
        left = [datetime.fromtimestamp(e / 1000, tz=timezone.utc) for e in edges[:-1]]
        bottom = np.zeros(len(edges) - 1)
        for label, stamps in shown:
            counts, _ = np.histogram(stamps, bins=edges)
            ax.bar(left, counts, width=width / 86_400_000, align="edge", bottom=bottom,
                   label=f"{label}: {len(stamps):,}", linewidth=0)
            bottom += counts
        ax.set_ylabel(f"indexes due per {width_label}")
        _label_time_axis(ax, mdates)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="bucket: indexes",
                  title_fontsize=8, frameon=False)
    fig.suptitle(f"What is due when: {store}", fontsize=11)
    fig.text(0.01, 0.005, "Sealed buckets as their files record them: indexes still in a journal or the mutable "
             "bucket are not drawn; delivered ones stay in a bucket until it is merged or deleted.",
             fontsize=7, color="0.35", va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return {"indexes": total_indexes, "buckets": total_buckets}


def run(store: str, out_png: str) -> int:
    """The ``--plot`` flag: write the PNG, say so on stderr; exit 2 (one line) without matplotlib."""
    try:
        counts = write_due_plot(store, out_png)
    except PlotUnavailable as exc:
        print(f"bucketstore: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out_png}: due times of {counts['indexes']:,} indexes in {counts['buckets']} sealed bucket(s)",
          file=sys.stderr)
    return 0
