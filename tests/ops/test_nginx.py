"""deploy/nginx.conf in front of a live app: tokens pass through one by one, on both transports.

Each property has a control that shows the check can fail: the same config with buffering switched
on delivers the reply in one lump at the end, and a stream without heartbeats is cut by a proxy
whose idle timeout is shorter than the model's silence.
"""

from __future__ import annotations

import functools
import itertools
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.live_server import PageClient, PageStream, SseReader
from tests.ops.harness import (
    AppProcess,
    Arrivals,
    Nginx,
    buffering_variant,
    client_like,
    delivery_problems,
    nginx_binary,
    proxy_for,
    release,
    render_nginx,
    sse_reply,
    start_nginx,
    throwaway_database,
    ws_reply,
)

REPLY_TOKENS = 80  # 80 x 30 ms: a 2.4 s reply
REPLY = f"Tell me about streams [[synthetic:tokens={REPLY_TOKENS}]]"
NGINX_TTFT_BUDGET_MS = 200.0  # what nginx may add to the time to first token


SHORT = "Quick [[synthetic:tokens=4]]"
TTFT_SAMPLES = 4  # short replies per path, on top of the long one: a median, not one noisy draw


def report(label: str, arrivals: Arrivals) -> None:
    print(f"\n{label:>24}: {arrivals.summary()}")


def median_ttft_ms(long: Arrivals, reply: Callable[[], Arrivals], label: str) -> float:
    samples = [long.ttft_ms] + [reply().ttft_ms for _ in range(TTFT_SAMPLES)]
    median = statistics.median(samples)
    print(f"{label:>24}: TTFT median {median:.0f} ms of {[round(x) for x in samples]}")
    return median


