"""Skipping a batch whose loss was non-finite twice (issue 12 §1): what a rank reads from
``SUPERVISOR_SKIP_STEPS`` and what ``Worker.skip_batch`` answers a training loop.

The controller asks for a skip (``nonfinite.skip_batches``) by listing the step in the next
launch's environment; the loop calls ``skip_batch(step)`` before every step and consumes that
step's batch without an optimizer step when it answers True (examples/train.py). A skip must
happen exactly as many times as the step is listed: once more and the job silently loses a good
batch, once less and the NaN recurs and the job stops.
"""

from __future__ import annotations

import pytest

from supervisor.protocol import Env
from supervisor.worker.runtime import Worker
from supervisor.worker.session import Session, SessionError


def test_the_variable_is_named_as_the_controller_sets_it():
    assert Env.SKIP_STEPS == "SUPERVISOR_SKIP_STEPS"


@pytest.mark.parametrize("value, expected", [
    ("", {}),
    ("9", {9: 1}),
    ("9,12", {9: 1, 12: 1}),
    (" 9 , 12 ,", {9: 1, 12: 1}),  # spaces and a trailing comma are harmless
    ("9,9", {9: 2}),  # listed twice: skip two batches at that step
    ("12,9,12", {12: 2, 9: 1}),
])
def test_skip_steps_parse(value, expected):
    assert Session.from_env({Env.SKIP_STEPS: value}).skip_steps == expected


def test_no_variable_no_skips():
    assert Session.from_env({}).skip_steps == {}


@pytest.mark.parametrize("value", ["0", "-3", "x", "9;12", "1.5", "9,,x"])
def test_a_malformed_skip_list_is_refused_at_start_up(value):
    with pytest.raises(SessionError, match="SUPERVISOR_SKIP_STEPS"):
        Session.from_env({Env.SKIP_STEPS: value})


def worker(value: str) -> Worker:
    return Worker(Session.from_env({Env.SKIP_STEPS: value}))


def test_skip_batch_is_true_once_for_a_listed_step_then_false():
    w = worker("9")
    assert [w.skip_batch(s) for s in range(1, 9)] == [False] * 8  # steps before it train
    assert w.skip_batch(9) is True
    assert w.skip_batch(9) is False  # the next batch trains as step 9
    assert w.skip_batch(9) is False
    assert w.skip_batch(10) is False


def test_a_step_listed_twice_is_skipped_twice():
    w = worker("9,9")
    assert [w.skip_batch(9) for _ in range(4)] == [True, True, False, False]


def test_several_steps_each_skip_on_their_own():
    w = worker("12,9")
    assert w.skip_batch(12) is True  # order of asking does not matter
    assert w.skip_batch(9) is True
    assert (w.skip_batch(9), w.skip_batch(12), w.skip_batch(10)) == (False, False, False)


def test_without_the_variable_nothing_is_ever_skipped():
    w = Worker(Session.from_env({}))
    assert not any(w.skip_batch(s) for s in range(1, 50))


def test_the_loop_of_the_example_consumes_one_batch_more_and_still_takes_every_step():
    # examples/train.py's loop shape: skip -> consume the batch, do not advance the step
    w = worker("3")
    batches = iter(range(100))
    trained: list[tuple[int, int]] = []
    step = 0
    while step < 5:
        if w.skip_batch(step + 1):
            next(batches)
            continue
        trained.append((step + 1, next(batches)))
        step += 1
    assert trained == [(1, 0), (2, 1), (3, 3), (4, 4), (5, 5)]  # batch 2 (step 3's) was skipped
