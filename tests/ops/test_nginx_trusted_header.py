"""Sign-in by a trusted proxy's header (AUTH_TRUSTED_EMAIL_HEADER, issue 24 item 7), with the
project's nginx in front playing the company's single sign-on.

nginx (deploy/nginx.conf, plus the two lines a deployment behind oauth2-proxy adds) connects to
the replica from 127.0.0.2, the only address in the replica's FORWARDED_ALLOW_IPS, and sets the
header to the user its log-in vouched for (a fixed one here: the SSO is not the point). The test's
own connections come from 127.0.0.1: a client reaching the replica directly, whose header must be
refused however it dresses up (an X-Forwarded-For naming the proxy included).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.live_server import PageClient
from tests.ops.harness import AppProcess, Nginx, proxy_for, release, start_nginx, throwaway_database

HEADER = "X-Auth-Request-Email"
SSO_USER = "sso-user@example.com"
PROXY_ADDRESS = "127.0.0.2"  # nginx's side of its connections to the replica


@pytest.fixture(scope="module")
def sso_app(ops_logs: Path) -> Iterator[AppProcess]:
    with throwaway_database() as database:
        env = {
            "ENGINE": "synthetic",
            "DATABASE_URL": database.url,
            "REPLICA_ID": "sso",
            "AUTH_TRUSTED_EMAIL_HEADER": HEADER,
            "FORWARDED_ALLOW_IPS": PROXY_ADDRESS,
        }
        log = ops_logs / "sso_app.log"
        assert release(env, log).returncode == 0, log.read_text()
        app = AppProcess("sso_app", env, log)
        try:
            yield app.start().wait_ready()
        finally:
            app.stop()


@pytest.fixture(scope="module")
def sso_proxy(sso_app: AppProcess) -> Iterator[Nginx]:
    conf = proxy_for("sso", (sso_app, sso_app), "60s")
    anchor = "        proxy_set_header Connection $connection_upgrade;\n"
    assert anchor in conf
    sso = (
        f"        proxy_bind {PROXY_ADDRESS};\n"
        # behind oauth2-proxy: `auth_request /oauth2/auth;` and
        # `auth_request_set $email $upstream_http_x_auth_request_email;`, then this with $email
        f'        proxy_set_header {HEADER} "{SSO_USER}";\n'
    )
    nginx = start_nginx("sso", conf.replace(anchor, anchor + sso))
    try:
        yield nginx
    finally:
        nginx.stop()


def me(client: httpx.Client, **headers: str) -> httpx.Response:
    return client.get("/api/me", headers=headers)


def test_the_proxys_header_signs_the_user_in_and_a_clients_own_is_replaced(
    sso_proxy: Nginx, sso_app: AppProcess
) -> None:
    browser = PageClient(sso_proxy.url)
    try:
        first = me(browser.http, **{HEADER: "mallory@example.com"})  # nginx replaces it
        assert first.status_code == 200, first.text
        assert first.json()["email"] == SSO_USER
        assert "session" in browser.http.cookies  # a session, as after a password log-in
        made = browser.post("/api/conversations", {})
        assert made.status_code == 201, made.text
        listed = browser.http.get("/api/conversations").json()
        assert made.json()["id"] in [c["id"] for c in listed]
    finally:
        browser.close()

    # The client's address still comes through X-Forwarded-For (applied by the app itself): the
    # replica logs the test's 127.0.0.1, not nginx's 127.0.0.2, nor what the client itself put in
    # the header (only FORWARDED_ALLOW_IPS' entries in it are believed, and 127.0.0.1 is not one).
    marker = f"sso-probe-{time.monotonic_ns()}"
    httpx.get(f"{sso_proxy.url}/healthz?{marker}", headers={"X-Forwarded-For": "203.0.113.9"})
    deadline = time.monotonic() + 5
    while marker not in sso_app.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [line for line in sso_app.log_text().splitlines() if marker in line]
    assert lines and " 127.0.0.1:" in lines[0], lines
    assert PROXY_ADDRESS not in lines[0] and "203.0.113.9" not in lines[0]


def test_the_header_from_anywhere_but_the_proxy_is_refused(sso_app: AppProcess) -> None:
    sso_app.mark_log()
    with httpx.Client(base_url=sso_app.url) as direct:
        for headers in (
            {HEADER: SSO_USER},
            {HEADER: SSO_USER, "X-Forwarded-For": PROXY_ADDRESS},
            {HEADER: "someone-new@example.com", "X-Forwarded-For": f"1.2.3.4, {PROXY_ADDRESS}"},
        ):
            answer = me(direct, **headers)
            assert answer.status_code == 401, (headers, answer.text)
            assert "session" not in direct.cookies
            direct.cookies.clear()
    log = sso_app.log_since_mark()
    assert f"ignored {HEADER.lower()} from 127.0.0.1" in log, log[-2000:]
    assert "someone-new" not in log  # no account was made for it
