"""The process `gateway serve` becomes: Granian's supervisor, in a fresh interpreter that imports
Granian and nothing of the gateway's request path (the workers load the app), so it stays small. A
worker that dies is started again; its replacement replays the dead one's journal and takes back
its leases. One that keeps dying soon after its start is started again after a pause that doubles
each time (up to CRASH_BACKOFF_MAX_SECONDS) while the other workers serve on; Granian's own guard
would end the whole gateway at a worker's second quick death, healthy workers included. Only a
worker that dies before it ever served (a start-up failure: the database out of reach, say), twice
running, with no other worker serving, ends the gateway (exit status 1, the error in the log).

Beyond Granian's own supervisor:
- Notice: a worker about to be stopped gets SIGUSR1 `[server] drain_notice_seconds` before its
  SIGTERM; it serves on, ending each connection after its answer (gateway.drain).
- SIGTERM: workers drain (gateway.drain); one still running drain_seconds + KILL_GRACE_SECONDS
  after the signal is killed.
- SIGHUP (or POST /admin/v1/config/reload): the configuration file is checked first and a bad one
  refused, the old workers serving on; a good one becomes the accepted configuration, the copy of
  its text every worker started from then on loads (GATEWAY_CONFIG_ACCEPTED), so that a worker
  started between two reloads (a crashed one's replacement, one still starting when the file was
  edited) never takes an edit nobody checked. Then each worker is replaced in turn, the new one started
  and listening before the old one is told to drain. A request is served by one worker from start
  to end, so it sees the old configuration or the new one, never a mix. The same is the
  zero-downtime restart after an upgrade.
- Metrics: every worker writes its values to a directory made for this start
  (PROMETHEUS_MULTIPROC_DIR, gateway.telemetry.metrics); with [metrics] listen the supervisor
  serves them on that address.

Usage (from gateway.cli only): python -m gateway.supervisor '{"host": ..., "port": ..., "workers": ...}'
"""

from __future__ import annotations

import fcntl
import json
import logging.config
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

from gateway.deployment import RUN_DIR_PREFIX, RUN_LOCK, identity, write_listening  # stdlib only

# This start's own files: the workers' metrics, the accepted configuration's text and where it
# listens (gateway.deployment). Its lock file is held for as long as this process or a worker
# forked from it lives (they share it): a later start removes a directory whose lock it can take
# (_sweep_run_dirs).
RUN_DIR = tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-")


def _hold(run_dir: str) -> int:
    """Lock `run_dir` for this process's life. The lock file takes its name only once locked, so a
    sweep never finds it free while its owner is still starting."""
    fd, made = tempfile.mkstemp(dir=run_dir)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(made, os.path.join(run_dir, RUN_LOCK))
    return fd


_RUN_DIR_HELD = _hold(RUN_DIR)
METRICS_DIR = os.path.join(RUN_DIR, "metrics")
os.mkdir(METRICS_DIR)
# Before prometheus_client is imported anywhere in this process or the workers forked from it.
os.environ["PROMETHEUS_MULTIPROC_DIR"] = METRICS_DIR

import granian._signals  # noqa: E402
from granian import Granian  # noqa: E402
from granian._granian import WorkerSignal  # noqa: E402
from granian.constants import HTTPModes, Interfaces, Loops  # noqa: E402
from granian.log import configure_logging, logger  # noqa: E402

from gateway import installed  # noqa: E402  (stdlib only)
from gateway.drain import (  # noqa: E402  (stdlib only)
    NOTICE_SIGNAL,
    RUN_DIR_ENV,
    SUPERVISOR_PID_ENV,
    serving_mark,
)
from gateway.log_format import TEXT_FORMAT, uses_json  # noqa: E402  (stdlib and orjson only)

os.environ[RUN_DIR_ENV] = RUN_DIR  # where workers say they serve (gateway.drain.mark_serving)
os.environ[SUPERVISOR_PID_ENV] = str(os.getpid())  # workers end with it (drain.end_with_supervisor)

APP = "gateway.app:app_from_env"
# gateway.config's CONFIG_ENV and ACCEPTED_CONFIG_ENV, without importing the gateway here.
CONFIG_ENV = "GATEWAY_CONFIG"
ACCEPTED_CONFIG_ENV = "GATEWAY_CONFIG_ACCEPTED"
# How long a new worker may take to listen before a reload gives up on it (keeping the old one).
READY_TIMEOUT_SECONDS = 60.0
# After a new worker listens, before the old one is told to drain.
SETTLE_SECONDS = 0.3
# A worker dying within this long of its start is dying quickly (Granian's crash-loop window).
CRASH_WINDOW_SECONDS = 5.5
# The longest pause before a quickly dying worker is started again.
CRASH_BACKOFF_MAX_SECONDS = 30.0


