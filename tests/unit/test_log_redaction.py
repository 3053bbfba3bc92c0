"""Every logged exception is rendered by one redacting function: messages cut to their first line.

Why: Postgres' DETAIL and CONTEXT lines ("Failing row contains (...)") quote the data; the projector cut
them from its tracebacks, but the role loops' `exc_info=exc` printed them whole, and causes were printed
in full whatever the record.
"""

from __future__ import annotations

import sys

from infra.logging import redact_exc_info

SECRET = "se" + "cret"  # not spelt out in the source lines a traceback quotes


def chained() -> RuntimeError:
    try:
        try:
            raise ValueError(f"new row violates check constraint\nDETAIL:  Failing row contains ({SECRET}).")
        except ValueError as inner:
            raise RuntimeError(f"apply failed\nCONTEXT: {SECRET}") from inner
    except RuntimeError as outer:
        return outer


def test_an_exception_and_its_causes_are_rendered_without_their_detail_lines() -> None:
    rendered = redact_exc_info(None, "error", {"event": "gateway.crashed", "exc_info": chained()})
    text = rendered["exception"]
    assert "exc_info" not in rendered
    assert "ValueError: new row violates check constraint" in text and "direct cause" in text
    assert text.endswith("RuntimeError: apply failed") and SECRET not in text


def test_the_exception_being_handled_and_an_exc_info_tuple_are_redacted_too() -> None:
    try:
        raise chained()
    except RuntimeError:
        handled = redact_exc_info(None, "error", {"event": "batch.crashed", "exc_info": True})
        as_tuple = redact_exc_info(None, "error", {"event": "process.crashed", "exc_info": sys.exc_info()})
    for rendered in (handled, as_tuple):
        assert "RuntimeError: apply failed" in rendered["exception"] and SECRET not in rendered["exception"]
    assert "exception" not in redact_exc_info(None, "info", {"event": "x", "exc_info": False})
