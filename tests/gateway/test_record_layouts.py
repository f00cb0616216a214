"""The column layouts the stores, the settlement journal and the request path's positional record
construction (request_log.entry, billing._record) all rely on: each record's fields, in order."""

from __future__ import annotations

import dataclasses

from gateway.store.records import LOG_COLUMNS, USAGE_COLUMNS, RequestLog, UsageRecord


def test_log_columns_are_the_request_logs_fields_in_order() -> None:
    assert tuple(f.name for f in dataclasses.fields(RequestLog)) == LOG_COLUMNS


def test_usage_columns_are_the_usage_records_fields_in_order() -> None:
    assert tuple(f.name for f in dataclasses.fields(UsageRecord)) == USAGE_COLUMNS
