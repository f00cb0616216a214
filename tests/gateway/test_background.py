"""Background responses (spec 1.4.4, deep research) through the gateway and the simulator: the
official openai client's create(background=True), retrieve and cancel; the estimated cost held at
start and settled to the actual cost exactly once when the response ends (or released when it
fails); a job surviving a killed gateway; another key's response is 404."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import openai
import pytest
from openai.types.responses import Response

from gateway.jobs import POLL_LEASE_MS
from harness import Gateway, KeyHandle, eventually, gateway, job_leases, process_tree, store_spec

DEEP = "openai/o4-mini-deep-research"
SLOW = "openai/o3-deep-research"
BROKEN = "openai/deep-research-broken"
PLAIN = "openai/gpt-4.1-nano"  # takes no `background`: it is dropped (spec 1.3)
INPUT_PRICE, OUTPUT_PRICE = Decimal("1000"), Decimal("4000")  # per million tokens
MAX_OUTPUT = 1000  # the hold is this much output at the output price, and the counted input


def model(name: str, upstream: str, sim_url: str, extra: str = "") -> str:
    return f"""
[[models]]
name = "{name}"
type = "responses"
max_output_tokens = {MAX_OUTPUT}
{extra}
[models.prices]
input = "{INPUT_PRICE}"
output = "{OUTPUT_PRICE}"
[[models.channels]]
provider = "openai"
base_url = "{sim_url}/v1"
model = "{upstream}"
"""


def models(sim_url: str, render: str = "1500ms") -> str:
    return (
        "[background]\npoll_seconds = 0.2\n"
        + model(DEEP, f"o4-mini-deep-research+render={render}", sim_url)
        + model(SLOW, "o3-deep-research+render=3s", sim_url)
        + model(BROKEN, "o3-deep-research+render=300ms+render_fail", sim_url)
        + model(PLAIN, "gpt-4.1-nano", sim_url, 'supported_params = ["max_output_tokens", "temperature"]')
    )


@pytest.fixture(scope="module")
def bgw(sim_url: str, tmp_path_factory: pytest.TempPathFactory, backend: str) -> Iterator[Gateway]:
    """The module's gateway, one on each store backend (tests/conftest.py)."""
    with gateway(tmp_path_factory.mktemp("background"), models(sim_url), backend=backend) as g:
        yield g


@pytest.fixture
def key(bgw: Gateway) -> KeyHandle:
    return bgw.new_key()


def client(gw: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.openai_base, api_key=key, max_retries=0)


def cost_of(response: Response) -> Decimal:
    assert response.usage is not None
    tokens = response.usage.input_tokens * INPUT_PRICE + response.usage.output_tokens * OUTPUT_PRICE
    return tokens / 1_000_000


def wait_until_ended(oai: openai.OpenAI, response_id: str, seconds: float = 10) -> Response:
    def ended() -> Response | None:
        response = oai.responses.retrieve(response_id)
        return None if response.status in ("queued", "in_progress") else response

    return eventually(ended, seconds, 0.05, what=f"the background response {response_id} ended")


def held_by(gw: Gateway, job_id: str) -> list[Decimal]:
    return [amount for owner, amount in job_leases(gw) if owner == f"job:{job_id}"]


def test_a_background_response_through_every_state_with_the_official_client(bgw: Gateway) -> None:
    handle = bgw.new_key(balance="10")
    oai = client(bgw, handle.key)
    created = oai.responses.create(model=DEEP, input="survey the kite makers of the coast", background=True)
    assert created.status == "queued" and created.id.startswith("resp_") and created.background
    assert created.output == [] and created.usage is None
    # Held, not charged: the estimate (1000 output tokens at $4000/M, and the input) is set aside.
    # The balance is read first: a hold still there afterwards proves it was not yet settled then
    # (settlement takes the hold and charges in one step). The render leaves room for a slow CI host.
    balance = bgw.balance(handle.account_id)
    (held,) = held_by(bgw, created.id)
    assert Decimal(4) < held < Decimal("4.1")
    assert balance == Decimal(10)

    seen: list[str] = [str(created.status)]
    deadline = time.monotonic() + 10
    while seen[-1] not in ("completed", "failed") and time.monotonic() < deadline:
        status = oai.responses.retrieve(created.id).status
        if status != seen[-1]:
            seen.append(str(status))
        time.sleep(0.03)
    assert seen == ["queued", "in_progress", "completed"]
    done = oai.responses.retrieve(created.id)
    assert done.id == created.id and done.output_text and done.usage is not None

    # Charged exactly what the upstream reports, once; the hold is gone.
    expected = Decimal(10) - cost_of(done)
    assert bgw.wait_balance(handle.account_id, expected) == expected
    assert held_by(bgw, created.id) == []
    with bgw.client(handle.key) as c:
        usage = c.get(f"/v1/usage/{created.id}").json()
    assert usage["status"] == "completed" and usage["usage"]["prompt_tokens"] == done.usage.input_tokens
    # The conversation continues from it like any stored response.
    follow = oai.responses.create(model=DEEP, input="and inland?", previous_response_id=done.id)
    assert follow.status == "completed" and follow.previous_response_id == done.id


