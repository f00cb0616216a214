"""The fields of the management API and of `gateway admin`: money, limits, times, names.

Each reader takes one value as decoded from JSON (numbers arrive as int or as Decimal read from their
literal digits, never as binary floats) and the name of its field, and returns it checked, or raises
400 invalid_request naming that field. money_text writes amounts back for people (times: clock.rfc3339).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Final

from .clock import rfc3339
from .config import decimal_places
from .errors import GatewayError, invalid_request
from .store import LIMIT_RESETS
from .store.records import ACCOUNT_ID_PREFIX

# Bounds that keep every balance inside Decimal's 28 significant digits, so additions stay exact.
MAX_MONEY: Final = Decimal(10) ** 12
MONEY_PLACES: Final = 12
MAX_RATE: Final = 10**12
MAX_NAME_CHARS: Final = 200
MAX_NOTE_CHARS: Final = 1000
# 9999-12-31T23:59:59.999Z: the last instant an RFC 3339 timestamp can show.
LATEST_MS: Final = 253_402_300_799_999
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)
_PLAIN_DECIMAL: Final = re.compile(r"-?[0-9]+(\.[0-9]+)?")


def money(value: object, param: str, *, positive: bool = False) -> Decimal:
    """US dollars: a decimal string such as "12.50" (or an exact JSON number); never negative."""
    amount = _exact_decimal(value)
    if amount is None:
        raise invalid_request(
            f'`{param}` must be an amount of US dollars in plain decimal digits, e.g. "12.50".', param
        )
    if amount < 0 or (positive and amount == 0):
        raise invalid_request(f"`{param}` must be {'positive' if positive else 'zero or more'}.", param)
    if amount >= MAX_MONEY:
        raise invalid_request(f"`{param}` must be less than {MAX_MONEY:f}.", param)
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and -exponent > MONEY_PLACES:
        # Trailing zeros are no places (money review: "10.5000000000000" and 1.0e-12 were refused).
        places = decimal_places(amount)
        if places > MONEY_PLACES:
            raise invalid_request(f"`{param}` may have at most {MONEY_PLACES} decimal places.", param)
        amount = amount.quantize(Decimal(1).scaleb(-places))
    return abs(amount)  # abs: "-0" becomes 0


def _exact_decimal(value: object) -> Decimal | None:
    if isinstance(value, str):
        return Decimal(value) if _PLAIN_DECIMAL.fullmatch(value) else None
    if isinstance(value, Decimal) or (isinstance(value, int) and not isinstance(value, bool)):
        return Decimal(value)
    return None


def _null(param: str) -> str:
    """How the caller says "no value": JSON's null, or "none" on the command line (--flags)."""
    return '"none"' if param.startswith("--") else "null"


def optional_money(value: object, param: str) -> Decimal | None:
    return None if value is None else money(value, param)


def rate_limit(value: object, param: str) -> int | None:
    """A per-minute limit: a positive integer, or None for no limit."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_RATE:
        raise invalid_request(f"`{param}` must be a positive integer or {_null(param)}.", param)
    return value


def limit_reset(value: object, param: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and value in LIMIT_RESETS:
        return value
    raise invalid_request(f"`{param}` must be one of {', '.join(LIMIT_RESETS)}, or {_null(param)}.", param)


# Unix milliseconds below this (1973-03-03) are refused as a moment: such a number is far more
# likely Unix seconds (time review: an `expires_at` of 1798761600, meant as 2027, made a key that
# had expired in 1970). 0 stays a deliberate "long ago".
SECONDS_LOOK_MS: Final = 10**11


def expiry(value: object, param: str) -> int | None:
    """A moment as Unix milliseconds, or an ISO 8601 string with its offset (e.g.
    2026-12-31T23:59:59Z); None for never."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        ms = value
        if 0 < ms < SECONDS_LOOK_MS:  # Unix seconds, as OpenAI's `expires_at` is: not taken as 1970
            raise invalid_request(
                f"`{param}` is in Unix milliseconds: {ms} would be {rfc3339(ms)}. Unix seconds are a"
                f" thousandth of it ({ms * 1000} is {rfc3339(ms * 1000)}).",
                param,
            )
    elif isinstance(value, str):
        ms = _iso_ms(value, param)
    else:
        raise _bad_moment(param)
    if not 0 <= ms <= LATEST_MS:
        raise invalid_request(f"`{param}` must lie between 1970 and the year 9999.", param)
    return ms


