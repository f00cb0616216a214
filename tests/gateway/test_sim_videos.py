"""The simulator's OpenAI Videos API: jobs that are queued, then in progress, then completed or failed,
created with JSON or with the official client's multipart form, and a real MP4 to download."""

from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.sim.directives import DirectiveError, parse
from harness import eventually

# The client warns on every Sora call that the hosted API is to shut down; the wire format is the point.
pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")


@pytest.fixture
def client(sim_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=sim_url + "/v1", api_key="sk-sim", max_retries=0) as c:
        yield c


def create(sim: httpx.Client, **fields: Any) -> dict[str, Any]:
    r = sim.post("/v1/videos", json=fields)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def wait_for_end(sim: httpx.Client, video_id: str, limit: float = 5.0) -> list[dict[str, Any]]:
    """Every state seen while polling until the job is over."""
    seen: list[dict[str, Any]] = []

    def over() -> bool:
        seen.append(sim.get(f"/v1/videos/{video_id}").json())
        return seen[-1]["status"] in ("completed", "failed")

    eventually(over, limit, what=lambda: f"{video_id} over (still {seen[-1]['status']})")
    return seen


def assert_openai_error(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["param"] == param
    return error


def mp4_size(data: bytes) -> tuple[int, int]:
    """Width and height from the video track's tkhd (16.16 fixed point, its last eight bytes)."""
    at = data.index(b"tkhd") - 4
    (length,) = struct.unpack_from(">I", data, at)
    width, height = struct.unpack_from(">II", data, at + length - 8)
    return width >> 16, height >> 16


def test_directives_for_videos() -> None:
    model, d = parse("sora-2+render=300ms", None, "a cat [sim render_fail]")
    assert (model, d.render, d.render_fail) == ("sora-2", 0.3, True)
    _, defaults = parse("sora-2", None, None)
    assert (defaults.render, defaults.render_fail) == (2.0, False)
    with pytest.raises(DirectiveError):
        parse("sora-2+render", None, None)


def test_create_with_json_answers_a_queued_video_object(sim: httpx.Client) -> None:
    before = int(time.time())
    video = create(sim, model="sora-2-pro+render=5s", prompt="a lighthouse", seconds=8, size="1280x720")
    assert video.pop("id").startswith("video_")
    assert before <= video.pop("created_at") <= time.time()
    assert video == {
        "object": "video",
        "status": "queued",
        "model": "sora-2-pro",
        "progress": 0,
        "seconds": "8",
        "size": "1280x720",
        "prompt": "a lighthouse",
        "completed_at": None,
        "expires_at": None,
        "error": None,
        "remixed_from_video_id": None,
    }
    defaults = create(sim, prompt="defaults [sim render=5s]")
    assert (defaults["model"], defaults["seconds"], defaults["size"]) == ("sora-2", "4", "720x1280")


def test_official_client_drives_a_job_to_completion(
    sim: httpx.Client, client: openai.OpenAI, sim_url: str
) -> None:
    prompt = f"a paper boat {uuid.uuid4().hex}"
    video = client.videos.create(model="sora-2+render=600ms", prompt=prompt, seconds="4")
    assert (video.status, video.model, video.seconds) == ("queued", "sora-2", "4")
    states = [video.model_dump(), *wait_for_end(sim, video.id)]
    statuses = [s["status"] for s in states]
    assert list(dict.fromkeys(statuses)) == ["queued", "in_progress", "completed"]
    progress = [s["progress"] for s in states]
    assert progress == sorted(progress) and all(p < 100 for p in progress[:-1])

    done = client.videos.retrieve(video.id)
    assert (done.status, done.progress, done.error) == ("completed", 100, None)
    assert done.completed_at is not None and done.expires_at == done.completed_at + 3600

    content = client.videos.download_content(video.id)
    data = content.read()
    assert content.response.headers["content-type"] == "video/mp4"
    assert data[4:8] == b"ftyp"
    assert mp4_size(data) == (64, 128)  # 720x1280 scaled to a long side of 128, whole macroblocks
    again = httpx.get(f"{sim_url}/v1/videos/{video.id}/content", params={"variant": "video"})
    assert again.status_code == 200 and again.content == data

    # The form fields are recorded as sent, directives included, and every poll is there to count.
    log = sim.get("/_sim/requests").json()
    made = [r for r in log if r.get("method") == "POST" and r["body"].get("prompt") == prompt]
    assert len(made) == 1
    assert made[0]["body"] == {"prompt": prompt, "model": "sora-2+render=600ms", "seconds": "4"}
    assert made[0]["authorization"] == "Bearer sk-sim"
    polls = [r for r in log if r.get("path") == f"/v1/videos/{video.id}" and r.get("method") == "GET"]
    assert len(polls) == len(states)  # the polls while waiting and the client's retrieve
    assert sum(r.get("path") == f"/v1/videos/{video.id}/content" for r in log) == 2


def test_render_fail_ends_failed_without_content(sim: httpx.Client) -> None:
    video = create(sim, model="sora-2", prompt="a storm [sim render=100ms render_fail]")
    end = wait_for_end(sim, video["id"])[-1]
    assert end["status"] == "failed"
    assert end["error"]["code"] == "video_generation_failed" and end["error"]["message"]
    assert end["expires_at"] is None
    assert_openai_error(sim.get(f"/v1/videos/{video['id']}/content"), 404)


def test_fail_directive_on_create(sim: httpx.Client) -> None:
    r = sim.post("/v1/videos", json={"model": "sora-2+fail=500", "prompt": "x"})
    assert assert_openai_error(r, 500)["type"] == "server_error"
    limited = sim.post("/v1/videos", json={"model": "sora-2", "prompt": "x [sim fail=429]"})
    assert assert_openai_error(limited, 429)["type"] == "rate_limit_error"
    assert limited.headers["retry-after"] == "1"


@pytest.mark.parametrize("suffix", ["", "/content"])
def test_unknown_video_is_not_found(sim: httpx.Client, suffix: str) -> None:
    error = assert_openai_error(sim.get(f"/v1/videos/video_missing{suffix}"), 404)
    assert (error["type"], error["code"]) == ("invalid_request_error", "not_found")


def test_content_is_refused_until_completed(sim: httpx.Client) -> None:
    video = create(sim, model="sora-2+render=5s", prompt="slow")
    error = assert_openai_error(sim.get(f"/v1/videos/{video['id']}/content"), 404)
    assert "not ready" in error["message"]
    bad = sim.get(f"/v1/videos/{video['id']}/content", params={"variant": "thumbnail"})
    assert_openai_error(bad, 400, "variant")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": "sora-2"}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x", "seconds": "0"}, "seconds"),
        ({"prompt": "x", "seconds": 61}, "seconds"),
        ({"prompt": "x", "seconds": "four"}, "seconds"),
        ({"prompt": "x", "size": "big"}, "size"),
    ],
)
def test_bad_create_requests(sim: httpx.Client, fields: dict[str, Any], param: str) -> None:
    error = assert_openai_error(sim.post("/v1/videos", json=fields), 400, param)
    assert error["type"] == "invalid_request_error"


def test_list_newest_first_and_delete(sim: httpx.Client) -> None:
    older = create(sim, prompt="first [sim render=5s]")
    newer = create(sim, prompt="second [sim render=5s]")
    page = sim.get("/v1/videos", params={"limit": 2}).json()
    assert page["object"] == "list" and page["has_more"] is True
    assert [v["id"] for v in page["data"]] == [newer["id"], older["id"]]
    assert (page["first_id"], page["last_id"]) == (newer["id"], older["id"])
    after = sim.get("/v1/videos", params={"limit": 1, "after": newer["id"]}).json()
    assert [v["id"] for v in after["data"]] == [older["id"]]

    gone = sim.delete(f"/v1/videos/{older['id']}")
    assert gone.json() == {"id": older["id"], "object": "video.deleted", "deleted": True}
    assert_openai_error(sim.get(f"/v1/videos/{older['id']}"), 404)
