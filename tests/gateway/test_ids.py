"""Ids: time-ordered (so the store's indexes take them at one end), unguessable, and never the same
in two processes forked from one."""

from __future__ import annotations

import os
import re
import time

from gateway.ids import request_id, response_id

ID = re.compile(r"chatcmpl-([0-9a-f]{12})([0-9a-f]{20})")


def test_ids_start_with_their_time_and_sort_in_order() -> None:
    before = time.time_ns() // 1_000_000
    ids = [response_id("chatcmpl-") for _ in range(2000)]
    after = time.time_ns() // 1_000_000
    times = []
    for made in ids:
        match = ID.fullmatch(made)
        assert match, made
        times.append(int(match[1], 16))
    assert before <= times[0] and times[-1] <= after
    assert times == sorted(times)
    assert len(set(ids)) == len(ids)
    # The random part differs between ids made in the same millisecond.
    assert len({made[-20:] for made in ids}) == len(ids)
    assert re.fullmatch(r"req_[0-9a-f]{32}", request_id())


def test_a_forked_child_does_not_reuse_the_parents_random_bits() -> None:
    response_id("x-")  # the parent has random bytes read ahead
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next id's random part
        os.write(write, response_id("x-")[-20:].encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = response_id("x-")[-20:]
    assert len(child) == 20 and child != parent
