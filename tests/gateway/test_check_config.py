"""`gateway check-config FILE` names every problem of a settings file at once, starting nothing; the
operations settings ([server] drain_seconds and drain_notice_seconds, [metrics], [logs], [tracing])
and their checks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import (
    ConfigError,
    Settings,
    check_and_load,
    check_config,
    load_settings,
    parse_settings,
    validate_config,
)

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "config" / "demo.toml"
CHANNEL = {"provider": "openai", "base_url": "http://127.0.0.1:1/v1"}


def check(path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


MANY_PROBLEMS = """
colour = "blue"                      # unknown top-level key

[server]
drain_seconds = -5                   # not positive

[metrics]
listen = "localhost:99999"           # no such port

[[models]]
name = "openai/a"
type = "chat"
[[models.channels]]
provider = "openai"
base_url = "http://127.0.0.1:1/v1"

[[models]]
name = "openai/b"
type = "chat"
[[models.channels]]
provider = "openai"
base_url = "http://127.0.0.1:1/v1"
wieght = 2                           # misspelt
[[models.channels]]
provider = "openai"
base_url = "http://127.0.0.1:1/v1"
name = "second"
weight = -1                          # negative
"""

MANY_PLACES = [
    "unknown setting colour",
    "server.drain_seconds: must be a positive number of seconds",
    "metrics.listen: must be",
    "unknown setting models[1].channels[0].wieght",
    "models[1].channels[1].weight: must be positive",
]


def test_the_demo_configuration_is_valid() -> None:
    done = check(DEMO)
    assert done.returncode == 0, done.stderr
    models = len(load_settings(DEMO).models)
    assert done.stdout == f"ok: {DEMO} ({models} models)\n"
    checked = check_and_load(DEMO)
    assert checked.problems == () and checked.settings == load_settings(DEMO)
    assert checked.text == DEMO.read_text()


def test_every_problem_is_named_with_its_place_in_file_order(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(MANY_PROBLEMS)
    done = check(config)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == len(MANY_PLACES), done.stderr
    for line, place in zip(lines, MANY_PLACES, strict=True):
        assert line.startswith(f"{config}: {place}"), (line, place)
    # The same list for the live reload, without the file's name; start-up stops at the first.
    checked = check_and_load(config)
    assert checked.settings is None
    assert list(checked.problems) == [line.removeprefix(f"{config}: ") for line in lines]
    with pytest.raises(ConfigError, match="unknown setting colour"):
        load_settings(config)


def test_every_problem_of_the_store_and_of_a_price_list_is_named(tmp_path: Path) -> None:
    """Operator review: [store] and [models.prices] stopped at their first problem each."""
    config = tmp_path / "config.toml"
    config.write_text(
        '[store]\nbackend = "postgres"\nurl = "mysql://x"\npool_size = 0\n'
        '[redis]\nurl = "redis://127.0.0.1:6379/0"\n'
        '[[models]]\nname = "a/b"\ntype = "chat"\n'
        '[models.prices]\ninput = "abc"\noutput = "-1"\nimages = 5\n'
        '[[models.channels]]\nprovider = "openai"\nbase_url = "http://127.0.0.1:1/v1"\n'
    )
    done = check(config)
    assert done.returncode == 1
    named = [line.removeprefix(f"{config}: ").split(":")[0] for line in done.stderr.splitlines()]
    assert sorted(named) == sorted(
        [
            "store.url",
            "store.pool_size",
            "models[0].prices.input",
            "models[0].prices.output",
            "models[0].prices.images",
        ]
    ), done.stderr


def test_a_file_that_is_not_toml_is_one_problem_with_its_line(tmp_path: Path) -> None:
    config = tmp_path / "broken.toml"
    config.write_text('[server]\nport = 8080\nhost = = "x"\n')
    done = check(config)
    assert done.returncode == 1
    assert re.fullmatch(
        rf"{re.escape(str(config))}: not valid TOML: .*\(at line 3, column \d+\)\n", done.stderr
    )


def test_a_missing_file_is_one_problem(tmp_path: Path) -> None:
    done = check(tmp_path / "nowhere.toml")
    assert done.returncode == 1
    assert done.stderr == f"{tmp_path / 'nowhere.toml'}: cannot read it: No such file or directory\n"


def test_unset_environment_variables_are_warnings_not_problems(tmp_path: Path) -> None:
    config = tmp_path / "pg.toml"
    config.write_text(
        '[store]\nbackend = "postgres"\nurl_env = "GW_CHECK_UNSET_PG"\n'
        '[redis]\nurl_env = "GW_CHECK_UNSET_REDIS"\n'
        '[[models]]\nname = "a/b"\ntype = "chat"\n'
        '[[models.channels]]\nprovider = "openai"\nbase_url = "http://127.0.0.1:1/v1"\n'
        'api_key_env = "GW_CHECK_UNSET_KEY"\n'
    )
    env = {"PATH": "/usr/bin:/bin"}  # none of the variables the file names
    done = check(config, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"ok: {config} (1 model)\n"
    for name, place in [
        ("GW_CHECK_UNSET_PG", "store.url_env"),
        ("GW_CHECK_UNSET_REDIS", "redis.url_env"),
        ("GW_CHECK_UNSET_KEY", "models[0].channels[0].api_key_env"),
    ]:
        assert f"{config}: warning: the environment variable {name} is not set here ({place})" in done.stderr
    # What a reload reads: the store's unset URL variable is a problem of the reload, not an error.
    assert "GW_CHECK_UNSET_PG" not in os.environ
    checked = check_and_load(config)
    assert checked.settings is None and len(checked.problems) == 1
    # Said as the file names it (operator review: "ConfigError: store.url_env: ...").
    assert checked.problems[0].startswith("store.url_env") and "GW_CHECK_UNSET_PG" in checked.problems[0]


def test_an_admin_token_serve_would_refuse_is_a_problem(tmp_path: Path) -> None:
    """Set but too short (or an API key's shape): `serve` refuses it at start-up, so check-config
    says so (operator review: it said ok)."""
    config = tmp_path / "admin.toml"
    config.write_text(
        '[admin]\ntoken_env = "GW_CHECK_ADMIN"\n'
        '[[models]]\nname = "a/b"\ntype = "chat"\n'
        '[[models.channels]]\nprovider = "openai"\nbase_url = "http://127.0.0.1:1/v1"\n'
    )
    for token in ("short", "sk-" + "a" * 40, "c" * 40 + "\n"):
        done = check(config, {"PATH": "/usr/bin:/bin", "GW_CHECK_ADMIN": token})
        assert done.returncode == 1 and "GW_CHECK_ADMIN: the admin token must have at least 32" in done.stderr
    done = check(config, {"PATH": "/usr/bin:/bin", "GW_CHECK_ADMIN": "b" * 32})
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- the settings themselves


def model(**overrides: object) -> dict[str, object]:
    return {"name": "a/b", "type": "chat", "channels": [CHANNEL], **overrides}


def settings_of(**tables: object) -> Settings:
    return parse_settings({"models": [model()], **tables}, Path("/tmp"))


def test_the_operations_settings_default() -> None:
    s = settings_of()
    assert (s.drain_seconds, s.drain_notice_seconds) == (30.0, 1.0)
    assert (s.metrics_enabled, s.metrics_token_env, s.metrics_listen) == (True, None, None)
    assert (s.log_format, s.log_level, s.access_log) == ("auto", "info", True)
    assert (s.otlp_endpoint, s.otel_service_name) == (None, "gateway")


def test_the_operations_settings_are_read() -> None:
    s = settings_of(
        server={"drain_seconds": 5, "drain_notice_seconds": 0},
        metrics={"enabled": False, "token_env": "GW_METRICS_TOKEN", "listen": "0.0.0.0:9090"},
        logs={"format": "text", "level": "debug", "access": False},
        tracing={"otlp_endpoint": "http://127.0.0.1:4318", "service_name": "gateway-eu"},
    )
    assert s.drain_seconds == 5.0 and isinstance(s.drain_seconds, float)
    assert s.drain_notice_seconds == 0.0  # no notice: SIGTERM at once
    assert settings_of(server={"drain_notice_seconds": 12.5}).drain_notice_seconds == 12.5
    assert (s.metrics_enabled, s.metrics_token_env, s.metrics_listen) == (
        False,
        "GW_METRICS_TOKEN",
        ("0.0.0.0", 9090),
    )
    assert (s.log_format, s.log_level, s.access_log) == ("text", "debug", False)
    assert (s.otlp_endpoint, s.otel_service_name) == ("http://127.0.0.1:4318", "gateway-eu")
    assert settings_of(metrics={"listen": "[::1]:9464"}).metrics_listen == ("::1", 9464)
    assert settings_of(logs={"format": "json", "level": "error"}).log_format == "json"


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"server": {"drain_seconds": 0}}, "server.drain_seconds: must be a positive number of seconds"),
        ({"server": {"drain_seconds": -1.5}}, "server.drain_seconds: must be a positive number"),
        ({"server": {"drain_seconds": "30"}}, "server.drain_seconds: must be a positive number"),
        ({"server": {"drain_seconds": True}}, "server.drain_seconds: must be a positive number"),
        ({"server": {"drain_seconds": float("nan")}}, "server.drain_seconds: must be a positive number"),
        (
            {"server": {"drain_notice_seconds": -1}},
            "server.drain_notice_seconds: must be zero or a positive number of seconds",
        ),
        ({"server": {"drain_notice_seconds": "1"}}, "server.drain_notice_seconds: must be zero or"),
        ({"server": {"drain_notice_seconds": float("nan")}}, "server.drain_notice_seconds: must be zero or"),
        ({"metrics": {"enabled": 1}}, "metrics.enabled: must be true or false"),
        ({"metrics": {"enabled": "yes"}}, "metrics.enabled: must be true or false"),
        ({"metrics": {"token_env": ""}}, "metrics.token_env: must be the name of an environment variable"),
        ({"metrics": {"token_env": 5}}, "metrics.token_env: must be the name of an environment variable"),
        ({"metrics": {"listen": "9090"}}, 'metrics.listen: must be "host:port"'),
        ({"metrics": {"listen": ":9090"}}, 'metrics.listen: must be "host:port"'),
        ({"metrics": {"listen": "localhost:0"}}, 'metrics.listen: must be "host:port"'),
        ({"metrics": {"listen": "localhost:65536"}}, 'metrics.listen: must be "host:port"'),
        ({"metrics": {"listen": "localhost:http"}}, 'metrics.listen: must be "host:port"'),
        ({"metrics": {"listen": "::1:9090"}}, 'metrics.listen: must be "host:port"'),
        ({"metrics": {"listen": 9090}}, 'metrics.listen: must be "host:port"'),
        ({"metrics": {"port": 9090}}, "unknown setting metrics.port (known: enabled, listen, token_env)"),
        ({"logs": {"format": "xml"}}, "logs.format: 'xml' is not one of ['auto', 'json', 'text']"),
        (
            {"logs": {"level": "trace"}},
            "logs.level: 'trace' is not one of ['debug', 'error', 'info', 'warning']",
        ),
        ({"logs": {"level": 10}}, "logs.level: must be of type str"),
        ({"logs": {"access": 0}}, "logs.access: must be true or false"),
        ({"logs": {"acess": True}}, "unknown setting logs.acess"),
        ({"tracing": {"otlp_endpoint": "collector:4318"}}, "tracing.otlp_endpoint: must be a URL"),
        ({"tracing": {"otlp_endpoint": "grpc://collector:4317"}}, "tracing.otlp_endpoint: must be a URL"),
        ({"tracing": {"otlp_endpoint": "http://"}}, "tracing.otlp_endpoint: must be a URL"),
        ({"tracing": {"otlp_endpoint": "http://collector:99999"}}, "tracing.otlp_endpoint: must be a URL"),
        ({"tracing": {"service_name": ""}}, "tracing.service_name: must not be empty"),
        (
            {"tracing": {"service": "x"}},
            "unknown setting tracing.service (known: otlp_endpoint, service_name)",
        ),
        ({"tracing": "on"}, "tracing: must be a table"),
    ],
)
def test_a_bad_operations_setting_is_refused_naming_it(tables: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        settings_of(**tables)
    # check-config names the same problem, and only it.
    problems = validate_config({"models": [model()], **tables})
    assert len(problems) == 1 and problems[0].startswith(message), problems


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"models": [model(name="nope")]},
        {"models": [model(channels=[{**CHANNEL, "weight": 0}])]},
        {"models": [model(channels=[CHANNEL, {**CHANNEL, "provider": "anthropic"}])]},
        {"models": [model(), model()]},
        {"models": [model(prices={"images": {"1024x1024": "x"}})]},
        {"models": [model(supported_params="temperature")]},
        {"models": [model(safety=True)]},
        {"models": [model()], "safety": {"model": "a/b"}},
        {"models": [model()], "store": {"backend": "postgres", "url": "postgresql://x/y"}},
        {"models": [model()], "store": {"url": "postgresql://x/y"}},
        {"models": [model()], "redis": {"prefix": "a b"}},
        {"models": [model()], "routing": {"retries": -1}},
        {"models": [model()], "videos": {"poll_seconds": 0}},
        {"models": [model()], "server": {"allowed_hosts": "x"}},
    ],
)
def test_check_config_reports_what_start_up_refuses(raw: dict[str, object]) -> None:
    """The same rules: a file with one problem is refused at start-up with the one message that
    check-config names."""
    with pytest.raises(ConfigError) as caught:
        parse_settings(raw, Path("/tmp"))
    assert validate_config(raw) == [str(caught.value)]


def test_each_problem_of_a_model_and_of_each_channel_is_named() -> None:
    """In the file's order: a model's keys as written (its channels before what follows them)."""
    raw = {
        "models": [
            model(),
            model(
                name="nope",
                type="poetry",
                max_output_tokens=0,
                typo=1,
                channels=[
                    {**CHANNEL, "provider": "x", "weight": 0, "nmae": "a"},
                    {**CHANNEL, "priority": "high"},
                ],
            ),
        ],
        "logs": {"format": "xml", "level": "loud", "retention": 3},
    }
    problems = check_config(raw).problems
    assert [p.split(":")[0].split(" (known")[0] for p in problems] == [
        "models[1].name",
        "models[1].type",
        "models[1].channels[0].provider",
        "models[1].channels[0].weight",
        "unknown setting models[1].channels[0].nmae",
        "models[1].channels[1].priority",
        "models[1].max_output_tokens",
        "unknown setting models[1].typo",
        "logs.format",
        "logs.level",
        "unknown setting logs.retention",
    ]


def test_a_text_model_without_max_output_tokens_is_a_warning(tmp_path: Path) -> None:
    """Its requests without an output limit are held at 16384 tokens but sent none: an upstream
    whose own default is longer could answer past the hold (docs/behaviour.md)."""
    config = tmp_path / "models.toml"
    channel = '[[models.channels]]\nprovider = "openai"\nbase_url = "http://127.0.0.1:1/v1"\n'
    config.write_text(
        '[[models]]\nname = "a/unset"\ntype = "chat"\n'
        + channel
        + '[[models]]\nname = "a/set"\ntype = "chat"\nmax_output_tokens = 4096\n'
        + channel
        + '[[models]]\nname = "a/embed"\ntype = "embedding"\n'
        + channel
    )
    done = check(config, {"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    (warning,) = [line for line in done.stderr.splitlines() if "max_output_tokens" in line]
    assert warning.startswith(f"{config}: warning: max_output_tokens is not set for a/unset: ")
    assert "a/set" not in warning and "a/embed" not in warning


def test_a_model_without_prices_is_a_warning(tmp_path: Path) -> None:
    """A price left out is zero (review: a model without [models.prices] was served free with no
    word); a moderation model is free upstream too, and a video model needs its per-second price."""
    config = tmp_path / "models.toml"
    channel = '[[models.channels]]\nprovider = "openai"\nbase_url = "http://127.0.0.1:1/v1"\n'
    priced = '[models.prices]\ninput = "1"\n'
    config.write_text(
        '[[models]]\nname = "a/free"\ntype = "embedding"\n'
        + channel
        + '[[models]]\nname = "a/priced"\ntype = "embedding"\n'
        + priced
        + channel
        + '[[models]]\nname = "a/moderation"\ntype = "moderation"\n'
        + channel
        + '[[models]]\nname = "a/video"\ntype = "video"\n'
        + priced
        + channel
    )
    done = check(config, {"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "free" in line]
    assert len(warnings) == 2, done.stderr
    assert warnings[0].startswith(f"{config}: warning: a/free has no prices: every request is served free")
    assert warnings[1].startswith(f"{config}: warning: a/video: a video model is charged per second")
    assert not any("a/priced" in w or "a/moderation" in w for w in warnings)


def test_a_reasoning_price_the_upstream_cannot_apply_is_a_warning(tmp_path: Path) -> None:
    """Anthropic's Messages and Bedrock count thinking within the output tokens: a `reasoning`
    price set on such a model is never used (its thinking is billed as output), and says so."""
    config = tmp_path / "models.toml"
    prices = '[models.prices]\ninput = "1"\noutput = "2"\nreasoning = "8"\n'
    config.write_text(
        '[[models]]\nname = "a/claude"\ntype = "messages"\nmax_output_tokens = 4096\n'
        + prices
        + '[[models.channels]]\nprovider = "anthropic"\nbase_url = "http://127.0.0.1:1"\n'
        + '[[models]]\nname = "a/o4"\ntype = "chat"\nmax_output_tokens = 4096\n'
        + prices
        + '[[models.channels]]\nprovider = "openai"\nbase_url = "http://127.0.0.1:1/v1"\n'
    )
    done = check(config, {"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    (warning,) = [line for line in done.stderr.splitlines() if "reasoning" in line]
    assert warning.startswith(f"{config}: warning: a/claude: a `reasoning` price is set, but the upstream")
    assert "a/o4" not in warning
