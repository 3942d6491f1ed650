"""The summary says why no communication was hidden when one gradient bucket is the cause."""

from __future__ import annotations

import pytest

from scaledl.train.metrics import overlap_note


def test_one_bucket_and_no_overlap_is_explained_with_the_fix() -> None:
    note = overlap_note(0.0, [76_840], 25.0)
    assert note == ("all 0.073 MiB of gradients fit one 25 MiB bucket, which starts only once "
                    "backward has ended; a --bucket-mb below 0.073 starts buckets during "
                    "backward, which pays off when backward takes longer than their reduction")


@pytest.mark.parametrize(("hidden", "buckets"), [
    (None, [76_840]),            # one worker: no communication
    (0.0, [40_000, 36_840]),     # several buckets: the measurement speaks for itself
    (0.6, [76_840]),             # overlap was measured
    (0.0, []),                   # a strategy without buckets
])
def test_nothing_to_explain(hidden: float | None, buckets: list[int]) -> None:
    assert overlap_note(hidden, buckets, 25.0) is None
