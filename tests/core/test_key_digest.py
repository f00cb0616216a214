"""The Rust core's key digest is SHA-256 of the key's UTF-8 text, byte for byte what hashlib gives:
keys stored by any version are found by every other."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.auth import generate_key, hash_key
from gateway.core import key_digest


@given(st.text())
def test_the_digest_is_sha256_of_the_utf8_text(text: str) -> None:
    try:
        expected = hashlib.sha256(text.encode()).digest()
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8 form: refused alike
        with pytest.raises(UnicodeEncodeError):
            key_digest(text)
        return
    assert key_digest(text) == expected


def test_generated_keys_hash_as_stored() -> None:
    key = generate_key()
    assert hash_key(key) == hashlib.sha256(key.encode()).digest()
    assert len(hash_key(key)) == 32
