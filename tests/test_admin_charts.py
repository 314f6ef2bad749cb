"""The admin charts are inert markup: data can never inject HTML, and the numbers add up."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from app.domain.admin.charts import (
    HISTOGRAM_COLOUR,
    STATUS_COLOURS,
    histogram_svg,
    states_over_time_svg,
)


def test_histogram_counts_every_value_and_reports_percentiles() -> None:
    values = [5.0] * 90 + [500.0] * 10
    svg = histogram_svg(values, "TTFT")
    counts = [int(n) for n in re.findall(r": (\d+)</title></rect>", svg)]
    assert sum(counts) == 100 and sorted(counts) == [10, 90]
    assert "n=100" in svg and "p50=5 ms" in svg and "p99=500 ms" in svg


def test_histogram_bars_have_a_colour_no_end_state_uses() -> None:
    fills = set(re.findall(r'<rect [^>]*fill="(#[0-9a-f]{6})"', histogram_svg([5.0, 50.0], "TTFT")))
    assert fills == {HISTOGRAM_COLOUR}
    assert HISTOGRAM_COLOUR not in STATUS_COLOURS.values()


def test_empty_chart_says_so() -> None:
    assert "no data yet" in histogram_svg([], "TTFT")


def test_states_chart_stacks_statuses_per_bucket_and_escapes_text() -> None:
    hour = datetime(2026, 11, 29, 8, tzinfo=UTC)
    buckets = [hour - timedelta(hours=1), hour]
    counts = [(hour, "completed", 3), (hour, "cancelled", 1), (buckets[0], "failed", 2)]
    svg = states_over_time_svg(counts, 'States <script>alert("x")</script>', buckets)
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert re.findall(r"completed: (\d+)", svg) == ["3"]
    assert re.findall(r"failed: (\d+)", svg) == ["2"]


def test_ratings_chart_pairs_up_and_down_per_day_and_escapes_text() -> None:
    from app.domain.admin.charts import ratings_per_day_svg

    day = datetime(2026, 11, 29, tzinfo=UTC)
    days = [day - timedelta(days=1), day]
    counts = [(day, "up", 4), (day, "down", 1), (days[0], "down", 2), (day - timedelta(9), "up", 7)]
    svg = ratings_per_day_svg(counts, "Ratings <b>", days)
    assert "<b>" not in svg and "&lt;b&gt;" in svg
    assert re.findall(r"(\d{4}-\d\d-\d\d) (up|down): (\d+)</title>", svg) == [
        ("2026-11-28", "down", "2"),
        ("2026-11-29", "up", "4"),
        ("2026-11-29", "down", "1"),
    ]  # a day outside the range is left out
    assert "no data yet" in ratings_per_day_svg([], "Ratings", days)


def test_chart_durations_read_like_the_pages() -> None:
    """As static/js/format.js writes them: "9.8 s", not "9832ms" or "9.832s"."""
    svg = histogram_svg([9832.0] * 3 + [125_000.0], "TTFT")
    assert "p50=9.8 s" in svg and "p99=2 min 5 s" in svg
    assert "9.832" not in svg and "9832" not in svg
