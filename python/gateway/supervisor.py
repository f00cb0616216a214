"""The process `gateway serve` becomes: Granian's supervisor, in a fresh interpreter that imports
Granian and nothing of the gateway's request path (the workers load the app), so it stays small. A
worker that dies is started again; its replacement replays the dead one's journal and takes back
its leases.

Beyond Granian's own supervisor:
- Notice: a worker about to be stopped gets SIGUSR1 `[server] drain_notice_seconds` before its
  SIGTERM; it serves on, ending each connection after its answer (gateway.drain).
- SIGTERM: workers drain (gateway.drain); one still running drain_seconds + KILL_GRACE_SECONDS
  after the signal is killed.
- SIGHUP (or POST /admin/v1/config/reload): the configuration file is checked first and a bad one
  refused, the old workers serving on; then each worker is replaced in turn, the new one started
  and listening before the old one is told to drain. A request is served by one worker from start
  to end, so it sees the old configuration or the new one, never a mix. The same is the
  zero-downtime restart after an upgrade.
- Metrics: every worker writes its values to a directory made for this start
  (PROMETHEUS_MULTIPROC_DIR, gateway.telemetry.metrics); with [metrics] listen the supervisor
  serves them on that address.

Usage (from gateway.cli only): python -m gateway.supervisor '{"host": ..., "port": ..., "workers": ...}'
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

# Before prometheus_client is imported anywhere in this process or the workers forked from it.
METRICS_DIR = tempfile.mkdtemp(prefix="gateway-metrics-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = METRICS_DIR

from granian import Granian  # noqa: E402
from granian.constants import Interfaces, Loops  # noqa: E402
from granian.log import logger  # noqa: E402

from gateway.drain import NOTICE_SIGNAL  # noqa: E402  (stdlib only: nothing of the request path)

APP = "gateway.app:app_from_env"
CONFIG_ENV = "GATEWAY_CONFIG"  # gateway.config.CONFIG_ENV, without importing the gateway here
# How long a new worker may take to listen before a reload gives up on it (keeping the old one).
READY_TIMEOUT_SECONDS = 60.0
# After a new worker listens, before the old one is told to drain.
SETTLE_SECONDS = 0.3


class GatewayGranian(Granian):  # type: ignore[misc,valid-type]
    """Granian with the gateway's reload: checked before it happens, each new worker up before the
    old one goes. Uses Granian 2.8's supervisor internals (_respawn_workers, wrks, respawned_wrks,
    interrupt_children, main_loop_interrupt, _stop_workers): pyproject.toml pins granian below 3."""

    notice_seconds: float = 1.0  # [server] drain_notice_seconds
    kill_grace_seconds: float = 10.0  # gateway.drain.KILL_GRACE_SECONDS

    def signal_handler_reload(self, *args: Any, **kwargs: Any) -> None:
        if os.getpid() != self.pid:  # a forked worker inherited this handler: not its business
            return
        from gateway.config import validate_config_file

        path = os.environ.get(CONFIG_ENV, "")
        try:
            problems = validate_config_file(path)
        except Exception as exc:  # never let a check take the supervisor down
            problems = [f"{type(exc).__name__}: {exc}"]
        if not problems:
            problems = _fixed_changed(path)
        if problems:
            logger.error(
                "reload refused: %s is not a valid configuration; the workers keep the one they have: %s",
                path,
                "; ".join(problems),
            )
            return
        logger.info("reload: %s is valid; replacing the workers one by one", path)
        if _RUNNING:  # the drain settings of the new configuration govern the old workers' stop
            self.notice_seconds = _RUNNING[0].drain_notice_seconds
            self.workers_kill_timeout = _kill_timeout(_RUNNING[0].drain_seconds, self.kill_grace_seconds)
        super().signal_handler_reload(*args, **kwargs)

    def _stop_workers(self) -> None:
        self._give_notice(self.wrks)
        super()._stop_workers()

    def _give_notice(self, workers: list[Any]) -> None:
        """Tell `workers` their SIGTERM comes in notice_seconds, and wait that long."""
        if not self.notice_seconds:
            return
        noticed = 0
        for worker in workers:
            if worker.is_alive():
                try:
                    os.kill(worker._id(), NOTICE_SIGNAL)
                    noticed += 1
                except OSError:  # gone meanwhile
                    pass
        if noticed:
            time.sleep(self.notice_seconds)

    def _respawn_workers(
        self, workers: list[int], spawn_target: Any, target_loader: Any, delay: float = 0
    ) -> None:
        if not delay:  # a crashed worker's replacement: nothing to hand over, Granian's own way
            super()._respawn_workers(workers, spawn_target, target_loader, delay)
            return
        draining = []
        for idx in workers:
            if self.interrupt_signal:
                logger.info("shutdown requested: the reload stops here")
                break
            self.respawned_wrks[idx] = time.monotonic()
            old = self.wrks[idx]
            new = self._spawn_worker(idx=idx, target=spawn_target, callback_loader=target_loader)
            new.start()
            if not self._listening(new):
                logger.error("reload: the new worker-%d did not start; the old one keeps serving", idx + 1)
                self._give_up(idx, new)
                break
            self.wrks[idx] = new
            time.sleep(SETTLE_SECONDS)
            # Notice, then SIGTERM: it drains (gateway.drain) while the next one is replaced.
            self._give_notice([old])
            old.terminate()
            draining.append((idx, old))
        for idx, old in draining:
            old.join(self.workers_kill_timeout)
            if old.is_alive():
                logger.warning("killing the old worker-%d: it outlived its drain", idx + 1)
                old.kill()
                old.join()
        self._metrics.incr_spawn(len(draining))

    def _listening(self, worker: Any) -> bool:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while worker.is_alive() and not self.interrupt_signal and time.monotonic() < deadline:
            if _pid_listens(worker._id(), self.bind_port):
                return True
            time.sleep(0.05)
        return False

    def _give_up(self, idx: int, new: Any) -> None:
        new.interrupt_by_parent = True
        if new.is_alive():
            new.kill()
        new.join()
        time.sleep(0.1)  # Granian's watcher thread notes the exit first
        while idx in self.interrupt_children:  # not a crash of a serving worker
            self.interrupt_children.remove(idx)
        self.respawned_wrks.pop(idx, None)
        self.main_loop_interrupt.clear()
        if self.interrupt_signal or self.reload_signal or self.interrupt_children:
            self.main_loop_interrupt.set()


def _kill_timeout(drain_seconds: float, kill_grace_seconds: float) -> int:
    """Granian's whole seconds from SIGTERM to a worker's kill."""
    return int(drain_seconds + kill_grace_seconds) + 1


_RUNNING: list[Any] = []  # the settings the workers were started with (gateway.config.Settings)


def _fixed_changed(path: str) -> list[str]:
    from gateway.config import load_settings
    from gateway.reload import fixed_changes

    try:
        new = load_settings(path)
    except Exception as exc:
        return [f"{type(exc).__name__}: {exc}"]
    problems = fixed_changes(_RUNNING[0], new) if _RUNNING else []
    if not problems:
        _RUNNING[:] = [new]
    return problems


def _pid_listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds a listening TCP socket on `port` (each Granian worker binds its
    own, SO_REUSEPORT), from /proc."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]  # noqa: SIM115
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(fields[9])
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in descriptors:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


def _serve_metrics(listen: list[Any]) -> None:
    """[metrics] listen: every worker's values on an address of their own (a thread of this process)."""
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=METRICS_DIR)  # type: ignore[no-untyped-call]
    host, port = listen
    start_http_server(int(port), addr=str(host), registry=registry)
    logger.info("metrics served at http://%s:%s/metrics", host, port)


def main(argv: list[str]) -> None:
    options = json.loads(argv[1])
    if options.get("metrics_listen"):
        _serve_metrics(options["metrics_listen"])
    drain = float(options.get("drain_seconds", 30.0))
    config = os.environ.get(CONFIG_ENV)
    if config:
        from gateway.config import load_settings

        _RUNNING.append(load_settings(config))
    # Notice (SIGUSR1) must not kill a worker still starting: ignored until gateway.drain handles it.
    signal.signal(NOTICE_SIGNAL, signal.SIG_IGN)
    kill_grace = float(options.get("kill_grace_seconds", 10.0))
    server = GatewayGranian(
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
        workers_kill_timeout=_kill_timeout(drain, kill_grace),
    )
    server.notice_seconds = float(options.get("drain_notice_seconds", 1.0))
    server.kill_grace_seconds = kill_grace
    try:
        server.serve()
    finally:
        shutil.rmtree(METRICS_DIR, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv)
