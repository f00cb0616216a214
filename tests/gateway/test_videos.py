"""Asynchronous video jobs (spec 2.2, 3.1, 1.4.4) through the gateway and the simulator: the official
openai client's video methods, the hold placed at creation and settled or released exactly once,
jobs surviving a killed gateway, per-key visibility, and Idempotency-Key on creation."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.jobs import POLL_LEASE_MS
from harness import Gateway, KeyHandle, eventually, gateway, job_leases, process_tree, store_spec

SORA = "openai/sora-2"
BROKEN = "openai/sora-broken"
VIDEOS = "/v1/videos"
PRICE_PER_SECOND = Decimal("0.10")


def video_models(sim_url: str, render: str = "600ms") -> str:
    return f"""
[videos]
poll_seconds = 0.2

[[models]]
name = "{SORA}"
type = "video"
[models.prices]
second = "{PRICE_PER_SECOND}"
[[models.channels]]
provider = "openai"
base_url = "{sim_url}/v1"
model = "sora-2+render={render}"

[[models]]
name = "{BROKEN}"
type = "video"
[models.prices]
second = "{PRICE_PER_SECOND}"
[[models.channels]]
provider = "openai"
base_url = "{sim_url}/v1"
model = "sora-2+render=300ms+render_fail"

[[models]]
name = "openai/gpt-4o-mini"
type = "chat"
[[models.channels]]
provider = "openai"
base_url = "{sim_url}/v1"
"""


@pytest.fixture
def key(vgw: Gateway) -> KeyHandle:
    return vgw.new_key()


@pytest.fixture(scope="module")
def vgw(sim_url: str, tmp_path_factory: pytest.TempPathFactory, backend: str) -> Iterator[Gateway]:
    """The module's gateway, one on each store backend (tests/conftest.py)."""
    with gateway(tmp_path_factory.mktemp("videos"), video_models(sim_url), backend=backend) as g:
        yield g


def client(gw: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.openai_base, api_key=key, max_retries=0)


def wait_for(gw: Gateway, key: str, video_id: str, seconds: float = 10) -> dict[str, Any]:
    with gw.client(key) as c:

        def ended() -> dict[str, Any] | None:
            job: dict[str, Any] = c.get(f"{VIDEOS}/{video_id}").json()
            return job if job["status"] in ("completed", "failed") else None

        return eventually(ended, seconds, 0.05, what=f"the video job {video_id} ended")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks the Sora methods deprecated