def _set_loop_signals_once(loop: Any) -> Any:
    """Granian's worker signal handling (granian._signals.set_loop_signals), telling the worker to
    stop at the first SIGTERM or SIGINT only. Granian's handler tells it at every one, through a
    channel of one place that its server reads once: the third signal blocked the worker's event
    loop for good (a process manager signalling every process of the service, then the kernel's
    signal when the supervisor ended; kill -9 review). What the later ones would say is said."""
    told = WorkerSignal()
    stopping = False

    def signal_handler(signum: int, frame: Any) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            told.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, signal_handler, signum, None)
    return told


# Workers are forked from this process; Granian looks the function up as each one starts.
granian._signals.set_loop_signals = _set_loop_signals_once


class GatewayGranian(Granian):  # type: ignore[misc,valid-type]
    """Granian with the gateway's reload (checked before it happens, each new worker up before the
    old one goes) and its own rule for workers that die. Uses Granian 2.8's supervisor internals
    (_respawn_workers, wrks, respawned_wrks, interrupt_children, interrupt_signal,
    main_loop_interrupt, _stop_workers, a worker's birth; set_loop_signals, replaced above):
    pyproject.toml pins granian below 3."""

    notice_seconds: float = 1.0  # [server] drain_notice_seconds
    kill_grace_seconds: float = 10.0  # gateway.drain.KILL_GRACE_SECONDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.quick_deaths: dict[int, int] = {}  # worker index: deaths in a row soon after a start

    def signal_handler_reload(self, *args: Any, **kwargs: Any) -> None:
        if os.getpid() != self.pid:  # a forked worker inherited this handler: not its business
            return
        path = os.environ.get(CONFIG_ENV, "")
        if installed.changed_since_start():
            logger.error(
                "reload refused: %s; the workers keep running the code they have", installed.UPGRADED
            )
            return
        try:
            problems = _accept(path)
        except Exception as exc:  # never let a check take the supervisor down
            problems = [f"{type(exc).__name__}: {exc}"]
        if problems:
            logger.error(
                "reload refused: %s is not a valid configuration; the workers keep the one they have: %s",
                path,
                "; ".join(problems),
            )
            return
        logger.info("reload: %s is valid; replacing the workers one by one", path)
        for warning in _WARNINGS:
            logger.warning("configuration: %s", warning)
        if _RUNNING:  # the drain settings of the new configuration govern the old workers' stop
            self.notice_seconds = _RUNNING[0].drain_notice_seconds
            self.workers_kill_timeout = _kill_timeout(_RUNNING[0].drain_seconds, self.kill_grace_seconds)
            # ... and its log format Granian's records, here and in the workers started from now
            # (operator review: the supervisor's stayed JSON after a reload to text).
            self.log_config = _log_config(_RUNNING[0].log_format)
            configure_logging(self.log_level, self.log_config, self.log_enabled)
        super().signal_handler_reload(*args, **kwargs)

    def _spawn_worker(self, idx: int, target: Any, callback_loader: Any) -> Any:
        worker = super()._spawn_worker(idx=idx, target=target, callback_loader=callback_loader)
        granians = worker._watcher

        def watch() -> None:
            # A worker that ends once this process was told to stop got the signal too (Ctrl-C, a
            # service manager signalling the whole group): an expected end, not a crash. Granian
            # would log it as an error and make the whole stop exit 1.
            worker.inner.join()
            if self.interrupt_signal:
                worker.interrupt_by_parent = True
            granians()

        worker._watcher = watch  # read by Granian's _watch when the worker starts
        return worker

    def _stop_workers(self) -> None:
        """Granian's stop (SIGTERM to each worker, SIGKILL to one still running after
        workers_kill_timeout), each worker's end seen on its sentinel as a reload's is
        (_ends_within): Granian's join raced the worker's watcher thread for the reaping, and a
        worker that had drained and ended was logged as refusing to stop and sent a SIGKILL
        (review: once in four stops with a stream running)."""
        self._give_notice(self.wrks)
        for worker in self.wrks:
            worker.terminate()
        deadline = time.monotonic() + self.workers_kill_timeout
        for worker in self.wrks:
            if not _ends_within(worker, max(0.001, deadline - time.monotonic())):
                logger.warning("killing worker-%d: it outlived its drain", worker.idx + 1)
                worker.kill()
                _ends_within(worker, None)
            logger.info("Stopped worker-%d", worker.idx + 1)

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
        if not delay:  # workers that died: started again, nothing to hand over
            for idx in workers:
                if not self._respawn_dead(idx, spawn_target, target_loader):
                    return
            return
        draining = []
        for idx in workers:
            if self.interrupt_signal:
                logger.info("shutdown requested: the reload stops here")
                break
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
            ended = _ends_within(old, self.workers_kill_timeout)
            _forget_serving(old._id())
            if not ended:
                logger.warning("killing the old worker-%d: it outlived its drain", idx + 1)
                old.kill()
                old.join()
        self._metrics.incr_spawn(len(draining))

    def _respawn_dead(self, idx: int, spawn_target: Any, target_loader: Any) -> bool:
        """Start worker `idx` again after it died, after a pause when it keeps dying quickly; end
        the gateway instead when it never served and nothing else does (module notes). False when
        the gateway is to stop."""
        dead = self.wrks[idx]
        served = _forget_serving(dead._id())
        quickly = time.monotonic() - dead.birth <= CRASH_WINDOW_SECONDS
        deaths = self.quick_deaths
        deaths[idx] = deaths.get(idx, 0) + 1 if quickly else 0
        others = any(_serving(w) for i, w in enumerate(self.wrks) if i != idx)
        if deaths[idx] >= 2 and not served and not others:
            logger.error("worker-%d failed to start again and no worker serves: exiting", idx + 1)
            self.interrupt_children.append(idx)  # exit status 1
            self.interrupt_signal = True
            self.main_loop_interrupt.set()
            return False
        if deaths[idx] >= 2:
            pause = min(CRASH_BACKOFF_MAX_SECONDS, 2.0 ** (deaths[idx] - 2))
            logger.error(
                "worker-%d keeps dying within %.1f s of its start: starting it again in %.0f s",
                idx + 1,
                CRASH_WINDOW_SECONDS,
                pause,
            )
            resume = time.monotonic() + pause
            while time.monotonic() < resume and not self.interrupt_signal:
                time.sleep(0.05)  # not main_loop_interrupt: another worker's death must stay noted
            if self.interrupt_signal:
                return False
        if installed.changed_since_start():  # the new worker is forked from the old release
            logger.error("worker-%d starts again: %s", idx + 1, installed.RESPAWNED_UPGRADED)
        super()._respawn_workers([idx], spawn_target, target_loader, 0)
        # Granian's crash-loop guard (which ends the gateway at a second quick death) stands down:
        # the policy above replaces it.
        self.respawned_wrks.pop(idx, None)
        return True

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
        _forget_serving(new._id())
        time.sleep(0.1)  # Granian's watcher thread notes the exit first
        while idx in self.interrupt_children:  # not a crash of a serving worker
            self.interrupt_children.remove(idx)
        self.respawned_wrks.pop(idx, None)
        self.main_loop_interrupt.clear()
        if self.interrupt_signal or self.reload_signal or self.interrupt_children:
            self.main_loop_interrupt.set()


