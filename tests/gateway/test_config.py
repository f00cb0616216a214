"""Configuration: the demo file loads; mistakes are reported with the place they are in."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import SIM_PORT, _on_sim_port
from gateway.config import (
    CONFIG_ENV,
    WORKERS_ENV,
    ConfigError,
    load_settings,
    parse_settings,
    settings_from_env,
)

ROOT = Path(__file__).resolve().parents[2]
CHANNEL = {"provider": "openai", "base_url": "http://127.0.0.1:1/v1"}


def test_demo_config_loads() -> None:
    settings = load_settings(ROOT / "config" / "demo.toml")
    assert {m.name for m in settings.models} >= {"openai/gpt-4o-mini"}
    assert settings.store_path.is_absolute()
    assert settings.max_request_bytes == 10 * 1024 * 1024
    assert any(m.type == "video" for m in settings.models)  # a newcomer sees a whole video job
    assert any(len(m.channels) > 1 for m in settings.models)


def model(**overrides: object) -> dict[str, object]:
    return {"name": "a/b", "type": "chat", "channels": [CHANNEL], **overrides}


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ({}, "[[models]]"),
        ({"models": [model(name="nope")]}, "models[0].name"),
        ({"models": [model(type="poetry")]}, "models[0].type"),
        ({"models": [model(channels=[])]}, "models[0].channels"),
        ({"models": [model(channels=[{**CHANNEL, "provider": "x"}])]}, "models[0].channels[0].provider"),
        (
            {"models": [model(channels=[{**CHANNEL, "base_url": "ftp://x"}])]},
            "models[0].channels[0].base_url",
        ),
        ({"models": [model(prices={"input": "abc"})]}, "models[0].prices.input"),
        ({"models": [model(prices={"input": "-1"})]}, "models[0].prices.input"),
        ({"models": [model(prices={"inptu": "1"})]}, "models[0].prices"),
        ({"models": [model(prices={"images": {"1024x1024/": "1"}})]}, "models[0].prices.images"),
        ({"models": [model(prices={"images": {"1024x1024": "x"}})]}, "models[0].prices.images.1024x1024"),
        ({"models": [model(prices={"images": "0.04"})]}, "models[0].prices.images"),
        ({"models": [model()], "logs": {"max_body_bytes": -1}}, "logs.max_body_bytes"),
        ({"models": [model()], "logs": {"body_retention_days": 0}}, "body_retention_days"),
        ({"models": [model(tokenizer="gpt2")]}, "models[0].tokenizer"),
        ({"models": [model(), model()]}, "duplicate"),
        ({"models": [model()], "server": {"port": "80"}}, "server.port"),
        ({"models": [model()], "limits": {"sync_timeout_seconds": 0}}, "sync_timeout_seconds"),
        ({"models": [model(channels=[{**CHANNEL, "weight": 0}])]}, "models[0].channels[0].weight"),
        ({"models": [model(channels=[{**CHANNEL, "max_concurrency": 0}])]}, "channels[0].max_concurrency"),
        ({"models": [model(channels=[{**CHANNEL, "priority": "high"}])]}, "models[0].channels[0].priority"),
        (
            {"models": [model(channels=[CHANNEL, {**CHANNEL, "provider": "anthropic"}])]},
            "every channel of a model must have the same provider",
        ),
        ({"models": [model(channels=[{**CHANNEL, "name": "a"}] * 2)]}, "channel names must differ"),
        ({"models": [model()], "routing": {"retries": -1}}, "routing.retries"),
        ({"models": [model()], "routing": {"failures_to_cool_down": 0}}, "routing.failures_to_cool_down"),
        ({"models": [model()], "videos": {"poll_seconds": 0}}, "poll_seconds"),
    ],
)
def test_config_errors_name_the_place(raw: dict[str, object], where: str) -> None:
    with pytest.raises(ConfigError, match=__import__("re").escape(where)):
        parse_settings(raw, Path("/tmp"))


def test_prices_are_exact_decimals() -> None:
    settings = parse_settings({"models": [model(prices={"input": 0.1, "output": "0.3"})]}, Path("/tmp"))
    prices = settings.models[0].prices
    assert str(prices.input) == "0.1"
    assert str(prices.cached_input) == "0.1"
    assert str(prices.reasoning) == "0.3"


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "missing.toml")


def test_serve_workers_reach_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gateway serve --workers N` overrides the file for the workers, which size leases by it."""
    monkeypatch.setenv(CONFIG_ENV, str(ROOT / "config" / "demo.toml"))
    monkeypatch.setenv(WORKERS_ENV, "3")
    assert settings_from_env().workers == 3
    monkeypatch.delenv(WORKERS_ENV)
    assert settings_from_env().workers == load_settings(ROOT / "config" / "demo.toml").workers


def test_the_demo_on_another_simulator_port_serves_a_copy_that_reaches_it(tmp_path: Path) -> None:
    original = tmp_path / "demo.toml"
    original.write_text((ROOT / "config" / "demo.toml").read_text())
    assert _on_sim_port(str(original), SIM_PORT) == str(original)
    copy = Path(_on_sim_port(str(original), 9934))
    assert copy.parent == original.parent  # relative paths (the store) resolve alike
    settings, moved = load_settings(original), load_settings(copy)
    assert settings.store_path == moved.store_path
    urls = [c.base_url for m in moved.models for c in m.channels]
    assert urls and all(":9934" in url for url in urls)
