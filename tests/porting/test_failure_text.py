"""The failure text a user reads: exception, message, the policy's frame; the same from a log."""

from __future__ import annotations

import traceback

from rlkube.failure import describe_exception, failure_from_log


class Broken(Exception):
    pass


def rollout_step() -> None:
    raise Broken("the head has 3 outputs, the action space 2")


def call_policy() -> None:
    rollout_step()


def test_a_live_exception_names_its_type_message_and_the_user_s_frame() -> None:
    try:
        call_policy()
    except Broken as exc:
        failure = describe_exception(exc, pod="job-eval-0")
    assert failure.reason == "RolloutStepFailed"
    assert failure.exception == "Broken"
    assert failure.detail == "the head has 3 outputs, the action space 2"
    assert failure.frame is not None
    assert failure.frame.function == "rollout_step"
    assert failure.frame.file.endswith("test_failure_text.py")
    assert failure.message.startswith("job-eval-0: Broken: the head has 3 outputs")
    assert "in rollout_step (" in failure.message
    assert 'raise Broken("the head has 3 outputs' in failure.message


def test_the_traceback_a_process_printed_gives_the_same_failure() -> None:
    try:
        call_policy()
    except Broken as exc:
        live = describe_exception(exc)
        printed = (
            "INFO starting\nTraceback (most recent call last):\n"
            + "".join(traceback.format_tb(exc.__traceback__))
            + "tests.porting.test_failure_text.Broken: the head has 3 outputs, the action space 2\n"
        )
    assert failure_from_log(printed) == live
    assert failure_from_log("no traceback here") is None
