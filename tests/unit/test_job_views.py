"""What a finished Job's pod says, as the step's error: the runtime's reason when it says more
than an exit (OOMKilled), and why a container never ran (an image that cannot be pulled)."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from reversi.adapters.kube import ended_message, never_ran, pod_trouble


def test_an_oom_kill_is_named_before_its_exit_code():
    assert ended_message(137, "OOMKilled", None) == "OOMKilled: exit code 137"
    assert ended_message(137, "OOMKilled", "partial write\n") == "OOMKilled: partial write"


def test_a_plain_exit_keeps_the_program_s_own_words():
    assert ended_message(3, "Error", "refund refused: 409\n") == "refund refused: 409"
    assert ended_message(3, "Error", "") == "exit code 3"
    assert ended_message(0, "Completed", None) == ""


@given(st.integers(min_value=1, max_value=255), st.sampled_from(["Error", "Completed", None]),
       st.one_of(st.none(), st.text(max_size=40)))
def test_a_failed_exit_never_reads_as_empty(code, reason, message):
    """A non-zero exit always leaves an error to report (never an empty one, read as no error)."""
    assert ended_message(code, reason, message).strip()


def test_a_container_waiting_on_its_image_says_so():
    waiting = [("ImagePullBackOff", 'Back-off pulling image "localhost/x:1"')]
    assert never_ran(waiting) == 'ImagePullBackOff: Back-off pulling image "localhost/x:1"'
    assert never_ran([("ContainerCreating", None)]) is None
    assert never_ran([]) is None


def test_a_pod_that_never_ran_says_its_newest_troubles_with_the_image_named():
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    events = [("Failed", 'Failed to pull image "localhost/x:1": not found', t0),
              ("BackOff", 'Back-off pulling image "localhost/x:1"', t0 + dt.timedelta(seconds=5)),
              ("Failed", "Error: ImagePullBackOff", t0 + dt.timedelta(seconds=6)),
              ("BackOff", 'Back-off pulling image "localhost/x:1"', t0 + dt.timedelta(seconds=4))]
    assert pod_trouble(events) == 'Failed: Error: ImagePullBackOff; BackOff: Back-off pulling image "localhost/x:1"'
    assert pod_trouble(events[:1]) == 'Failed: Failed to pull image "localhost/x:1": not found'
    assert pod_trouble([("Failed", "undated", None)]) == "Failed: undated"
    assert pod_trouble([]) is None
