"""The format of the gateway's log records (`[logs] format`), shared by the workers' loggers
(gateway.telemetry.logs) and the supervisor's (gateway.supervisor, which imports nothing heavier)."""

from __future__ import annotations

import datetime as dt
import logging
import sys
from typing import Any, Final

import orjson

TEXT_FORMAT: Final = "%(asctime)s %(levelname)-7s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def uses_json(format_: str) -> bool:
    """Whether `[logs] format` means JSON here: "json", or "auto" with stderr not a terminal."""
    return format_ == "json" or (format_ == "auto" and not sys.stderr.isatty())


def formatter(format_: str) -> logging.Formatter:
    return JsonFormatter() if uses_json(format_) else logging.Formatter(TEXT_FORMAT)
