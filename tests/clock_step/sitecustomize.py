"""A wall clock a test can step (tests/gateway/test_clock_step.py): on PYTHONPATH, with
GATEWAY_TEST_CLOCK_FILE naming a file that holds an offset in nanoseconds, `time.time` and
`time.time_ns` of every process started so read the real clock plus that offset, as if the
machine's clock had been stepped (an NTP correction). The monotonic clock is left alone, as a step
leaves it. Not part of the gateway: only the test's processes import it."""

import os
import time

_FILE = os.environ.get("GATEWAY_TEST_CLOCK_FILE")
if _FILE:
    _real_ns = time.time_ns
    _read = [0, 0]  # when the file was last read (monotonic ns), and its offset

    def _offset(path: str = _FILE) -> int:
        now = time.monotonic_ns()
        if now - _read[0] > 5_000_000:  # read at most every 5 ms
            try:
                with open(path) as f:
                    _read[1] = int(f.read().strip() or 0)
            except (OSError, ValueError):
                pass
            _read[0] = now
        return _read[1]

    def _time_ns() -> int:
        return _real_ns() + _offset()

    def _time() -> float:
        return _time_ns() / 1e9

    time.time_ns = _time_ns
    time.time = _time
