"""GET /admin/v1/openapi.json, the management API's OpenAPI 3.1 document, against a real gateway: it
is well formed (every operation answers something, every $ref resolves, every path parameter is
declared), it describes exactly the routes the app registers under /admin/v1 (a route added without
its description fails here), and the API's real answers, successes and errors, fit what it says."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import BaseRoute, Mount, Route

from gateway.app import create_app
from harness import Gateway, chat_model, gateway, request_logs

TOKEN_ENV = "GATEWAY_TEST_ADMIN_TOKEN"
TOKEN = "admin-" + "0123456789abcdef" * 3
MODEL = "openai/gpt-4o-mini"
PREFIX = "/admin/v1"
DOCUMENT = PREFIX + "/openapi.json"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
PARAM = re.compile(r"{([^}]+)}")


@pytest.fixture(scope="module")
def agw(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    admin = f'\n[admin]\ntoken_env = "{TOKEN_ENV}"\n'
    models = chat_model(MODEL, "gpt-4o-mini", sim_url)
    with gateway(tmp_path_factory.mktemp("openapi"), models + admin, env={TOKEN_ENV: TOKEN}) as g:
        yield g


@pytest.fixture(scope="module")
def spec(agw: Gateway) -> dict[str, Any]:
    r = httpx.get(agw.url + DOCUMENT, headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    document: dict[str, Any] = r.json()
    return document


def operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(method in upper case, path, operation) of every operation in the document."""
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield method.upper(), path, operation


def resolve(spec: dict[str, Any], node: Any) -> Any:
    """The node a $ref points to (followed as long as there is one), or the node itself."""
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert isinstance(ref, str) and ref.startswith("#/"), f"not a local reference: {ref}"
        target: Any = spec
        for escaped in ref[2:].split("/"):
            part = escaped.replace("~1", "/").replace("~0", "~")
            assert isinstance(target, dict) and part in target, f"{ref} does not resolve"
            target = target[part]
        node = target
    return node


def references(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from references(value)
    elif isinstance(node, list):
        for value in node:
            yield from references(value)


# ---------------------------------------------------------------- a JSON Schema check, by hand

TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
    "integer": int,
    "number": (int, float),
}


def has_type(value: Any, name: str) -> bool:
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    return isinstance(value, TYPES[name])