def test_a_failed_background_response_releases_the_hold(bgw: Gateway) -> None:
    handle = bgw.new_key(balance="5")
    oai = client(bgw, handle.key)
    created = oai.responses.create(model=BROKEN, input="this one will not finish", background=True)
    done = wait_until_ended(oai, created.id)
    assert done.status == "failed" and done.error is not None and done.error.message
    assert held_by(bgw, created.id) == []
    assert bgw.balance(handle.account_id) == Decimal(5)
    with bgw.client(handle.key) as c:
        assert c.get(f"/v1/usage/{created.id}").status_code == 404


def test_cancel_charges_what_was_produced_once(bgw: Gateway) -> None:
    handle = bgw.new_key(balance="10")
    oai = client(bgw, handle.key)
    created = oai.responses.create(model=SLOW, input="a long study", background=True)
    deadline = time.monotonic() + 5
    while oai.responses.retrieve(created.id).status != "in_progress" and time.monotonic() < deadline:
        time.sleep(0.05)
    # Some output produced: the simulator's grows with the time spent in_progress, and shows only
    # in what the cancel reports.
    time.sleep(0.5)
    cancelled = oai.responses.cancel(created.id)
    assert cancelled.status == "cancelled" and cancelled.id == created.id
    assert cancelled.usage is not None and cancelled.usage.output_tokens > 0
    expected = Decimal(10) - cost_of(cancelled)
    assert bgw.wait_balance(handle.account_id, expected) == expected
    assert held_by(bgw, created.id) == []
    # Again: the same answer, nothing more charged; the poller leaves it as it is.
    assert oai.responses.cancel(created.id).status == "cancelled"
    time.sleep(0.5)  # the poller runs every 0.2 s: had it changed anything, it would have by now
    assert oai.responses.retrieve(created.id).status == "cancelled"
    assert bgw.balance(handle.account_id) == expected


def test_cancel_while_queued_charges_nothing(bgw: Gateway) -> None:
    handle = bgw.new_key(balance="10")
    oai = client(bgw, handle.key)
    created = oai.responses.create(model=SLOW, input="never mind", background=True)
    assert oai.responses.cancel(created.id).status == "cancelled"
    assert held_by(bgw, created.id) == []
    assert bgw.balance(handle.account_id) == Decimal(10)
    # Its record is its charge's: not deleted (400), and still there.
    with pytest.raises(openai.BadRequestError, match="background"):
        oai.responses.delete(created.id)
    assert oai.responses.retrieve(created.id).status == "cancelled"
    # Nor by another key of the account, which may continue its state (review: it deleted a
    # running one upstream, and the job was lost, never charged): not found for it.
    other = client(bgw, bgw.another_key(handle.account_id).key)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(created.id)
    assert oai.responses.retrieve(created.id).status == "cancelled"


def test_k_background_responses_accepted_when_the_balance_allows_k_holds(bgw: Gateway) -> None:
    handle = bgw.new_key(balance="10")  # each holds a little over $4
    oai = client(bgw, handle.key)
    accepted = [oai.responses.create(model=SLOW, input="hold me", background=True) for _ in range(2)]
    with pytest.raises(openai.BadRequestError) as refused:
        oai.responses.create(model=SLOW, input="hold me", background=True)
    assert refused.value.code == "insufficient_credits"
    assert all(r.status == "queued" for r in accepted)
    for response in accepted:
        oai.responses.cancel(response.id)


