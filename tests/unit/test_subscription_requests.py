"""`sub.list` requests as the gateway decodes them: defaults, bounds, strictness."""

import pytest

from schemas.errors import InvalidRequest
from subscriptions.requests import decode_request


def test_defaults_are_open_subscriptions_and_a_thousand_at_most() -> None:
    request = decode_request("list", b"{}")
    assert (request.all, request.limit) == (False, 1000)


@pytest.mark.parametrize("body", [b'{"limit": 0}', b'{"limit": 2001}', b'{"all": "yes"}', b'{"scope": "x"}'])
def test_out_of_bounds_or_unknown_fields_are_invalid_requests(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        decode_request("list", body)
