"""AWS Signature Version 4 (for Bedrock), and the AWS credentials a channel signs with.

A small implementation of the published algorithm, checked against AWS's own worked examples
(tests/gateway/test_sigv4.py): the canonical request (method, URI encoded per segment, and
encoded again for every service but S3; sorted query; lower-cased, trimmed, sorted headers; the
payload's SHA-256), the string to sign, the key derived from the secret by date, region, service
and "aws4_request", and the Authorization header. Credentials come from the usual environment
variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or from a profile of the
shared credentials file (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials).
"""

from __future__ import annotations

import configparser
import datetime
import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"


@dataclass(frozen=True, slots=True)
class AwsCredentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None


def credentials(profile: str | None = None) -> AwsCredentials | None:
    """The environment's credentials, or (with `profile`, or when the environment has none) the
    profile's from the shared credentials file; None when neither has any."""
    if profile is None:
        key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        if key and secret:
            return AwsCredentials(key, secret, os.environ.get("AWS_SESSION_TOKEN") or None)
    name = profile or os.environ.get("AWS_PROFILE") or "default"
    path = Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or Path.home() / ".aws" / "credentials")
    return _profiles(path).get(name)


# The shared credentials file as last read, by path: read again only when it changes (every signed
# request asks for credentials; a tool refreshing temporary ones rewrites the file).
_read: dict[Path, tuple[tuple[int, int], dict[str, AwsCredentials]]] = {}


def _profiles(path: Path) -> dict[str, AwsCredentials]:
    try:
        stat = path.stat()
    except OSError:
        return {}
    stamp = (stat.st_mtime_ns, stat.st_size)
    known = _read.get(path)
    if known is not None and known[0] == stamp:
        return known[1]
    parser = configparser.ConfigParser()
    try:
        parser.read(path)
    except (OSError, configparser.Error):
        return {}
    profiles = {}
    for name in parser.sections():
        section = parser[name]
        key, secret = section.get("aws_access_key_id"), section.get("aws_secret_access_key")
        if key and secret:
            profiles[name] = AwsCredentials(key, secret, section.get("aws_session_token") or None)
    _read[path] = (stamp, profiles)
    return profiles


def _encode_path(path: str, twice: bool) -> str:
    segments = [quote(s, safe="-_.~") for s in (path or "/").split("/")]
    if twice:
        segments = [quote(s, safe="-_.~") for s in segments]
    return "/".join(segments) or "/"


def _canonical_query(query: str) -> str:
    pairs = sorted(
        (quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in parse_qsl(query, keep_blank_values=True)
    )
    return "&".join(f"{k}={v}" for k, v in pairs)


def _key(secret: str, date: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sign(
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
    creds: AwsCredentials,
    region: str,
    service: str,
    now: datetime.datetime | None = None,
) -> dict[str, str]:
    """`headers` with what signs the request added: host, x-amz-date, x-amz-security-token (for
    temporary credentials) and Authorization. Every header given is signed. The URL's path is taken
    as already percent-encoded (as it will be sent)."""
    when = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%dT%H%M%SZ")
    parts = urlsplit(url)
    signed = {k.lower(): " ".join(v.strip().split()) for k, v in headers.items()}
    signed.setdefault("host", parts.netloc)
    signed["x-amz-date"] = when
    if creds.session_token:
        signed["x-amz-security-token"] = creds.session_token
    names = sorted(signed)
    payload_hash = hashlib.sha256(body).hexdigest()
    canonical = "\n".join(
        [
            method,
            _encode_path(unquote(parts.path), twice=service != "s3"),
            _canonical_query(parts.query),
            "".join(f"{n}:{signed[n]}\n" for n in names),
            ";".join(names),
            payload_hash,
        ]
    )
    scope = f"{when[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, when, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    signature = hmac.new(
        _key(creds.secret_access_key, when[:8], region, service), to_sign.encode(), hashlib.sha256
    )
    out = {**headers, "x-amz-date": when}
    if creds.session_token:
        out["x-amz-security-token"] = creds.session_token
    out["authorization"] = (
        f"{ALGORITHM} Credential={creds.access_key_id}/{scope}, SignedHeaders={';'.join(names)}, "
        f"Signature={signature.hexdigest()}"
    )
    return out
