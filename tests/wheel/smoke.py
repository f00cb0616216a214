"""`make wheel-smoke`: the wheel in dist/ installed into a fresh virtual environment that cannot see
the source tree or the Rust toolchain, then `gateway demo` run from that install. The official openai
client (installed beside it) makes one plain and one streamed chat completion through it, the
console's sign-in page and static files load, and SIGTERM stops the whole demo within seconds.

Usage: python3 tests/wheel/smoke.py [--wheel dist/gateway-...whl] [--keep]

Standard library only: it runs under the system python3 and builds the venv with it (another
interpreter tests the same abi3 wheel under that CPython: python3.13 tests/wheel/smoke.py). The openai part
runs inside the new venv, from a copy of this file in the temporary directory (`client` mode).
Not a pytest module (no test_ prefix): it needs a built wheel and network access for pip.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHAT_MODEL = "openai/gpt-4o-mini"  # a chat model of config/demo.toml
PROMPT = "Hello from the wheel smoke test"
IMPORT_CHECK = "import gateway, gateway._core; print(gateway.__file__); print(gateway._core.__file__)"
START_SECONDS = 90.0  # `gateway demo` until the gateway answers HTTP
STOP_SECONDS = 10.0  # SIGTERM until every process of the demo is gone
# Passed through to pip and the demo from the caller's environment (a proxy, a private index, a CA
# bundle, locale); nothing else, so no PYTHONPATH, VIRTUAL_ENV, CARGO_*, RUSTUP_* or GATEWAY_*.
PASSED_ENV = ("HOME", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE")


class Failed(Exception):
    pass


def passed(what: str) -> None:
    print(f"PASS {what}", flush=True)


def check(ok: bool, what: str, detail: str = "") -> None:
    """PASS, or FAIL and stop here (the caller cleans up)."""
    if not ok:
        raise Failed(f"{what}{': ' + detail if detail else ''}")
    passed(what)


# ---------------------------------------------------------------- the driver (system python3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, default=None, help="default: the newest dist/gateway-*.whl")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="gateway-wheel-smoke-")).resolve()
    started_demo: list[subprocess.Popen[str]] = []
    try:
        smoke(args.wheel, tmp, started_demo)
    except (Failed, subprocess.TimeoutExpired) as exc:
        print(f"FAIL {exc}", flush=True)
        return 1
    finally:
        for demo in started_demo:
            kill_group(demo)
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"PASS wheel smoke test ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


def smoke(wheel: Path | None, tmp: Path, started_demo: list[subprocess.Popen[str]]) -> None:
    """Every check in order, stopping at the first failure; the demo's process, once started, is
    appended to `started_demo` for the caller's clean-up."""
    wheel = (wheel or newest_wheel()).resolve()
    check(wheel.is_file(), f"wheel {wheel.name}", f"{wheel} not found (run `make wheel`)")
    check(not tmp.is_relative_to(ROOT), f"work directory {tmp} outside the source tree")
    venv = tmp / "venv"
    env = clean_env(venv)
    for tool in ("cargo", "rustc", "maturin"):
        check(shutil.which(tool, path=env["PATH"]) is None, f"no {tool} on PATH={env['PATH']}")

    run([sys.executable, "-m", "venv", str(venv)], tmp, env, "fresh venv", timeout=120)
    python = venv / "bin" / "python"
    run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel), "openai"],
        tmp,
        env,
        "pip install the wheel and openai",
        timeout=600,
    )
    where = run(
        [str(python), "-c", IMPORT_CHECK],
        tmp,
        env,
        "import gateway, gateway._core",
    ).split()
    for path in where:
        check(Path(path).resolve().is_relative_to(venv), f"imported from the venv: {path}")
    check((venv / "bin" / "gateway").is_file(), "the `gateway` command is installed")

    # The demo configuration is the user's input, not part of the package: a copy, laid out as in the
    # repository (config/ beside var/, where its relative store path puts the database).
    config = tmp / "config" / "demo.toml"
    config.parent.mkdir()
    shutil.copy(ROOT / "config" / "demo.toml", config)
    port, sim_port = free_port(), free_port()
    command = [
        str(venv / "bin" / "gateway"),
        *("demo", "--config", str(config), "--port", str(port), "--sim-port", str(sim_port)),
    ]
    print(f"running {' '.join(command)} (in {tmp})", flush=True)
    demo = subprocess.Popen(
        command,
        cwd=tmp,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the simulator and Granian's processes too
    )
    started_demo.append(demo)
    demo_checks(demo, tmp, python, env, port)


