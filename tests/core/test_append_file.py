"""The journal's file through Python: whole appends, truncation, the owner's lock, clear errors."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core import AppendFile, file_len


def test_append_truncate_and_length(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = AppendFile(path)
    assert (path.stat().st_mode & 0o777) == 0o600
    journal.append(b"one\n")
    journal.append(b"two\n")
    assert path.read_bytes() == b"one\ntwo\n" and file_len(path) == 8
    journal.truncate()
    journal.append(b"three\n")
    assert path.read_bytes() == b"three\n"
    journal.close()
    journal.close()  # again: nothing
    with pytest.raises(OSError, match="closed"):
        journal.append(b"four\n")


def test_the_lock_tells_others_the_owner_lives(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = AppendFile(path)
    with pytest.raises(OSError, match="locked"):
        AppendFile(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):  # what gateway.store.sqlite.journal.live_count sees
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        journal.close()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a closed (or dead) owner's file is free
    finally:
        os.close(fd)


def test_missing_paths_are_os_errors(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="cannot stat"):
        file_len(tmp_path / "missing")
    with pytest.raises(OSError, match="cannot open"):
        AppendFile(tmp_path / "no" / "such" / "dir" / "journal.jsonl")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=2048), max_size=20))
def test_appends_are_kept_whole_and_in_order(
    tmp_path_factory: pytest.TempPathFactory, chunks: list[bytes]
) -> None:
    path = tmp_path_factory.mktemp("append") / "file"
    journal = AppendFile(path)
    for chunk in chunks:
        journal.append(chunk)
    journal.close()
    assert path.read_bytes() == b"".join(chunks)