def _serving(worker: Any) -> bool:
    """Whether `worker` is alive and has started serving (gateway.drain.mark_serving)."""
    return bool(worker.is_alive() and os.path.exists(serving_mark(RUN_DIR, worker._id())))


def _forget_serving(pid: int) -> bool:
    """Whether worker `pid` had started serving (gateway.drain.mark_serving); its mark is removed."""
    try:
        os.unlink(serving_mark(RUN_DIR, pid))
    except OSError:
        return False
    return True


def _ends_within(worker: Any, seconds: float | None) -> bool:
    """Whether `worker` has ended or ends within `seconds`. Its sentinel, not join and is_alive:
    Granian's watcher thread reaps the process too, and the one of the two that loses the race
    (waitpid: ECHILD) would take a finished worker for a live one and log that it was killed."""
    return bool(multiprocessing.connection.wait([worker.inner.sentinel], seconds))


def _kill_timeout(drain_seconds: float, kill_grace_seconds: float) -> int:
    """Granian's whole seconds from SIGTERM to a worker's kill."""
    return int(drain_seconds + kill_grace_seconds) + 1


_RUNNING: list[Any] = []  # the accepted configuration's settings (gateway.config.Settings)
_WARNINGS: list[str] = []  # the last file checked: its unset environment variables (check-config's warnings)


def _accept(path: str) -> list[str]:
    """Check the file at `path` once, read once: if the gateway takes it and it changes nothing a
    reload cannot (at start, nothing is running yet), it becomes the accepted configuration (an
    empty list); else its problems."""
    from gateway.config import check_and_load
    from gateway.reload import command_line_flags, fixed_changes

    checked = check_and_load(path)
    if checked.settings is None:
        return list(checked.problems)
    _WARNINGS[:] = checked.warnings
    new = checked.settings
    problems = fixed_changes(_RUNNING[0], new, command_line_flags()) if _RUNNING else []
    if not problems:
        _RUNNING[:] = [new]
        _publish(checked.text)
    return problems


def _publish(text: str) -> None:
    """Make `text` what workers started from now on load (replacing the file in one step, so a
    worker starting meanwhile reads the old text or the new, never part of one)."""
    accepted = os.path.join(RUN_DIR, "config.toml")
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=RUN_DIR, delete=False) as f:
        f.write(text)
    os.replace(f.name, accepted)
    os.environ[ACCEPTED_CONFIG_ENV] = accepted


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


