"""Credentials in URLs never reach a log line or a banner (issue 10, item 5)."""

from __future__ import annotations

import pytest

from tether.redact import redact_url


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "cannot reach http://user:hunter2@127.0.0.1:9/v1",
            "cannot reach http://***@127.0.0.1:9/v1",
        ),
        ("http://sk-live-token@127.0.0.1:9/v1", "http://***@127.0.0.1:9/v1"),  # a token as user
        ("https://h/v1?api_key=hunter2&x=1", "https://h/v1?api_key=***&x=1"),
        ("https://h/v1?x=1&token=hunter2", "https://h/v1?x=1&token=***"),
        ("postgresql://app:hunter2@db:5432/tether", "postgresql://***@db:5432/tether"),
        ("https://example.com/docs", "https://example.com/docs"),
        ("mail ada@example.com", "mail ada@example.com"),  # no URL, nothing to mask
    ],
)
def test_credentials_in_urls_are_masked(text: str, shown: str) -> None:
    assert redact_url(text) == shown
    assert "hunter2" not in redact_url(text)