def test_the_template_renders_to_a_valid_config_and_so_does_the_control(tmp_path: Path) -> None:
    for name, conf in {
        "good": render_nginx(
            LISTEN="127.0.0.1:8080",
            REPLICA_A="10.0.0.11:8000",
            REPLICA_B="10.0.0.12:8000",
            PROXY_READ_TIMEOUT="1h",
        ),
        "buffering": buffering_variant(
            render_nginx(
                LISTEN="8080",
                REPLICA_A="127.0.0.1:8001",
                REPLICA_B="127.0.0.1:8002",
                PROXY_READ_TIMEOUT="2s",
            )
        ),
    }.items():
        prefix = tmp_path / name
        (prefix / "logs").mkdir(parents=True)
        (prefix / "nginx.conf").write_text(conf)
        done = subprocess.run(
            [nginx_binary(), "-t", "-p", f"{prefix}/", "-c", "nginx.conf", "-g", "pid x.pid;"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "test is successful" in done.stderr


def test_sse_tokens_arrive_one_by_one_through_nginx(
    admin: PageClient, streaming_app: AppProcess, good_proxy: Nginx
) -> None:
    direct = client_like(admin, streaming_app.url)
    proxied = client_like(admin, good_proxy.url)
    try:
        seen, ttft = {}, {}
        for label, client in (("direct", direct), ("through nginx", proxied)):
            conversation = client.new_conversation()
            seen[label] = sse_reply(client, conversation, REPLY)
            report(f"SSE {label}", seen[label])
            assert seen[label].final is not None
            assert seen[label].final["status"] == "completed", seen[label].final
            assert delivery_problems(seen[label]) == [], seen[label].summary()
            ttft[label] = median_ttft_ms(
                seen[label],
                functools.partial(sse_reply, client, conversation, SHORT),
                f"SSE {label}",
            )
        assert ttft["through nginx"] < ttft["direct"] + NGINX_TTFT_BUDGET_MS
        assert len(seen["through nginx"].deltas) >= REPLY_TOKENS // 2
    finally:
        direct.close()
        proxied.close()


def test_control_a_buffering_nginx_fails_the_same_check(
    admin: PageClient, good_proxy: Nginx, buffering_proxy: Nginx
) -> None:
    proxied = client_like(admin, good_proxy.url)
    buffered = client_like(admin, buffering_proxy.url)
    try:
        good = sse_reply(proxied, proxied.new_conversation(), REPLY)
        bad = sse_reply(buffered, buffered.new_conversation(), REPLY)
        report("SSE through nginx", good)
        report("SSE buffering nginx", bad)
        assert bad.final is not None and bad.final["status"] == "completed"  # all of it, late
        problems = delivery_problems(bad)
        print("   the check reports:", "; ".join(problems))
        assert problems, f"the buffering proxy passed the check: {bad.summary()}"
        # its first token came after the good proxy's whole reply was half done
        assert bad.ttft_ms / 1000.0 > (good.final_at - good.sent_at) / 2  # type: ignore[operator]
        assert good.bursts >= 5 * bad.bursts
    finally:
        proxied.close()
        buffered.close()


def test_the_apps_x_accel_buffering_header_alone_unbuffers_a_buffering_nginx(
    admin: PageClient, streaming_app: AppProcess
) -> None:
    """Buffering on, but the app's `X-Accel-Buffering: no` honoured: streams still flow (the
    control above differs only by ignoring that header and gzipping the stream)."""
    conf = proxy_for("header-only", (streaming_app, streaming_app), "60s")
    nginx = start_nginx("header_only", buffering_variant(conf, honour_app_header=True))
    client = client_like(admin, nginx.url)
    try:
        arrivals = sse_reply(client, client.new_conversation(), REPLY)
    finally:
        client.close()
        nginx.stop()
    report("SSE buffering on, header", arrivals)
    assert delivery_problems(arrivals) == [], arrivals.summary()


def test_websocket_tokens_arrive_one_by_one_through_nginx(
    admin: PageClient, streaming_app: AppProcess, good_proxy: Nginx
) -> None:
    conversation = admin.new_conversation()
    direct_url = f"ws://127.0.0.1:{streaming_app.port}/ws"
    direct = ws_reply(admin, direct_url, streaming_app.url, conversation, REPLY)
    # The page's Origin is nginx's address: the app must see nginx's Host, port included.
    proxied = ws_reply(admin, good_proxy.ws_url, good_proxy.url, conversation, REPLY)
    report("WS direct", direct)
    report("WS through nginx", proxied)
    for arrivals in (direct, proxied):
        assert arrivals.final is not None and arrivals.final["type"] == "final", arrivals.final
        assert arrivals.final["status"] == "completed"
        assert delivery_problems(arrivals) == [], arrivals.summary()
    direct_ms = median_ttft_ms(
        direct,
        functools.partial(ws_reply, admin, direct_url, streaming_app.url, conversation, SHORT),
        "WS direct",
    )
    proxied_ms = median_ttft_ms(
        proxied,
        functools.partial(ws_reply, admin, good_proxy.ws_url, good_proxy.url, conversation, SHORT),
        "WS through nginx",
    )
    assert proxied_ms < direct_ms + NGINX_TTFT_BUDGET_MS


def test_nginx_forwards_client_address_and_hides_metrics(
    streaming_app: AppProcess, good_proxy: Nginx
) -> None:
    marker = f"probe-{time.monotonic_ns()}"
    response = httpx.get(
        f"{good_proxy.url}/healthz?{marker}", headers={"X-Forwarded-For": "203.0.113.7"}
    )
    assert response.status_code == 200
    deadline = time.monotonic() + 5
    while marker not in streaming_app.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [line for line in streaming_app.log_text().splitlines() if marker in line]
    assert lines and "203.0.113.7" in lines[0], lines  # uvicorn trusts nginx on 127.0.0.1

    assert httpx.get(f"{good_proxy.url}/metrics").status_code == 404
    direct = httpx.get(f"{streaming_app.url}/metrics")
    assert direct.status_code == 200 and "streamchat_engine_ttft_seconds" in direct.text


def test_nginx_hides_metrics_and_schema_however_spelled(
    streaming_app: AppProcess, good_proxy: Nginx
) -> None:
    """What the README says nginx hides, under every spelling that reaches the same handler in
    the app (Litestar ignores a trailing slash; nginx decodes and merges slashes before it picks
    a location, then passes the request on as sent). Before the fix `location = /metrics` let
    /metrics/ and every /schema path through."""
    spellings = [
        "/metrics",
        "/metrics/",
        "/metrics?x=1",
        "//metrics",
        "/%6detrics",
        "/schema",
        "/schema/",
        "/schema/openapi.json",
        "/schema/swagger",
        "//schema/openapi.json",
    ]
    leaked = {}
    for path in spellings:
        response = httpx.get(f"{good_proxy.url}{path}")
        if response.status_code != 404 or "streamchat_" in response.text:
            leaked[path] = response.status_code
    assert leaked == {}, leaked
    # The app behind it does serve them (the metrics to anyone who reaches the replica here: no
    # METRICS_TOKEN in this test), so the 404s above are nginx's doing.
    assert httpx.get(f"{streaming_app.url}/metrics/").status_code == 200
    assert httpx.get(f"{streaming_app.url}/schema/openapi.json").status_code == 401  # admins only
    # The app's security headers pass through.
    page = httpx.get(f"{good_proxy.url}/login")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"


# -- heartbeats through a short proxy timeout -----------------------------------------------------

SILENT_STEP_MS = 4000  # the synthetic engine's first (and only) token comes after 4 s of silence
PROXY_IDLE_S = 2  # nginx's proxy_read_timeout: half the silence


@pytest.fixture(scope="module")
def heartbeat_pair(ops_logs: Path) -> Iterator[dict[str, tuple[AppProcess, Nginx]]]:
    """Two slow apps behind nginx with a 2 s read timeout: heartbeats every 0.5 s, and none."""
    with throwaway_database() as database:
        base = {"ENGINE": "synthetic", "SYNTHETIC_STEP_MS": str(SILENT_STEP_MS)}
        base["DATABASE_URL"] = database.url
        assert release(base, ops_logs / "heartbeat-release.log").returncode == 0
        apps = {
            keepalive: AppProcess(
                f"app_keepalive_{keepalive}",
                {**base, "KEEPALIVE_S": keepalive, "REPLICA_ID": f"hb-{keepalive}"},
                ops_logs / f"heartbeat-{keepalive}.log",
            )
            for keepalive in ("0.5", "60")
        }
        proxies: list[Nginx] = []
        try:
            for app in apps.values():
                app.start()
            pair = {}
            for keepalive, app in apps.items():
                app.wait_ready()
                conf = proxy_for(f"idle-{keepalive}", (app, app), f"{PROXY_IDLE_S}s")
                proxies.append(start_nginx(f"nginx_keepalive_{keepalive}", conf))
                pair[keepalive] = (app, proxies[-1])
            yield pair
        finally:
            for nginx in proxies:
                nginx.stop()
            for app in apps.values():
                app.stop()


def silent_reply(nginx: Nginx) -> tuple[PageStream, BaseException | None, float]:
    """A one-token reply that takes 4 s, read through nginx: (what arrived, error, seconds)."""
    client = PageClient(nginx.url)
    client.signup(f"hb-{time.monotonic_ns()}@example.com")
    conversation = client.new_conversation()
    record = PageStream()
    error: BaseException | None = None
    try:
        with client.send(conversation, "wait for it [[synthetic:tokens=1]]") as response:
            assert response.status_code == 200, response.read()
            for item in SseReader(response):
                record.add(item)
    except httpx.HTTPError as exc:
        error = exc
    finally:
        client.close()
    return record, error, time.monotonic() - record.started_at


def test_heartbeats_carry_a_silent_reply_through_a_short_proxy_timeout(
    heartbeat_pair: dict[str, tuple[AppProcess, Nginx]],
) -> None:
    _, nginx = heartbeat_pair["0.5"]
    record, error, elapsed = silent_reply(nginx)
    print(f"\nKEEPALIVE_S=0.5: {len(record.comments)} heartbeats, done in {elapsed:.2f} s")
    assert error is None, repr(error)
    assert record.end is not None and record.end.json()["status"] == "completed", record.events
    start, token = record.events[0], record.deltas[0]
    assert token.at - start.at > PROXY_IDLE_S  # silent for longer than the proxy's timeout...
    arrivals = [start.at, *(c.at for c in record.comments), token.at]
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert max(gaps) < PROXY_IDLE_S  # ...but never for that long without a heartbeat
    assert len(record.comments) >= 5  # a heartbeat every 0.5 s, well inside 2 s
    assert "upstream timed out" not in nginx.log_text()


def test_control_without_heartbeats_the_proxy_cuts_the_stream(
    heartbeat_pair: dict[str, tuple[AppProcess, Nginx]],
) -> None:
    _, nginx = heartbeat_pair["60"]
    record, error, elapsed = silent_reply(nginx)
    print(f"\nKEEPALIVE_S=60: cut after {elapsed:.2f} s ({error!r}), events {len(record.events)}")
    assert record.end is None, "the stream survived a 4 s silence without heartbeats"
    assert error is not None  # a chunked body that ends without its last chunk
    # cut by the proxy's timeout: not before it, and before the reply's end
    assert PROXY_IDLE_S <= elapsed < SILENT_STEP_MS / 1000
    assert "upstream timed out" in nginx.log_text()