def _iso_ms(text: str, param: str) -> int:
    if text.endswith("z"):  # RFC 3339 (5.6) allows it lower case
        text = text[:-1] + "Z"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise _bad_moment(param) from None
    if moment.tzinfo is None:
        raise invalid_request(f"`{param}` must say its time zone, e.g. 2026-12-31T23:59:59Z.", param)
    return (moment - _EPOCH) // _MS


def _bad_moment(param: str) -> GatewayError:
    return invalid_request(
        f"`{param}` must be Unix milliseconds, an ISO 8601 time such as 2026-12-31T23:59:59Z,"
        f" or {_null(param)}.",
        param,
    )


def name(value: object, param: str) -> str:
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        raise invalid_request(f"`{param}` must be a non-empty string of printable characters.", param)
    if len(value) > MAX_NAME_CHARS:
        raise invalid_request(f"`{param}` may have at most {MAX_NAME_CHARS} characters.", param)
    return value


def account_name(value: object, param: str) -> str:
    """An account's name: may not look like an account's id. Where either names an account (the
    CLI's --account), one account's name would stand for another's id (review: a top-up went to
    the account named after another's id)."""
    text = name(value, param)
    if text.startswith(ACCOUNT_ID_PREFIX):
        raise invalid_request(
            f"`{param}` may not begin with {ACCOUNT_ID_PREFIX!r}, as account ids do.", param
        )
    return text


def note(value: object, param: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_NOTE_CHARS:
        raise invalid_request(f"`{param}` must be a string of at most {MAX_NOTE_CHARS} characters.", param)
    return value


def model_names(value: object, param: str, known: Collection[str]) -> frozenset[str] | None:
    """A list of configured model names, or None for every model."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise invalid_request(
            f"`{param}` must be a list of model names, or {_null(param)} for every model.", param
        )
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise invalid_request(f"`{param}` names models that are not configured: {unknown}.", param)
    return frozenset(value)


def money_text(value: Decimal) -> str:
    return f"{value:f}"  # plain digits, never exponent notation ("0.0000012", not "1.2E-6")


# ---------------------------------------------------------------- the fields of each operation

Reader = Callable[[Any, str], Any]


def account_fields(configured: Collection[str]) -> dict[str, Reader]:
    """An account's settable fields (create and update; create also takes `balance`)."""
    return {
        "name": account_name,
        "allowed_models": lambda value, param: model_names(value, param, configured),
        "rpm_limit": rate_limit,
        "tpm_limit": rate_limit,
    }


KEY_FIELDS: Final[Mapping[str, Reader]] = {
    "name": name,
    "credit_limit": optional_money,
    "limit_reset": limit_reset,
    "expires_at": expiry,
}
TOP_UP_FIELDS: Final[Mapping[str, Reader]] = {
    "amount": lambda value, param: money(value, param, positive=True),
    "note": note,
}


def read_fields(
    given: Mapping[str, Any],
    readers: Mapping[str, Reader],
    required: Collection[str] = (),
    param: Callable[[str], str] = str,
) -> dict[str, Any]:
    """Each given field read by its reader, errors naming it as `param(field)` says (the JSON field
    for the management API, the option for `gateway admin`). Unknown fields are refused, so a
    misspelt one is never silently ignored; a field left out is left out of the result."""
    unknown = sorted(given.keys() - readers.keys())
    if unknown:
        raise invalid_request(
            f"Unknown field `{unknown[0]}`; the fields are: {', '.join(readers)}.", unknown[0]
        )
    for field in required:
        if field not in given:
            raise invalid_request(f"`{param(field)}` is required.", param(field))
    return {field: readers[field](value, param(field)) for field, value in given.items()}


MAX_PAGE = 1000
DEFAULT_PAGE = 100


def page_size(value: str | None, param: str, default: int = DEFAULT_PAGE, maximum: int = MAX_PAGE) -> int:
    """A list's `limit` query parameter: 1 to `maximum`, `default` when absent."""
    if value is None:
        return default
    if not value.isdigit() or not 1 <= int(value) <= maximum:
        raise invalid_request(f"`{param}` must be a whole number from 1 to {maximum}.", param)
    return int(value)
