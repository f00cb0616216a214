"""AWS Signature Version 4 against AWS's own worked examples, and where credentials come from."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from gateway.providers.sigv4 import AwsCredentials, credentials, sign


def at(stamp: str) -> datetime.datetime:
    return datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)


def signature(headers: dict[str, str]) -> str:
    return headers["authorization"].rpartition("Signature=")[2]


def test_the_iam_list_users_example() -> None:
    """AWS's "Signature Version 4 signing process" example: GET ListUsers on IAM."""
    creds = AwsCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    headers = sign(
        "GET",
        "https://iam.amazonaws.com/?Action=ListUsers&Version=2010-05-08",
        {"content-type": "application/x-www-form-urlencoded; charset=utf-8"},
        b"",
        creds,
        "us-east-1",
        "iam",
        at("20150830T123600Z"),
    )
    assert headers["authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, "
        "SignedHeaders=content-type;host;x-amz-date, "
        "Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
    )
    assert headers["x-amz-date"] == "20150830T123600Z"


def test_the_s3_get_object_example() -> None:
    """The S3 documentation's header-based example (GET /test.txt with a Range): S3 encodes the
    path once, every other service twice."""
    creds = AwsCredentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    headers = sign(
        "GET",
        "https://examplebucket.s3.amazonaws.com/test.txt",
        {"range": "bytes=0-9", "x-amz-content-sha256": empty},
        b"",
        creds,
        "us-east-1",
        "s3",
        at("20130524T000000Z"),
    )
    assert "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date," in headers["authorization"]
    assert signature(headers) == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"


def test_a_session_token_is_sent_and_signed() -> None:
    creds = AwsCredentials("AKID", "secret", "token-1")
    headers = sign(
        "POST",
        "https://bedrock-runtime.us-east-1.amazonaws.com/model/m/converse",
        {},
        b"{}",
        creds,
        "us-east-1",
        "bedrock",
    )
    assert headers["x-amz-security-token"] == "token-1"
    assert "x-amz-security-token" in headers["authorization"].split("SignedHeaders=")[1].split(",")[0]


def test_a_model_id_with_a_colon_is_encoded_twice_in_the_canonical_path() -> None:
    creds = AwsCredentials("AKID", "secret")
    url = "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-v2%3A1/converse"
    when = at("20250101T000000Z")
    encoded = sign("POST", url, {}, b"{}", creds, "us-east-1", "bedrock", when)
    # The same path written with the colon unencoded is the same canonical request.
    plain = sign("POST", url.replace("%3A", ":"), {}, b"{}", creds, "us-east-1", "bedrock", when)
    assert signature(encoded) == signature(plain)


def test_credentials_from_the_environment_then_the_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "credentials"
    shared.write_text(
        "[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = s1\n"
        "[bedrock]\naws_access_key_id = AKIDPROF\naws_secret_access_key = s2\naws_session_token = t2\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(shared))
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s0")
    assert credentials() == AwsCredentials("AKIDENV", "s0")
    assert credentials("bedrock") == AwsCredentials("AKIDPROF", "s2", "t2")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    assert credentials() == AwsCredentials("AKIDFILE", "s1")
    assert credentials("nowhere") is None
    # The file is kept as read, and read again once it changes (rotated temporary credentials).
    shared.write_text("[bedrock]\naws_access_key_id = AKIDNEW\naws_secret_access_key = s3-rotated\n")
    assert credentials("bedrock") == AwsCredentials("AKIDNEW", "s3-rotated")
