"""The hardening of issue 9 against a live server, as an attacker on 127.0.0.1 would try it.

Every module-scoped server runs on SQLite and on PostgreSQL (the `backend` parameter). Clients
that must look like different machines connect from different loopback addresses (127.0.x.y: all
of 127/8 reaches the server bound to 127.0.0.1), so the server sees a different peer address for
each, exactly as it would for different hosts; none of them is a trusted proxy (uvicorn trusts
FORWARDED_ALLOW_IPS, 127.0.0.1 by default), so they cannot claim another address.

The synthetic engine serves these servers: nothing here depends on the model.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.live_databases import migrated_database
from tests.live_server import (
    CLIENT_LIMITS,
    TEST_PASSWORD,
    LiveServer,
    PageClient,
    running_server,
    server_env,
)
from tests.serving.conftest import PooledServer, unique_email

METRICS_TOKEN = "metrics-token-for-tests"
LIMITS = {
    "LOGIN_MAX_PER_ADDRESS": 8,
    "LOGIN_MAX_PER_ACCOUNT": 3,
    "LOGIN_MAX_PER_ACCOUNT_TOTAL": 5,
    "SIGNUP_MAX_PER_ADDRESS": 5,
}
CONCURRENT_GUESSES = 40
CONCURRENT_SIGN_UPS = 30
REDIS_URL = "redis://127.0.0.1:6379/0"

_addresses = (f"127.0.{a}.{b}" for a, b in itertools.product(range(1, 250), range(2, 250)))


def new_address() -> str:
    """A loopback address no other test in this session has used: a machine of its own."""
    return next(_addresses)


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {**LIMITS, "METRICS_TOKEN": METRICS_TOKEN}


class Browser(PageClient):
    """A page client connecting from `address` (None: 127.0.0.1)."""

    def __init__(self, base_url: str, address: str | None = None) -> None:
        super().__init__(base_url)
        if address is not None:
            self.http.close()
            self.http = httpx.Client(
                base_url=base_url,
                timeout=httpx.Timeout(60.0),
                transport=httpx.HTTPTransport(local_address=address, limits=CLIENT_LIMITS),
            )

    def me(self) -> httpx.Response:
        return self.http.get("/api/me")

    def try_login(self, email: str, password: str = TEST_PASSWORD) -> httpx.Response:
        return self.post("/api/auth/login", {"email": email, "password": password})


@pytest.fixture(scope="module")
def admin(pooled: PooledServer) -> Iterator[Browser]:
    """The first sign-up of the module's server, hence its admin."""
    browser = Browser(pooled.server.url, new_address())
    assert browser.signup(unique_email("admin"))["is_admin"] is True
    yield browser
    browser.close()


@pytest.fixture
def browsers(server: LiveServer, admin: Browser) -> Iterator[list[Browser]]:
    """Make clients with `Browser(server.url, ...)` and append them here: closed afterwards."""
    made: list[Browser] = []
    yield made
    for browser in made:
        browser.close()


def session_cookies(response: httpx.Response) -> list[str]:
    return [c for c in response.headers.get_list("set-cookie") if c.startswith("session=")]


def session_id_set_by(response: httpx.Response) -> str:
    (cookie,) = session_cookies(response)
    return cookie.split(";")[0].removeprefix("session=")