def demo_checks(demo: subprocess.Popen[str], tmp: Path, python: Path, env: dict[str, str], port: int) -> None:
    output = Output(demo)
    base_url, key = output.demo_lines()
    check(base_url == f"http://127.0.0.1:{port}", f"demo base URL {base_url}")
    wait_for_http(demo, f"{base_url}/v1/models")
    passed(f"gateway answering on {base_url}")

    # The openai client runs in the smoke venv, from a copy of this file outside the source tree.
    client = tmp / "smoke_client.py"
    shutil.copy(__file__, client)
    proc = subprocess.run(
        [str(python), str(client), "client", base_url, key],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    print(proc.stdout, end="", flush=True)
    check(proc.returncode == 0, "openai client from the venv", f"status {proc.returncode}\n{proc.stderr}")

    status, ctype, page = get(f"{base_url}/console/")
    check(
        status == 200 and ctype.startswith("text/html"),
        "GET /console/ (redirects followed): 200 HTML",
        f"{status} {ctype}",
    )
    check(
        "<form" in page and 'name="password"' in page and "Sign in" in page,
        "the console page has a sign-in form",
        page[:500],
    )
    for asset in ("console.css", "console.js", "vendor/uplot/uPlot.iife.min.js"):
        status, _, body = get(f"{base_url}/console/static/{asset}")
        check(status == 200 and len(body) > 100, f"GET /console/static/{asset}: 200", f"{status}")

    # Stopping: SIGTERM to the demo's process group (what Ctrl-C's SIGINT or a service manager's stop
    # does), and every process in it gone within seconds.
    began = time.monotonic()
    os.killpg(demo.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        demo.wait(STOP_SECONDS)
    while group_alive(demo.pid) and time.monotonic() - began < STOP_SECONDS:
        time.sleep(0.1)
    took = time.monotonic() - began
    left = group_alive(demo.pid)
    check(
        demo.poll() is not None and not left,
        f"SIGTERM stopped the demo in {took:.1f} s",
        f"still running after {STOP_SECONDS:.0f} s: {left or [demo.pid]}",
    )
    output.join()
    check((tmp / "var" / "demo.db").is_file(), "the demo's store in the work directory")


class Output:
    """The demo's output (its own, the simulator's and Granian's), echoed as it comes and kept."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            print(f"  demo| {line}", end="", flush=True)
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def join(self) -> None:
        self.thread.join(5)

    def demo_lines(self) -> tuple[str, str]:
        """The base URL and the demo key from what `gateway demo` prints, once it has printed them."""
        deadline = time.monotonic() + START_SECONDS
        with self.cond:
            while not any(line.startswith("Console sign-in:") for line in self.lines):
                if self.proc.poll() is not None and not self.thread.is_alive():
                    raise Failed(f"gateway demo exited with status {self.proc.returncode} before its key")
                if time.monotonic() > deadline:
                    raise Failed("gateway demo printed no key and console sign-in")
                self.cond.wait(0.5)
            lines = list(self.lines)
        base = after(lines, "Base URL", r"http://\S+")
        key = after(lines, "Demo API key:", r"sk-[A-Za-z0-9_-]+")
        sign_in = next(line for line in lines if line.startswith("Console sign-in:"))
        check(
            re.fullmatch(r"Console sign-in: demo@example\.com / \S+", sign_in) is not None,
            "demo printed the console sign-in",
        )
        passed(f"demo printed a key ({key[:6]}...)")
        return base, key


def after(lines: list[str], heading: str, pattern: str) -> str:
    """The first line matching `pattern` after the line starting with `heading`."""
    start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
    if start is not None:
        for line in lines[start + 1 :]:
            if re.fullmatch(pattern, line.strip()):
                return line.strip()
    raise Failed(f"no {pattern!r} after {heading!r} in the demo's output")


def newest_wheel() -> Path:
    wheels = sorted((ROOT / "dist").glob("gateway-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise Failed("no dist/gateway-*.whl (run `make wheel`)")
    return wheels[-1]


def clean_env(venv: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k in PASSED_ENV or k.startswith("PIP_") or "proxy" in k.lower()
    }
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    return env


def run(command: list[str], cwd: Path, env: dict[str, str], what: str, timeout: float = 60) -> str:
    try:
        proc = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise Failed(f"{what}: no answer in {timeout:.0f} s") from None
    check(proc.returncode == 0, what, f"status {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for_http(proc: subprocess.Popen[str], url: str) -> None:
    """Until the URL answers at all (401 without a key is an answer)."""
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Failed(f"gateway demo exited with status {proc.returncode} before answering")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.2)
    raise Failed(f"{url} did not answer within {START_SECONDS:.0f} s")


def get(url: str) -> tuple[int, str, str]:
    """Status, content type and text of a GET, redirects followed (urllib follows them)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers.get("content-type", ""), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read().decode(errors="replace")


def group_alive(pgid: int) -> list[int]:
    """The live (not zombie) processes of a process group, from /proc."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            alive.append(int(stat.parent.name))
    return alive


def kill_group(proc: subprocess.Popen[str]) -> None:
    """Clean-up after a failure: whatever is left of the demo's process group, killed."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not group_alive(proc.pid):
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + 5
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()


# ---------------------------------------------------------------- client mode (in the smoke venv)


def client(base_url: str, key: str) -> int:
    """One plain and one streamed chat completion with the official openai client."""
    from openai import OpenAI

    import gateway

    check(
        Path(gateway.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()),
        f"client: gateway imported from {sys.prefix}",
    )
    openai = OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=30)
    models = [m.id for m in openai.models.list()]
    check(CHAT_MODEL in models, f"client: GET /v1/models lists {CHAT_MODEL}", f"{models}")
    raw = openai.chat.completions.with_raw_response.create(
        model=CHAT_MODEL, messages=[{"role": "user", "content": PROMPT}]
    )
    completion = raw.parse()
    text = completion.choices[0].message.content or ""
    usage = completion.usage
    cost = raw.headers.get("x-service-cost", "")
    check(
        bool(text.strip()) and completion.choices[0].finish_reason == "stop",
        f"client: plain completion {text[:40]!r}...",
    )
    check(
        usage is not None
        and usage.prompt_tokens > 0
        and usage.completion_tokens > 0
        and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
        f"client: plain usage {tokens(usage)}",
    )
    check(re.fullmatch(r"0\.\d+", cost) is not None and float(cost) > 0, f"client: x-service-cost {cost}")

    pieces: list[str] = []
    chunks = 0
    final_usage = None
    for chunk in openai.chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        stream=True,
        stream_options={"include_usage": True},
    ):
        chunks += 1
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            final_usage = chunk.usage
    streamed = "".join(pieces)
    check(
        len(pieces) > 1 and bool(streamed.strip()),
        f"client: streamed completion in {chunks} chunks {streamed[:40]!r}...",
    )
    check(
        final_usage is not None and final_usage.completion_tokens > 0 and final_usage.prompt_tokens > 0,
        f"client: streamed usage {tokens(final_usage)}",
    )
    return 0


def tokens(usage: Any) -> str:
    if usage is None:
        return "missing"
    return f"{usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens"


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        try:
            sys.exit(client(sys.argv[2], sys.argv[3]))
        except Failed as exc:
            print(f"FAIL {exc}", flush=True)
            sys.exit(1)
    sys.exit(main())