def test_a_job_through_every_state_with_the_official_client(vgw: Gateway) -> None:
    handle = vgw.new_key(balance="10")
    oai = client(vgw, handle.key)
    created = oai.videos.create(model=SORA, prompt="a red kite over the sea", seconds="4")
    assert created.status == "queued" and created.id.startswith("video_") and created.progress == 0
    assert created.model == SORA and created.seconds == "4"
    assert created.size == "720x1280"  # none asked: the upstream's default, as it reported it
    # Held, not charged: the balance moves when the job completes.
    assert [amount for _, amount in job_leases(vgw) if _ == f"job:{created.id}"] == [Decimal("0.4")]
    assert vgw.balance(handle.account_id) == Decimal(10)

    seen: list[str] = [created.status]
    deadline = time.monotonic() + 10
    while seen[-1] != "completed" and time.monotonic() < deadline:
        job = oai.videos.retrieve(created.id)
        if job.status != seen[-1]:
            seen.append(job.status)
        time.sleep(0.03)
    assert seen == ["queued", "in_progress", "completed"]
    done = oai.videos.retrieve(created.id)
    assert done.progress == 100 and done.completed_at is not None and done.expires_at is not None
    assert done.expires_at - done.completed_at == 86400
    extra = done.model_extra or {}
    assert extra["download_url"] == f"{vgw.openai_base}/videos/{created.id}/content"

    content = oai.videos.download_content(created.id).read()
    assert content[4:8] == b"ftyp" and len(content) > 1000
    with vgw.client(handle.key) as c:
        r = c.get(extra["download_url"])
        assert r.status_code == 200 and r.headers["content-type"] == "video/mp4" and r.content == content
        usage = c.get(f"/v1/usage/{created.id}").json()
    assert Decimal(str(usage["cost"])) == 4 * PRICE_PER_SECOND and usage["status"] == "completed"
    assert vgw.wait_balance(handle.account_id, Decimal("9.6")) == Decimal("9.6")
    assert job_leases(vgw) == [] or all(owner != f"job:{created.id}" for owner, _ in job_leases(vgw))
    assert [v.id for v in oai.videos.list()] == [created.id]
    assert [v.id for v in oai.videos.list(after=created.id)] == []  # the list's end
    with pytest.raises(openai.BadRequestError):  # a cursor that names nothing is no end
        oai.videos.list(after="video_nope")
    assert oai.videos.poll(created.id).status == "completed"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_failed_render_releases_the_hold_and_charges_nothing(vgw: Gateway) -> None:
    handle = vgw.new_key(balance="1")
    oai = client(vgw, handle.key)
    created = oai.videos.create(model=BROKEN, prompt="this one will not render", seconds="8")
    job = oai.videos.poll(created.id, poll_interval_ms=50)
    assert job.status == "failed" and job.error is not None
    assert job.error.code == "video_generation_failed" and job.error.message
    assert all(owner != f"job:{created.id}" for owner, _ in job_leases(vgw))
    assert vgw.balance(handle.account_id) == Decimal(1)
    with vgw.client(handle.key) as c:
        r = c.get(f"{VIDEOS}/{created.id}/content")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert c.get(f"/v1/usage/{created.id}").status_code == 404
    # The whole balance is free again: a job costing all of it is accepted.
    # seconds: the SDK's type lists Sora's own lengths; the gateway passes any whole number on.
    assert oai.videos.create(model=SORA, prompt="all of it", seconds="10").status == "queued"  # type: ignore[arg-type]


def test_a_job_is_charged_at_the_prices_it_was_held_at(sim_url: str, tmp_path: Path, backend: str) -> None:
    """Money review: a reload that raised the price during a render charged the job at the new
    price (8 s at $1 on a hold of $0.80 at $0.10), past its hold, the key's limit and the balance.
    A job is charged at the configuration it began under, as a request is."""
    with gateway(tmp_path, video_models(sim_url, render="4s"), backend=backend) as g:
        handle = g.new_key(balance="1")
        with g.client(handle.key) as c:
            created = c.post(VIDEOS, json={"model": SORA, "prompt": "a reload meanwhile", "seconds": "8"})
            assert created.status_code == 200, created.text
            video_id = created.json()["id"]
            assert g.config_path is not None
            g.config_path.write_text(
                g.config_path.read_text().replace(f'second = "{PRICE_PER_SECOND}"', 'second = "1.00"')
            )
            g.proc.send_signal(signal.SIGHUP)

        def get(path: str, **params: str) -> Any:
            # A connection of its own each time: a kept-alive one may be the old worker's, which
            # closes it as the reload stops it.
            auth = {"authorization": f"Bearer {handle.key}"}
            return httpx.get(g.url + path, params=params, headers=auth, timeout=10).json()

        def repriced() -> bool:
            info = get("/model_group/info", model_group=SORA)
            return Decimal(info["data"][0]["cost_per_second"]) == Decimal(1)

        eventually(repriced, 10, 0.1, what="the reload")
        assert get(f"{VIDEOS}/{video_id}")["status"] != "completed"  # reloaded mid-render
        eventually(lambda: get(f"{VIDEOS}/{video_id}")["status"] == "completed", 15, 0.1, what="the render")
        usage = get(f"/v1/usage/{video_id}")
        assert Decimal(str(usage["cost"])) == 8 * PRICE_PER_SECOND, usage
        assert g.wait_balance(handle.account_id, Decimal("0.2")) == Decimal("0.2")
        # A job made after the reload is held and charged at the new price.
        with g.client(handle.key) as c:
            refused = c.post(VIDEOS, json={"model": SORA, "prompt": "now dearer", "seconds": "1"})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "insufficient_credits"


