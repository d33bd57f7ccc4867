"""reversi-admission drops kopf's ERROR record of an admission refusal (a refusal is the webhook
doing its job) and keeps a handler's crash, judging by the exception kopf is handling when it
logs, never by kopf's wording (reversi.entrypoints.admission.RefusalsAreNotErrors). These records
are written the way kopf writes them; tests/integration/test_kopf_behind_the_webhook_server.py runs kopf itself."""

from __future__ import annotations

import logging

import kopf
import pytest

from reversi.entrypoints.admission import RefusalsAreNotErrors
from tests.helpers import KeptRecords


@pytest.fixture
def objects():
    """A logger standing in for kopf's ``kopf.objects``, with the filter as reversi-admission adds it."""
    logger = logging.getLogger("test.kopf.objects")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    kept = KeptRecords()
    logger.addHandler(kept)
    logger.addFilter(RefusalsAreNotErrors())
    yield logger, kept.records
    logger.removeHandler(kept)
    logger.filters.clear()


def _handle(logger: logging.Logger, error: Exception) -> None:
    """What kopf does with a webhook handler's exception: a permanent error (an AdmissionError is
    one) is logged at ERROR without the exception; any other with its traceback."""
    try:
        raise error
    except kopf.PermanentError as e:
        logger.error(f"Webhook 'validate-run' failed permanently: {e}")
    except Exception as e:  # as kopf's execution does
        logger.exception(f"Webhook 'validate-run' failed with an exception and will stop now: {e}")


def test_a_refusal_is_not_logged_at_error(objects):
    logger, records = objects
    _handle(logger, kopf.AdmissionError("Run shop/r: a new run has no rollback to acknowledge", code=422))
    assert records == []


def test_the_filter_does_not_read_the_wording(objects):
    """Worded in any other way, a refusal is still dropped, and a crash worded like a refusal is kept."""
    logger, records = objects
    try:
        raise kopf.AdmissionError("no")
    except kopf.AdmissionError:
        logger.error("handler x said no")
    logger.error("Webhook 'validate-run' failed permanently: something broke")  # nothing is being handled
    assert [r.getMessage() for r in records] == ["Webhook 'validate-run' failed permanently: something broke"]


def test_a_crash_is_still_logged_at_error_with_its_traceback(objects):
    logger, records = objects
    _handle(logger, RuntimeError("a bug"))
    [record] = records
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None and isinstance(record.exc_info[1], RuntimeError)


def test_other_permanent_errors_and_lower_levels_are_kept(objects):
    logger, records = objects
    _handle(logger, kopf.PermanentError("not a refusal"))
    try:
        raise kopf.AdmissionError("refused")
    except kopf.AdmissionError:
        logger.info("Webhook 'validate-run' refused")  # below ERROR: the filter leaves it to the level
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.ERROR, "Webhook 'validate-run' failed permanently: not a refusal"),
        (logging.INFO, "Webhook 'validate-run' refused")]