def test_another_keys_response_is_not_found(bgw: Gateway) -> None:
    """Another account's key, and another key of the same account (review: it was shown the whole
    response, and its cancel was a 400 saying the response had not run in the background)."""
    owner, stranger = bgw.new_key(), bgw.new_key()
    colleague = bgw.another_key(owner.account_id)
    created = client(bgw, owner.key).responses.create(model=DEEP, input="mine", background=True)
    for other in (stranger, colleague):
        with bgw.client(other.key) as c:
            for method, path in (("GET", ""), ("POST", "/cancel"), ("DELETE", "")):
                r = c.request(method, f"/v1/responses/{created.id}{path}")
                assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", (method, path)
            assert c.get("/v1/responses/resp_unknown").status_code == 404
    assert client(bgw, owner.key).responses.retrieve(created.id).id == created.id
    with bgw.client(None) as c:
        assert c.get(f"/v1/responses/{created.id}").status_code == 401


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"stream": True}, "stream"), ({"store": False}, "store"), ({"background": "yes"}, "background")],
)
def test_what_a_background_response_may_not_be(
    bgw: Gateway, key: KeyHandle, extra: dict[str, object], param: str
) -> None:
    with bgw.client(key.key) as c:
        r = c.post("/v1/responses", json={"model": DEEP, "input": "x", "background": True, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_request" and r.json()["error"]["param"] == param


def test_a_model_without_background_answers_at_once(bgw: Gateway, key: KeyHandle) -> None:
    with bgw.client(key.key) as c:
        r = c.post("/v1/responses", json={"model": PLAIN, "input": "now please", "background": True})
    assert r.status_code == 200 and r.json()["status"] == "completed"
    assert Decimal(r.headers["x-service-cost"]) > 0


def test_a_background_response_survives_a_killed_gateway(sim_url: str, tmp_path: Path, backend: str) -> None:
    """kill -9 while it runs: the next gateway on the same store finishes it, charges it once and
    leaves no hold behind."""
    config = models(sim_url, render="2s")
    with store_spec(tmp_path, backend) as store:
        with gateway(tmp_path, config, store=store) as first:
            handle = first.new_key(balance="10")
            created = client(first, handle.key).responses.create(
                model=DEEP, input="through a crash", background=True
            )
            for pid in process_tree(first.proc.pid):
                os.kill(pid, signal.SIGKILL)
            first.proc.wait()
        with gateway(tmp_path, config, store=store) as second:
            # Killed in the middle of a poll, the first gateway leaves the job leased to it for
            # POLL_LEASE_MS (gateway.jobs): the next one takes it over at the latest then.
            done = wait_until_ended(client(second, handle.key), created.id, POLL_LEASE_MS / 1000 + 15)
            assert done.status == "completed"
            expected = Decimal(10) - cost_of(done)
            assert second.wait_balance(handle.account_id, expected) == expected
            time.sleep(0.5)  # further polls change nothing
            assert second.balance(handle.account_id) == expected
            ((charges,),) = second.query("SELECT COUNT(*) FROM usage_records WHERE id = ?", created.id)
            assert charges == 1 and job_leases(second) == []


def test_cancelling_a_foreground_response_is_400(bgw: Gateway) -> None:
    """As OpenAI answers it: only a background response can be cancelled; one that ran in the
    foreground exists, so it is not a 404 (review)."""
    oai = client(bgw, bgw.new_key().key)
    created = oai.responses.create(model=DEEP, input="now")
    with pytest.raises(openai.BadRequestError, match="only a background response can be cancelled"):
        oai.responses.cancel(created.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.cancel("resp_unknown")


def test_a_finished_background_response_s_items_are_its_account_s(bgw: Gateway) -> None:
    """Its output items are recorded when it ends (security review: an item_reference names an
    upstream's item only for the account whose response made it)."""
    with client(bgw, bgw.new_key(balance="10").key) as owner, client(bgw, bgw.new_key().key) as stranger:
        created = owner.responses.create(model=DEEP, input="items of a background response", background=True)
        ended = wait_until_ended(owner, created.id)
        assert ended.status == "completed" and ended.output
        item_id = ended.output[-1].id
        assert item_id is not None
        reference = [{"type": "item_reference", "id": item_id}, {"role": "user", "content": "more"}]
        again = owner.responses.create(model=DEEP, input=reference)  # type: ignore[arg-type]
        assert again.status == "completed"
        with pytest.raises(openai.BadRequestError) as err:
            stranger.responses.create(model=DEEP, input=reference)  # type: ignore[arg-type]
        assert err.value.code == "invalid_request" and item_id in err.value.message