def test_json_creation_and_the_content_before_completion(vgw: Gateway, key: KeyHandle) -> None:
    with vgw.client(key.key) as c:
        r = c.post(VIDEOS, json={"model": SORA, "prompt": "slow one", "seconds": "4", "size": "1280x720"})
        assert r.status_code == 200, r.text
        job = r.json()
        assert r.headers["x-service-request-id"] and job["status"] == "queued" and job["size"] == "1280x720"
        early = c.get(f"{VIDEOS}/{job['id']}/content")
        assert early.status_code == 404 and early.json()["error"]["code"] == "not_found"
        assert int(c.get(f"{VIDEOS}/{job['id']}").headers["openai-poll-after-ms"]) == 200
    assert wait_for(vgw, key.key, job["id"])["status"] == "completed"


def test_another_keys_job_is_not_found(vgw: Gateway) -> None:
    owner, stranger = vgw.new_key(), vgw.new_key()
    with vgw.client(owner.key) as c:
        job = c.post(VIDEOS, json={"model": SORA, "prompt": "mine", "seconds": "4"}).json()
    with vgw.client(stranger.key) as c:
        for path in (f"{VIDEOS}/{job['id']}", f"{VIDEOS}/{job['id']}/content"):
            r = c.get(path)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert c.get(VIDEOS).json()["data"] == []
    with vgw.client(None) as c:
        assert c.get(f"{VIDEOS}/{job['id']}").status_code == 401


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": SORA}, "prompt"),
        ({"model": SORA, "prompt": "x", "seconds": "0"}, "seconds"),
        ({"model": SORA, "prompt": "x", "seconds": "soon"}, "seconds"),
        ({"model": SORA, "prompt": "x", "size": "big"}, "size"),
        ({"model": "openai/gpt-4o-mini", "prompt": "x"}, "model"),
    ],
)
def test_bad_requests_are_refused_before_anything_runs(
    vgw: Gateway, key: KeyHandle, body: dict[str, Any], param: str
) -> None:
    with vgw.client(key.key) as c:
        r = c.post(VIDEOS, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert vgw.balance(key.account_id) == Decimal(100)


def test_k_jobs_are_accepted_when_the_balance_allows_k_holds(vgw: Gateway) -> None:
    handle = vgw.new_key(balance="1")  # each 4-second job holds 0.40: two fit

    async def create_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=vgw.url, timeout=30) as c:
            headers = {"authorization": f"Bearer {handle.key}"}
            body = {"model": SORA, "prompt": "one of many", "seconds": "4"}
            return await asyncio.gather(*(c.post(VIDEOS, json=body, headers=headers) for _ in range(6)))

    answers = asyncio.run(create_all())
    accepted = [r.json()["id"] for r in answers if r.status_code == 200]
    refused = [r.json()["error"]["code"] for r in answers if r.status_code != 200]
    assert len(accepted) == 2 and refused == ["insufficient_credits"] * 4
    for video_id in accepted:
        assert wait_for(vgw, handle.key, video_id)["status"] == "completed"
    assert vgw.wait_balance(handle.account_id, Decimal("0.2")) == Decimal("0.2")


def test_an_idempotency_key_makes_one_job_and_one_hold(vgw: Gateway, sim: httpx.Client) -> None:
    handle = vgw.new_key(balance="10")
    prompt = "exactly once " + os.urandom(4).hex()
    headers = {"authorization": f"Bearer {handle.key}", "idempotency-key": "job-" + prompt}

    async def create_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=vgw.url, timeout=30) as c:
            body = {"model": SORA, "prompt": prompt, "seconds": "4"}
            return await asyncio.gather(*(c.post(VIDEOS, json=body, headers=headers) for _ in range(50)))

    answers = asyncio.run(create_all())
    ids = {r.json()["id"] for r in answers if r.status_code == 200}
    assert len(ids) == 1
    assert all(
        r.status_code == 200 or r.json()["error"]["code"] == "idempotency_key_in_progress" for r in answers
    )
    received = sim.get("/_sim/requests").json()
    created = [e for e in received if e.get("method") == "POST" and prompt in str(e.get("body"))]
    assert len(created) == 1  # one upstream job
    [video_id] = ids
    with vgw.client(handle.key) as c:
        assert [j["id"] for j in c.get(VIDEOS).json()["data"]] == [video_id]
    assert wait_for(vgw, handle.key, video_id)["status"] == "completed"
    assert vgw.wait_balance(handle.account_id, Decimal("9.6")) == Decimal("9.6")