# -- 1. session fixation ------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["login", "signup"])
def test_a_session_id_planted_before_log_in_names_nothing_after_it(
    server: LiveServer, browsers: list[Browser], how: str
) -> None:
    """The attacker plants `session=<their choice>` in the victim's browser; the victim logs in
    (or signs up). The server issues its own new id, and the planted one is logged in as nobody.
    (Before the fix, Litestar's server-side sessions stored the victim's log-in under the planted
    id, and the attacker's client was logged in as the victim.)"""
    victim_email = unique_email("victim")
    if how == "login":
        setup = Browser(server.url, new_address())
        browsers.append(setup)
        setup.signup(victim_email)
    planted = f"attacker-picked-{secrets.token_hex(8)}"
    victim = Browser(server.url, new_address())
    attacker = Browser(server.url, new_address())
    browsers += [victim, attacker]

    victim.http.cookies.set("session", planted, domain="127.0.0.1")
    if how == "login":
        response = victim.try_login(victim_email)
        assert response.status_code == 200, response.text
    else:
        response = victim.post(
            "/api/auth/signup", {"email": victim_email, "password": TEST_PASSWORD}
        )
        assert response.status_code == 201, response.text
    issued = session_id_set_by(response)
    assert issued != planted
    assert len(issued) >= 64  # 32 random bytes, hex
    assert victim.me().json()["email"] == victim_email

    attacker.http.cookies.set("session", planted, domain="127.0.0.1")
    assert attacker.me().status_code == 401
    # Nor is an unknown id taken up by an anonymous request: no session, no cookie.
    anonymous = attacker.http.get("/login")
    assert anonymous.status_code == 200 and session_cookies(anonymous) == []


def test_a_real_session_id_planted_before_log_in_is_dropped_at_log_in(
    server: LiveServer, browsers: list[Browser]
) -> None:
    """The same with an id the server did make: the attacker's own logged-in session."""
    attacker, victim = Browser(server.url, new_address()), Browser(server.url, new_address())
    browsers += [attacker, victim]
    attacker_email, victim_email = unique_email("attacker"), unique_email("victim")
    setup = Browser(server.url, new_address())
    browsers.append(setup)
    setup.signup(victim_email)
    attacker.signup(attacker_email)
    planted = attacker.http.cookies["session"]

    victim.http.cookies.set("session", planted, domain="127.0.0.1")
    assert victim.me().json()["email"] == attacker_email  # the planted session, as planted
    response = victim.try_login(victim_email)
    assert response.status_code == 200, response.text
    assert session_id_set_by(response) != planted
    assert victim.me().json()["email"] == victim_email
    assert attacker.me().status_code == 401  # the old session is gone, not turned into the victim


# -- 2. one first admin, through the real server ------------------------------------------------


