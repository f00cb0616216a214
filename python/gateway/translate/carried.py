"""What a request translation carries of the request (spec 1.3: the rest is dropped), for the
request log's dropped parameters in the request's own words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple


class Carried(NamedTuple):
    """`read`: the fields of the request the translation carries (the others are dropped).
    `field_of`: the request's field each translated field came from, where the names differ (a
    translated field the model does not take is named as the request said it)."""

    read: frozenset[str]
    field_of: Mapping[str, str]