def test_a_job_survives_a_killed_gateway(sim_url: str, tmp_path: Path, backend: str) -> None:
    """kill -9 while the job renders: the next gateway on the same store finishes it, charges it
    once and leaves no hold behind."""
    models = video_models(sim_url, render="2s")
    with store_spec(tmp_path, backend) as store:
        with gateway(tmp_path, models, store=store) as first:
            handle = first.new_key(balance="5")
            with first.client(handle.key) as c:
                job = c.post(VIDEOS, json={"model": SORA, "prompt": "through a crash", "seconds": "4"}).json()
            for pid in process_tree(first.proc.pid):
                os.kill(pid, signal.SIGKILL)
            first.proc.wait()
        with gateway(tmp_path, models, store=store) as second:
            # Killed while polling, the first gateway still held the job's poll lease: the second
            # takes the job over once that lease has run out (docs/behaviour.md: within a minute).
            done = wait_for(second, handle.key, job["id"], seconds=POLL_LEASE_MS / 1000 + 15)
            assert done["status"] == "completed"
            assert second.wait_balance(handle.account_id, Decimal("4.6")) == Decimal("4.6")
            time.sleep(0.5)  # further polls change nothing
            assert second.balance(handle.account_id) == Decimal("4.6")
            ((charges,),) = second.query("SELECT COUNT(*) FROM usage_records WHERE id = ?", job["id"])
            assert charges == 1 and job_leases(second) == []


def test_the_hold_outlives_the_process_that_placed_it(sim_url: str, tmp_path: Path, backend: str) -> None:
    """The job's hold is its own lease in the store: a restarted gateway cannot spend it twice."""
    models = video_models(sim_url, render="3s")
    with store_spec(tmp_path, backend) as store:
        with gateway(tmp_path, models, store=store) as first:
            handle = first.new_key(balance="1")
            with first.client(handle.key) as c:
                body = {"model": SORA, "prompt": "hold it", "seconds": "8"}
                assert c.post(VIDEOS, json=body).status_code == 200
        with gateway(tmp_path, models, store=store) as second, second.client(handle.key) as c:
            # 0.80 is held by the running job: another 0.40 job does not fit in what is left.
            r = c.post(VIDEOS, json={"model": SORA, "prompt": "too much", "seconds": "4"})
            assert r.status_code == 400 and r.json()["error"]["code"] == "insufficient_credits"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_expired_file_has_no_download_url(sim_url: str, tmp_path: Path) -> None:
    """Past `file_ttl_seconds` the file is gone (404): the job no longer names a URL that answers
    404 (console review); `expires_at` says when that came."""
    config = video_models(sim_url, render="100ms").replace(
        "poll_seconds = 0.2", "poll_seconds = 0.1\nfile_ttl_seconds = 1"
    )
    with gateway(tmp_path, config) as g:
        handle = g.new_key(balance="10")
        created = client(g, handle.key).videos.create(model=SORA, prompt="brief", seconds="4")
        done = wait_for(g, handle.key, created.id)
        assert done["status"] == "completed" and done["download_url"]
        time.sleep(max(0.0, done["expires_at"] + 1.05 - time.time()))
        with g.client(handle.key) as c:
            later = c.get(f"{VIDEOS}/{created.id}").json()
            assert later["status"] == "completed" and later["download_url"] is None
            assert c.get(f"{VIDEOS}/{created.id}/content").status_code == 404


def test_a_form_field_given_twice_is_refused(vgw: Gateway, key: KeyHandle) -> None:
    """Held for one copy of `seconds`, a job whose upstream read the other would render (and be
    charged for) another length (evasion review: 12 s sent before 4 s, 4 s held)."""
    parts = [
        ("model", (None, SORA)),
        ("prompt", (None, "x")),
        ("seconds", (None, "12")),
        ("seconds", (None, "4")),
    ]
    with vgw.client(key.key) as c:
        r = c.post(VIDEOS, files=parts)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("invalid_request", "seconds")