def _sweep_run_dirs() -> int:
    """Remove what supervisors killed with SIGKILL left behind (nothing else stops one before its
    own clean-up): their run directories, each a copy of the configuration and the workers' metrics
    files. One whose lock can be taken has no process left (the kernel drops a lock with its last
    holder, whatever the process ids say); one without a lock (an earlier version's, or one being
    made) stays. Returns how many were removed."""
    base = os.path.dirname(RUN_DIR)
    removed = 0
    for name in os.listdir(base):
        path = os.path.join(base, name)
        if not name.startswith(RUN_DIR_PREFIX) or path == RUN_DIR:
            continue
        try:
            fd = os.open(os.path.join(path, RUN_LOCK), os.O_RDONLY)
        except OSError:
            continue  # no lock file, or another user's directory
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: its gateway runs
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


def _log_config(log_format: str) -> dict[str, Any]:
    """Granian's own records (this supervisor's and each worker's: workers started and exited,
    reloads, drains) on stderr in the gateway's log format, beside the workers' records, instead of
    on stdout as plain text."""
    factory = "gateway.log_format.JsonFormatter" if uses_json(log_format) else "logging.Formatter"
    formatter: dict[str, Any] = {"()": factory}
    if not uses_json(log_format):
        formatter["fmt"] = TEXT_FORMAT
    return {
        "formatters": {"gateway": formatter},
        "handlers": {
            "stderr": {"formatter": "gateway", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"}
        },
        "loggers": {"_granian": {"handlers": ["stderr"], "level": "INFO", "propagate": False}},
    }


def main(argv: list[str]) -> None:
    installed.note_start()  # before anything of the package runs in a worker
    options = json.loads(argv[1])
    swept = _sweep_run_dirs()
    drain = float(options.get("drain_seconds", 30.0))
    config = os.environ.get(CONFIG_ENV)
    if config:
        # What the workers start with: the file as read now (`gateway serve` checked it just
        # before; an edit since then is checked again here), accepted as a reload's would be.
        problems = _accept(config)
        if problems:
            shutil.rmtree(RUN_DIR, ignore_errors=True)
            sys.exit(f"gateway: configuration error: {'; '.join(problems)}")
        # What a later `gateway serve` on this port reads to tell a handover from a mistake.
        write_listening(RUN_DIR, options["host"], options["port"], identity(_RUNNING[0]))
    # Notice (SIGUSR1) must not kill a worker still starting: ignored until gateway.drain handles it.
    signal.signal(NOTICE_SIGNAL, signal.SIG_IGN)
    kill_grace = float(options.get("kill_grace_seconds", 10.0))
    log_format = _RUNNING[0].log_format if _RUNNING else "auto"
    # Granian sets its logging up only when it serves: said before, these lines would go nowhere.
    logging.config.dictConfig({"version": 1, "disable_existing_loggers": False, **_log_config(log_format)})
    if swept:
        logger.info("removed %d run directories of gateways that were killed", swept)
    if options.get("joining"):
        logger.info(
            "%s:%d is already served by the gateway with pid %s on the same data: this one joins it"
            " and the two share its requests (a handover: stop the old one when this one is up)",
            options["host"],
            options["port"],
            ", ".join(map(str, options["joining"])),
        )
    if _RUNNING:
        from gateway.config import advisories

        for advice in (*advisories(_RUNNING[0]), *_WARNINGS):
            logger.warning("configuration: %s", advice)
    if options.get("metrics_listen"):
        _serve_metrics(options["metrics_listen"])
    server = GatewayGranian(
        APP,
        factory=True,
        address=options["host"],
        port=options["port"],
        workers=options["workers"],
        interface=Interfaces.ASGI,
        loop=Loops.uvloop,
        # HTTP/1.1 only (HTTP/2 comes through a TLS-terminating proxy): Granian's automatic mode
        # reads a connection's first bytes to tell the protocols apart with no deadline, so one that
        # sent nothing stayed open forever (hostile review); HTTP/1's header read timeout cuts it.
        http=HTTPModes.http1,
        # No endpoint speaks WebSocket: an upgrade request is an HTTP request like any other,
        # answered by its path (with websockets on, Granian answered it an empty 403).
        websockets=False,
        log_access=False,
        backlog=4096,
        respawn_failed_workers=True,
        workers_kill_timeout=_kill_timeout(drain, kill_grace),
        log_dictconfig=_log_config(log_format),
    )
    server.notice_seconds = float(options.get("drain_notice_seconds", 1.0))
    server.kill_grace_seconds = kill_grace
    try:
        server.serve()
    finally:
        shutil.rmtree(RUN_DIR, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv)
