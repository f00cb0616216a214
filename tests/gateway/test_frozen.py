"""`@frozen` records: frozen to the type checker, plain and quick at run time, equal and hashed by
their fields as frozen dataclasses are."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

from mypy import api

from gateway.frozen import frozen
from gateway.pricing import Usage
from gateway.store import UsageRecord


@frozen
class _Pair:
    a: int
    b: str = "x"


def test_records_compare_and_hash_by_their_fields_and_have_no_dict() -> None:
    assert _Pair(1) == _Pair(1, "x") and _Pair(1) != _Pair(2)
    assert hash(_Pair(1)) == hash(_Pair(1, "x"))
    assert {_Pair(1), _Pair(1)} == {_Pair(1)}
    assert not hasattr(_Pair(1), "__dict__")
    assert dataclasses.replace(_Pair(1), b="y") == _Pair(1, "y")
    assert dataclasses.is_dataclass(Usage) and dataclasses.is_dataclass(UsageRecord)


def test_mypy_refuses_an_assignment_to_a_field(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        textwrap.dedent(
            """
            from gateway.pricing import Usage
            usage = Usage(prompt_tokens=1)
            usage.prompt_tokens = 2
            """
        )
    )
    out, _, status = api.run([str(sample), "--no-incremental", "--follow-imports=silent"])
    assert status == 1, out
    assert 'Property "prompt_tokens" defined in "Usage" is read-only' in out, out