async def _sign_up_at_once(url: str, emails: list[str]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        csrf = (await client.get("/healthz")).cookies["csrftoken"]

        async def one(email: str) -> httpx.Response:
            return await client.post(
                "/api/auth/signup",
                json={"email": email, "password": TEST_PASSWORD},
                headers={"x-csrftoken": csrf},
            )

        return await asyncio.gather(*(one(email) for email in emails))


def test_concurrent_first_sign_ups_on_an_empty_database_make_one_admin(
    backend: str, module_dir: Path
) -> None:
    """Four sign-ups at once on a fresh database, three fresh databases: one admin each time."""
    for round_ in range(3):
        directory = module_dir / f"first-admin-{round_}"
        directory.mkdir()
        with migrated_database(backend, directory) as url:
            env = server_env("synthetic", url, directory)
            with running_server(env, directory / "server.log") as fresh:
                emails = [unique_email(f"first{i}") for i in range(4)]
                responses = asyncio.run(_sign_up_at_once(fresh.url, emails))
        assert [r.status_code for r in responses] == [201] * 4, [r.text for r in responses]
        admins = [r.json()["email"] for r in responses if r.json()["is_admin"]]
        assert len(admins) == 1, f"database {round_}: admins {admins}"


# -- 3. log-in and sign-up limits ---------------------------------------------------------------


async def _at_once(
    url: str, address: str, path: str, bodies: list[dict[str, str]], cookies: httpx.Cookies
) -> list[httpx.Response]:
    transport = httpx.AsyncHTTPTransport(local_address=address)
    async with httpx.AsyncClient(
        base_url=url, timeout=120.0, transport=transport, cookies=cookies
    ) as client:
        csrf = (
            client.cookies.get("csrftoken") or (await client.get("/healthz")).cookies["csrftoken"]
        )
        return await asyncio.gather(
            *(client.post(path, json=body, headers={"x-csrftoken": csrf}) for body in bodies)
        )


def guesses_at_once(
    url: str, address: str, email: str, count: int, cookies: httpx.Cookies | None = None
) -> Counter[int]:
    bodies = [{"email": email, "password": f"guess {i}"} for i in range(count)]
    responses = asyncio.run(_at_once(url, address, "/api/auth/login", bodies, cookies or {}))
    for response in responses:
        if response.status_code == 429:
            assert int(response.headers["retry-after"]) > 0
    return Counter(r.status_code for r in responses)


def test_concurrent_wrong_passwords_are_counted_when_they_start(
    server: LiveServer, browsers: list[Browser]
) -> None:
    """40 wrong passwords at once for one account from one address: only as many as the limit
    reach the password check (401), the rest are refused at once (429). (Before the fix all 40
    were checked and got 401: failures were counted only after argon2 had answered.)"""
    owner = Browser(server.url, new_address())
    browsers.append(owner)
    email = unique_email("target")
    owner.signup(email)

    address = new_address()
    seen = guesses_at_once(server.url, address, email, CONCURRENT_GUESSES)
    assert seen == {401: LIMITS["LOGIN_MAX_PER_ACCOUNT"], 429: CONCURRENT_GUESSES - 3}, seen
    # The right password from that address now waits too: it is not told it was right.
    again = Browser(server.url, address)
    browsers.append(again)
    assert again.try_login(email).status_code == 429


def test_one_address_spraying_many_accounts_is_limited(
    server: LiveServer, browsers: list[Browser]
) -> None:
    owners = [Browser(server.url, new_address()) for _ in range(4)]
    browsers.extend(owners)
    emails = [unique_email("sprayed") for _ in owners]
    for owner, email in zip(owners, emails, strict=True):
        owner.signup(email)
    address = new_address()
    bodies = [{"email": e, "password": f"guess {i}"} for i in range(5) for e in emails]
    responses = asyncio.run(_at_once(server.url, address, "/api/auth/login", bodies, {}))
    seen = Counter(r.status_code for r in responses)
    assert seen == {401: LIMITS["LOGIN_MAX_PER_ADDRESS"], 429: 20 - 8}, seen


def test_a_stranger_cannot_lock_the_owner_out(server: LiveServer, browsers: list[Browser]) -> None:
    """Strangers on other machines fail on the owner's account until every limit they can reach
    is full; the owner still logs in from their own machine, and from the browser they used
    before even when every unknown device is held back. (Before the fix, five failures from
    anywhere locked the account for everyone.)"""
    home = new_address()
    owner = Browser(server.url, home)  # the owner's browser: signs up, gets a device cookie
    browsers.append(owner)
    email = unique_email("owner")
    owner.signup(email)

    # One stranger: refused after LOGIN_MAX_PER_ACCOUNT, for their address only.
    stranger = new_address()
    seen = guesses_at_once(server.url, stranger, email, 12)
    new_browser_at_home = Browser(server.url, home)
    browsers.append(new_browser_at_home)
    assert new_browser_at_home.try_login(email).status_code == 200
    assert seen == {401: 3, 429: 9}, seen

    # More strangers fill the account's limit for unknown devices (5 in all, 3 already used
    # by the first stranger): a browser the account has never seen now waits, anywhere...
    seen = guesses_at_once(server.url, new_address(), email, 12)
    assert seen == {401: 2, 429: 10}, seen
    unknown = Browser(server.url, home)
    browsers.append(unknown)
    assert unknown.try_login(email).status_code == 429
    # ... but the owner's own browser, known by its device cookie, logs in.
    owner.http.cookies.delete("session")
    response = owner.try_login(email)
    assert response.status_code == 200, response.text
    assert owner.me().json()["email"] == email
    # A device cookie is good for its own account only, and a tampered one for none.
    other = Browser(server.url, new_address())
    browsers.append(other)
    other.signup(unique_email("other"))  # a valid device cookie, for another account
    assert other.try_login(email).status_code == 429
    device_id, _, signature = owner.http.cookies.get("device", path="/api/auth").partition(".")
    tampered = Browser(server.url, new_address())
    browsers.append(tampered)
    tampered.http.cookies.set(
        "device", f"{device_id}.{'0' * len(signature)}", domain="127.0.0.1", path="/api/auth"
    )
    assert tampered.try_login(email).status_code == 429


def test_sign_ups_are_limited_per_address(server: LiveServer, browsers: list[Browser]) -> None:
    """30 sign-ups at once from one address: SIGNUP_MAX_PER_ADDRESS are made, the rest refused.
    This also bounds how fast sign-up's "already exists" can be used to find accounts (item 8).
    (Before the fix all 30 were made.)"""
    address = new_address()
    bodies = [
        {"email": unique_email("bulk"), "password": TEST_PASSWORD}
        for _ in range(CONCURRENT_SIGN_UPS)
    ]
    responses = asyncio.run(_at_once(server.url, address, "/api/auth/signup", bodies, {}))
    seen = Counter(r.status_code for r in responses)
    limit = LIMITS["SIGNUP_MAX_PER_ADDRESS"]
    assert seen == {201: limit, 429: CONCURRENT_SIGN_UPS - limit}, seen
    elsewhere = Browser(server.url, new_address())
    browsers.append(elsewhere)
    elsewhere.signup(unique_email("elsewhere"))


def test_replicas_count_attempts_together_in_redis(
    backend: str, module_dir: Path, pooled: PooledServer
) -> None:
    """Two replicas with SESSION_STORE_URL: guesses spread over both count against one limit
    (before the fix each process kept its own count)."""
    namespace = f"streamchat-test-ratelimit-{secrets.token_hex(4)}"
    env = {
        **server_env("synthetic", pooled.database_url, module_dir),
        **{name: str(value) for name, value in LIMITS.items()},
        "SESSION_STORE_URL": REDIS_URL,
        "RATE_LIMIT_NAMESPACE": namespace,
    }
    first = LiveServer({**env, "REPLICA_ID": "a"}, module_dir / "replica-a.log", migrate=False)
    second = LiveServer({**env, "REPLICA_ID": "b"}, module_dir / "replica-b.log", migrate=False)
    try:
        first.start()
        second.start()
        owner = Browser(first.url, new_address())
        email = unique_email("replicated")
        owner.signup(email)
        owner.close()
        address = new_address()
        on_first = guesses_at_once(first.url, address, email, 2)
        on_second = guesses_at_once(second.url, address, email, 10)
        assert on_first == {401: 2}, on_first
        assert on_second == {401: 1, 429: 9}, on_second
    finally:
        first.stop()
        second.stop()
        keys = redis.Redis.from_url(REDIS_URL)
        try:
            stale = list(keys.scan_iter(f"{namespace}:*"))
            if stale:
                keys.delete(*stale)
        finally:
            keys.close()


# -- 6. headers and cookies ---------------------------------------------------------------------

SECURITY_HEADERS = (
    "content-security-policy",
    "x-frame-options",
    "x-content-type-options",
    "referrer-policy",
)


def test_every_response_carries_the_security_headers(server: LiveServer, admin: Browser) -> None:
    anonymous = httpx.Client(base_url=server.url)
    try:
        responses = {
            "/login": anonymous.get("/login"),
            "/ (redirect)": anonymous.get("/"),
            "/api/me (401)": anonymous.get("/api/me"),
            "/static/js/auth.js": anonymous.get("/static/js/auth.js"),
            "/no-such-page (404)": anonymous.get("/no-such-page"),
            "/healthz": anonymous.get("/healthz"),
            "/ (chat)": admin.http.get("/"),
            "/admin": admin.http.get("/admin"),
        }
    finally:
        anonymous.close()
    for name, response in responses.items():
        missing = [h for h in SECURITY_HEADERS if h not in response.headers]
        assert missing == [], (name, response.status_code, missing)
    csp = responses["/login"].headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'" and "unsafe" not in csp
    assert directives["frame-ancestors"] == "'none'"
    assert responses["/login"].headers["x-frame-options"] == "DENY"
    assert responses["/login"].headers["x-content-type-options"] == "nosniff"


def cookies_of(response: httpx.Response) -> dict[str, str]:
    return {c.split("=", 1)[0]: c for c in response.headers.get_list("set-cookie")}


def test_cookies_are_secure_when_the_proxy_says_https(server: LiveServer) -> None:
    """COOKIE_SECURE=auto (the default): `Secure` when the request came over https, as a trusted
    proxy on 127.0.0.1 tells uvicorn with X-Forwarded-Proto; not over plain http. (Before the
    fix no cookie was ever Secure.)"""
    email = unique_email("cookies")
    for scheme, path in (("https", "/api/auth/signup"), ("http", "/api/auth/login")):
        secure = scheme == "https"
        # Cookies by hand: a client's jar would not send Secure cookies back over plain http.
        with httpx.Client(base_url=server.url, headers={"X-Forwarded-Proto": scheme}) as client:
            first = client.get("/healthz")
            csrf = first.cookies["csrftoken"]
            response = client.post(
                path,
                json={"email": email, "password": TEST_PASSWORD},
                headers={"x-csrftoken": csrf, "cookie": f"csrftoken={csrf}"},
            )
        assert response.status_code in (200, 201), response.text
        cookies = {**cookies_of(first), **cookies_of(response)}
        flags = {name: "; secure" in cookie.lower() for name, cookie in cookies.items()}
        assert flags == dict.fromkeys(cookies, secure), (scheme, cookies)
        assert {"csrftoken", "session", "device"} <= set(cookies), cookies


def test_cookie_secure_true_marks_cookies_secure_over_plain_http(
    backend: str, module_dir: Path, pooled: PooledServer
) -> None:
    directory = module_dir / "cookie-secure"
    directory.mkdir(exist_ok=True)
    env = {**server_env("synthetic", pooled.database_url, directory), "COOKIE_SECURE": "true"}
    live = LiveServer(env, directory / "server.log", migrate=False)
    try:
        live.start()
        with httpx.Client(base_url=live.url) as client:
            response = client.get("/healthz")
            assert "secure" in response.headers["set-cookie"].lower(), response.headers
    finally:
        live.stop()


# -- 7. API docs and metrics --------------------------------------------------------------------


def test_the_api_schema_is_for_admins_only(
    server: LiveServer, admin: Browser, browsers: list[Browser]
) -> None:
    user = Browser(server.url, new_address())
    browsers.append(user)
    user.signup(unique_email("user"))
    for path in ("/schema", "/schema/openapi.json", "/schema/swagger", "/schema/redoc"):
        assert httpx.get(f"{server.url}{path}").status_code == 401, path
        assert user.http.get(path).status_code == 403, path
    document = admin.http.get("/schema/openapi.json")
    assert document.status_code == 200
    assert "/api/auth/login" in document.json()["paths"]
    # No documentation site that loads a CDN's JavaScript, even for the admin.
    for path in ("/schema/swagger", "/schema/redoc", "/schema/elements"):
        assert admin.http.get(path).status_code == 404, path
    assert "<script" not in admin.http.get("/schema").text


def test_metrics_need_the_token_when_one_is_set(server: LiveServer) -> None:
    url = f"{server.url}/metrics"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    scraped = httpx.get(url, headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert scraped.status_code == 200
    assert "streamchat_" in scraped.text
