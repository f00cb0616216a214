"""The process `gateway serve` becomes: Granian's supervisor, in a fresh interpreter that imports
Granian and nothing of the gateway (the workers load the app), so it stays small. A worker that
dies is started again; its replacement replays the dead one's journal and takes back its leases.

Usage (from gateway.cli only): python -m gateway.supervisor '{"host": ..., "port": ..., "workers": ...}'
"""

from __future__ import annotations

import json
import sys

from granian import Granian
from granian.constants import Interfaces, Loops

APP = "gateway.app:app_from_env"


def main(argv: list[str]) -> None:
    options = json.loads(argv[1])
    Granian(
        APP,
        factory=True,
        address=options["host"],
        port=options["port"],
        workers=options["workers"],
        interface=Interfaces.ASGI,
        loop=Loops.uvloop,
        log_access=False,
        backlog=4096,
        respawn_failed_workers=True,
    ).serve()


if __name__ == "__main__":
    main(sys.argv)