def check(spec: dict[str, Any], value: Any, schema: dict[str, Any], where: str = "$") -> None:
    """Assert that `value` fits `schema` (the subset of JSON Schema the document uses), and more
    strictly: an object whose schema lists every property as required has no other property, so an
    answer cannot carry a field its description leaves out."""
    schema = resolve(spec, schema)
    for part in schema.get("allOf", ()):
        check(spec, value, part, where)
    if "anyOf" in schema:
        failures = []
        for option in schema["anyOf"]:
            try:
                check(spec, value, option, where)
                break
            except AssertionError as exc:
                failures.append(str(exc))
        else:
            raise AssertionError(f"{where}: {value!r} fits none of anyOf: {failures}")
    if "const" in schema:
        assert value == schema["const"], f"{where}: {value!r} is not {schema['const']!r}"
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} is not one of {schema['enum']}"
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        assert any(has_type(value, t) for t in types), f"{where}: {value!r} is not of type {types}"
    if isinstance(value, str) and "pattern" in schema:
        assert re.search(schema["pattern"], value), f"{where}: {value!r} does not match {schema['pattern']}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        assert value >= schema.get("minimum", value), f"{where}: {value} is below the minimum"
        assert value <= schema.get("maximum", value), f"{where}: {value} is above the maximum"
    if isinstance(value, dict) and "properties" in schema:
        properties = schema["properties"]
        missing = set(schema.get("required", ())) - value.keys()
        assert not missing, f"{where}: missing {sorted(missing)}"
        if schema.get("type") == "object" and set(schema.get("required", ())) == set(properties):
            undocumented = value.keys() - properties.keys()
            assert not undocumented, f"{where}: not in the document: {sorted(undocumented)}"
        for name, item in value.items():
            if name in properties:
                check(spec, item, properties[name], f"{where}.{name}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            check(spec, item, schema["items"], f"{where}[{i}]")


def answer_schema(spec: dict[str, Any], operation: dict[str, Any], status: int) -> dict[str, Any]:
    """The schema the operation documents for an answer with this status (which it must document)."""
    assert str(status) in operation["responses"], (
        f"{operation['operationId']} answered {status}, which the document does not list"
    )
    response = resolve(spec, operation["responses"][str(status)])
    schema: dict[str, Any] = response["content"]["application/json"]["schema"]
    return schema


# ---------------------------------------------------------------- the document itself


def test_the_document_is_well_formed_openapi_3_1(spec: dict[str, Any]) -> None:
    assert re.fullmatch(r"3\.1\.\d+", spec["openapi"])
    assert spec["info"]["title"] and spec["info"]["version"]
    assert spec["paths"] and all(path.startswith(PREFIX + "/") for path in spec["paths"])

    schemes = spec["components"]["securitySchemes"]
    assert schemes == {"adminToken": {**schemes["adminToken"], "type": "http", "scheme": "bearer"}}
    assert spec["security"] == [{"adminToken": []}]

    for ref in set(references(spec)):
        resolve(spec, {"$ref": ref})  # every reference resolves

    ids = [operation["operationId"] for _, _, operation in operations(spec)]
    assert len(ids) == len(set(ids)), "operationIds must be unique"
    for method, path, operation in operations(spec):
        name = f"{method} {path}"
        assert operation["summary"], name
        responses = operation["responses"]
        assert responses and all(re.fullmatch(r"[1-5]\d\d", s) for s in responses), name
        assert [s for s in responses if s.startswith("2")], f"{name} documents no success"
        for status, given in responses.items():
            response = resolve(spec, given)
            assert response["description"], f"{name} {status}"
            assert "schema" in response["content"]["application/json"], f"{name} {status}"
            if int(status) >= 400:  # every failure is the error object
                schema = resolve(spec, response["content"]["application/json"]["schema"])
                assert {"$ref": "#/components/schemas/Error"} in schema.get("allOf", [schema]), name
        for status in ("401", "403"):
            assert status in responses, f"{name} does not document {status}"
        parameters = [resolve(spec, p) for p in operation.get("parameters", ())]
        for p in parameters:
            assert p["in"] in ("path", "query", "header") and p["name"] and "schema" in p, name
        in_path = {p["name"] for p in parameters if p["in"] == "path"}
        assert in_path == set(PARAM.findall(path)), f"{name}: path parameters {in_path}"
        assert all(p["required"] for p in parameters if p["in"] == "path"), name
        if "requestBody" in operation:
            body = resolve(spec, operation["requestBody"]["content"]["application/json"]["schema"])
            assert body["type"] == "object" and body["properties"], name
            assert set(body.get("required", ())) <= body["properties"].keys(), name
            assert "400" in responses, f"{name} takes a body but documents no 400"


def test_the_document_describes_exactly_the_routes_the_app_registers(
    agw: Gateway, spec: dict[str, Any], tmp_path: Path
) -> None:
    app = create_app(dataclasses.replace(agw.settings, store_path=tmp_path / "routes.db"))

    def walk(routes: list[BaseRoute], prefix: str = "") -> Iterator[tuple[str, str]]:
        for route in routes:
            if isinstance(route, Route):
                for method in route.methods or ():
                    if method != "HEAD":
                        yield method, prefix + route.path
            elif isinstance(route, Mount):
                yield from walk(route.routes, prefix + route.path)

    registered = {(m, p) for m, p in walk(app.routes) if p == PREFIX or p.startswith(PREFIX + "/")}
    documented = {(method, path) for method, path, _ in operations(spec)}
    assert registered, "no routes under /admin/v1?"
    assert registered - documented == set(), "routes missing from the OpenAPI document"
    assert documented - registered == set(), "operations in the OpenAPI document that no route serves"


# ---------------------------------------------------------------- real answers fit the document


class Api:
    """Calls by operationId, each answer checked against what the document says of its status."""

    def __init__(self, agw: Gateway, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.url = agw.url
        self.by_id = {op["operationId"]: (method, path, op) for method, path, op in operations(spec)}
        self.called: set[str] = set()

    def __call__(
        self,
        operation_id: str,
        status: int,
        path: dict[str, str] | None = None,
        token: str | None = TOKEN,
        **kwargs: Any,
    ) -> Any:
        method, template, operation = self.by_id[operation_id]
        url = self.url + template.format(**(path or {}))
        headers = {"authorization": f"Bearer {token}"} if token else {}
        r = httpx.request(method, url, headers={**headers, **kwargs.pop("headers", {})}, timeout=30, **kwargs)
        assert r.status_code == status, f"{operation_id}: {r.status_code} {r.text}"
        body = r.json()
        check(self.spec, body, answer_schema(self.spec, operation, status), operation_id)
        self.called.add(operation_id)
        return body


def test_every_operation_answers_as_documented(agw: Gateway, spec: dict[str, Any]) -> None:
    api = Api(agw, spec)
    assert api("getOpenApiDocument", 200) == spec

    account = api("createAccount", 201, json={"name": f"oa-{time.monotonic_ns()}", "balance": "20.00"})
    assert account["balance"] == "20.00"
    acct = {"account_id": account["id"]}
    api("getAccount", 200, acct)
    listed = api("listAccounts", 200, params={"limit": 1000})
    assert account in listed["data"]
    api("updateAccount", 200, acct, json={"allowed_models": [MODEL], "rpm_limit": 600})

    top_up = api(
        "createTopUp", 201, acct, json={"amount": "5", "note": "oa"}, headers={"idempotency-key": "oa-1"}
    )
    assert top_up["balance_after"] == "25.00"
    api("createTopUp", 201, acct, json={"amount": "5", "note": "oa"}, headers={"idempotency-key": "oa-1"})
    api("createTopUp", 409, acct, json={"amount": "6"}, headers={"idempotency-key": "oa-1"})
    api("listTopUps", 200, acct)

    key = api("createKey", 201, acct, json={"name": "ci", "credit_limit": "10", "limit_reset": "monthly"})
    assert key["key"].startswith("sk-")
    kid = {"key_id": key["id"]}
    api("getKey", 200, kid)
    api("listKeys", 200, acct)
    api("updateKey", 200, kid, json={"expires_at": "2099-01-01T00:00:00Z"})

    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    r = httpx.post(
        agw.url + "/v1/chat/completions", json=chat, headers={"authorization": f"Bearer {key['key']}"}
    )
    assert r.status_code == 200, r.text
    with agw.admin(TOKEN) as admin:
        assert request_logs(admin, key["id"], 1)
    logs = api("listRequestLogs", 200, params={"key_id": key["id"]})
    assert logs["data"] and logs["data"][0]["attempts"]
    entry = api("getRequestLog", 200, {"log_id": logs["data"][0]["id"]})
    assert entry["request_body"] is not None
    channels = api("listChannels", 200)
    assert channels["data"][0]["channels"]

    rotated = api("rotateKey", 200, kid)
    assert rotated["key"] != key["key"]
    assert api("deleteKey", 200, kid)["deleted_at"] is not None

    user = api("createConsoleUser", 201, json={"email": f"oa{time.monotonic_ns()}@example.com", **acct})
    uid = {"user_id": user["id"]}
    api("getConsoleUser", 200, uid)
    api("listConsoleUsers", 200, params=acct)
    api("inviteConsoleUser", 200, uid)
    api("deleteConsoleUser", 200, uid)

    # Every id the path names, unknown: the documented 404.
    for operation_id in ("getAccount", "updateAccount", "listTopUps", "listKeys", "createKey"):
        api(operation_id, 404, {"account_id": "acct_none"})
    api("createTopUp", 404, {"account_id": "acct_none"}, json={"amount": "1"})
    for operation_id in ("getKey", "updateKey", "rotateKey", "deleteKey"):
        api(operation_id, 404, {"key_id": "key_none"})
    api("getRequestLog", 404, {"log_id": "req_none"})
    for operation_id in ("getConsoleUser", "inviteConsoleUser", "deleteConsoleUser"):
        api(operation_id, 404, {"user_id": "cu_none"})
    api("createConsoleUser", 404, json={"email": "nobody@example.com", "account_id": "acct_none"})
    for operation_id in ("listAccounts", "listRequestLogs"):
        api(operation_id, 400, params={"limit": 0})

    # A reload checks the file first: a broken one is the documented 400 and nothing reloads (a good
    # one replaces the workers, which test_drain_reload follows).
    config = agw.config_path.read_text()
    try:
        agw.config_path.write_text(config + "\n[[models]]\nname = 1\n")
        assert "not valid" in api("reloadConfig", 400)["error"]["message"]
    finally:
        agw.config_path.write_text(config)

    assert api.called == set(api.by_id), f"not exercised: {sorted(set(api.by_id) - api.called)}"


def test_bodies_are_refused_as_documented(agw: Gateway, spec: dict[str, Any]) -> None:
    """Every operation that takes a body: a required field left out, and a field the document does
    not list, are each the documented 400 naming that field."""
    api = Api(agw, spec)
    account = api("createAccount", 201, json={"name": f"oa-{time.monotonic_ns()}"})
    key = api("createKey", 201, {"account_id": account["id"]})
    ids = {"account_id": account["id"], "key_id": key["id"]}
    bodies = 0
    for _, path, operation in operations(spec):
        if "requestBody" not in operation:
            continue
        bodies += 1
        schema = resolve(spec, operation["requestBody"]["content"]["application/json"]["schema"])
        assert schema["additionalProperties"] is False
        names = PARAM.findall(path)
        where = {n: ids[n] for n in names}
        err = api(operation["operationId"], 400, where, json={"not_a_field": 1})["error"]
        assert (err["code"], err["param"]) == ("invalid_request", "not_a_field")
        required = schema.get("required", [])
        assert operation["requestBody"]["required"] == bool(required), operation["operationId"]
        if required:
            err = api(operation["operationId"], 400, where, json={})["error"]
            assert (err["code"], err["param"]) == ("invalid_request", required[0])
    assert bodies >= 5


def test_the_document_and_every_operation_take_the_admin_token(agw: Gateway, spec: dict[str, Any]) -> None:
    api = Api(agw, spec)
    for method, path, operation in operations(spec):
        where = {n: "x_1" for n in PARAM.findall(path)}
        err = api(operation["operationId"], 401, where, token=None)["error"]
        assert err["code"] == "invalid_admin_token", (method, path)
        err = api(operation["operationId"], 401, where, token="wrong-" + TOKEN)["error"]
        assert err["code"] == "invalid_admin_token", (method, path)
        err = api(operation["operationId"], 403, where, token="sk-" + "0" * 40)["error"]
        assert err["code"] == "forbidden", (method, path)


def test_without_an_admin_token_the_document_is_disabled_like_the_api(gw: Gateway) -> None:
    """The session gateway configures no admin token: the management API, its document included,
    is 403 forbidden for everyone."""
    for path in (DOCUMENT, PREFIX + "/accounts"):
        r = httpx.get(gw.url + path, headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "forbidden"
