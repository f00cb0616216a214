"""The Rust core has one face in Python (gateway.core), and its errors are the gateway's own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway import core
from gateway.errors import GatewayError

PACKAGE = Path(core.__file__).parent


def test_only_gateway_core_imports_the_extension() -> None:
    importers = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if re.search(r"^\s*(from\s+\S*_core\s+import|import\s+\S*\b_core\b)", path.read_text(), re.M)
    ]
    assert importers == ["core.py"]


def test_core_errors_are_gateway_errors_raised_by_the_extension() -> None:
    with pytest.raises(core.UnknownEncodingError) as unknown:
        core.count_tokens("text", "gpt2")  # type: ignore[arg-type]
    with pytest.raises(core.InvalidJsonError) as invalid:
        core.set_json_id(b"[1]", "chatcmpl-x")
    for raised in (unknown.value, invalid.value):
        assert isinstance(raised, core.CoreError)
        assert isinstance(raised, GatewayError)
        assert isinstance(raised, ValueError)
        # Callers answer for bad bytes themselves; one that escapes them is the gateway's failure.
        assert (raised.code, raised.status) == ("api_error", 500)
    assert "gpt2" in str(unknown.value) and unknown.value.message == str(unknown.value)


def test_an_invalid_limit_is_a_core_error() -> None:
    with pytest.raises(core.CoreError):
        core.TokenBucket(0, 0, 0, 0)
