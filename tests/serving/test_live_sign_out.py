"""Effective at once (issue 24, item 3), against a real server (synthetic engine, 10 ms steps) on
SQLite and PostgreSQL: disabling, deleting, resetting the password of or logging out a user who is
streaming a reply stops the reply (saved `cancelled`, the engine's sequence freed), ends their
push channels with `signed_out` and closes their WebSocket with 4401, within about a second.
Also the cap on one user's push channels (item 5: the oldest hears `resync` "evicted" and ends)
and the audit entry of an admin's kill switch (item 6).

Two replicas on one PostgreSQL database: test_live_sign_out_replicas.py."""

from __future__ import annotations

import json
import secrets
import time
import uuid
from typing import Any

import pytest

from tests.live_server import LiveServer, PageClient, PageStream, SseReader, query, read_stream
from tests.serving.sign_out_pages import LONG, event_stream, socket_page

EFFECTIVE_S = 1.5  # "within a second", with room for a loaded test machine
CAP = 3  # PUSH_MAX_CHANNELS_PER_USER here


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {"SYNTHETIC_STEP_MS": 10, "PUSH_MAX_CHANNELS_PER_USER": CAP}


def new_user(server: LiveServer, name: str) -> tuple[PageClient, str]:
    client = PageClient(server.url)
    signed_up = client.signup(f"{name}-{secrets.token_hex(4)}@example.com")  # SIGNUP_MODE=open
    return client, signed_up["id"]


def row_id(database_url: str, value: str) -> str | bytes:
    """A UUID as the database compares it: SQLite stores 16 raw bytes."""
    return uuid.UUID(value).bytes if database_url.startswith("sqlite") else value


def stored(database_url: str, message_id: str) -> dict[str, Any] | None:
    rows = query(
        database_url,
        "SELECT status, content, replica_id FROM messages WHERE id = :id",
        id=row_id(database_url, message_id),
    )
    return rows[0] if rows else None


def send_on(page: Any, conversation: str) -> str:
    """Send a long reply on the page's socket; its message id once its text streams."""
    page.send({"type": "send", "conversation_id": conversation, "content": LONG,
               "max_tokens": 2048, "client_ref": "mine"})  # fmt: skip
    start = page.take_until("start", client_ref="mine")
    page.take_until("delta", message_id=start["message_id"])
    return start["message_id"]


def test_disabling_a_user_mid_reply_stops_it_and_ends_their_channels_at_once(
    server: LiveServer, alice: PageClient, live_database_url: str
) -> None:
    carol, carol_id = new_user(server, "carol")
    conversation = carol.new_conversation()
    with socket_page(server.ws_url, carol) as page, event_stream(server.url, carol) as events:
        message_id = send_on(page, conversation)
        acted = time.monotonic()
        assert alice.post(f"/admin/api/users/{carol_id}/disable").status_code == 200

        final = page.take_until("final", message_id=message_id)
        assert final["status"] == "cancelled", final
        code, closed_at = page.wait_closed()
        assert code == 4401
        assert closed_at - acted < EFFECTIVE_S, closed_at - acted
        assert page.events()[-1] == {"event": "signed_out", "reason": "disabled"}
        assert events.wait_ended() - acted < EFFECTIVE_S
        assert events.rest()[-1] == {"event": "signed_out", "reason": "disabled"}

    row = stored(live_database_url, message_id)
    assert row is not None and row["status"] == "cancelled"
    assert row["content"] == page.text_of(message_id) != ""  # the text it had, kept
    assert alice.wait_engine_idle(5)["running"] == 0  # the engine's sequence is gone
    assert carol.http.get("/api/me").status_code == 401
    carol.close()


def test_deleting_a_user_mid_reply_stops_it_and_closes_their_socket(
    server: LiveServer, alice: PageClient, live_database_url: str
) -> None:
    """The reply streams over the page's SSE this time; the user's socket is open beside it."""
    dan, dan_id = new_user(server, "dan")
    conversation = dan.new_conversation()
    with (
        socket_page(server.ws_url, dan) as page,
        dan.send(conversation, LONG, max_tokens=2048) as response,
    ):
        reader, record = SseReader(response), PageStream()
        for item in reader:
            if record.add(item) is not None and item.event == "delta":
                break
        acted = time.monotonic()
        deleted = alice.http.delete(f"/admin/api/users/{dan_id}", headers=alice.csrf_headers())
        assert deleted.status_code == 204
        stream = read_stream(reader, record)
        assert stream.end is not None and stream.end.json()["status"] == "cancelled"
        code, closed_at = page.wait_closed()
        assert code == 4401 and closed_at - acted < EFFECTIVE_S, (code, closed_at - acted)
        assert page.events()[-1] == {"event": "signed_out", "reason": "deleted"}

    assert stored(live_database_url, stream.message_id) is None  # it went with the account
    gone = query(
        live_database_url,
        "SELECT id FROM users WHERE id = :id",
        id=row_id(live_database_url, dan_id),
    )
    assert gone == []
    assert alice.wait_engine_idle(5)["running"] == 0
    dan.close()


def test_a_password_reset_mid_reply_stops_it_and_closes_the_socket(
    server: LiveServer, alice: PageClient, live_database_url: str
) -> None:
    erin, erin_id = new_user(server, "erin")
    conversation = erin.new_conversation()
    with socket_page(server.ws_url, erin) as page:
        message_id = send_on(page, conversation)
        link = alice.post(f"/admin/api/users/{erin_id}/reset-link").json()["path"]
        anonymous = PageClient(server.url)
        reset = anonymous.post(
            "/api/auth/reset", {"token": link.split("=", 1)[1], "password": "a new passphrase!"}
        )
        acted = time.monotonic()  # after the response: hashing the password takes its time
        assert reset.status_code == 204
        assert page.take_until("final", message_id=message_id)["status"] == "cancelled"
        code, closed_at = page.wait_closed()
        assert code == 4401 and closed_at - acted < EFFECTIVE_S
    row = stored(live_database_url, message_id)
    assert row is not None and row["status"] == "cancelled"
    anonymous.close()
    erin.close()


def test_logging_out_everywhere_closes_old_sockets_and_a_new_log_in_keeps_its_own(
    server: LiveServer, alice: PageClient
) -> None:
    fay, fay_id = new_user(server, "fay")
    with socket_page(server.ws_url, fay) as page:
        acted = time.monotonic()
        assert alice.post(f"/admin/api/users/{fay_id}/logout").status_code == 200
        code, closed_at = page.wait_closed()
        assert code == 4401 and closed_at - acted < EFFECTIVE_S
    fay.login()
    with socket_page(server.ws_url, fay) as fresh:
        time.sleep(2.5)  # two of the server's once-a-second checks: this session is current
        assert fresh.open
        fay.new_conversation()
        assert fresh.take_until("event")["event"] == "conversation_created"
    fay.close()


def test_past_the_cap_a_users_oldest_push_channel_hears_resync_and_ends(
    server: LiveServer,
) -> None:
    gus, _ = new_user(server, "gus")
    with (
        event_stream(server.url, gus) as first,
        event_stream(server.url, gus) as second,
        event_stream(server.url, gus) as third,
    ):
        assert not first.ended
        with socket_page(server.ws_url, gus) as fourth:  # CAP + 1: the oldest goes
            assert first.next_event() == {"event": "resync", "reason": "evicted"}
            first.wait_ended()
            conversation = gus.new_conversation()
            created = {"event": "conversation_created", "conversation_id": conversation,
                       "title": "New chat"}  # fmt: skip
            assert second.next_event() == created and third.next_event() == created
            assert fourth.take_until("event") == {"type": "event", **created}
            with event_stream(server.url, gus) as fifth:  # and again: now the second
                assert second.next_event() == {"event": "resync", "reason": "evicted"}
                second.wait_ended()
                gus.new_conversation()
                assert third.next_event()["event"] == "conversation_created"
                assert fifth.next_event()["event"] == "conversation_created"
                assert fourth.open
    gus.close()


def test_an_admin_killing_a_reply_is_audited(server: LiveServer, alice: PageClient) -> None:
    hal, hal_id = new_user(server, "hal")
    conversation = hal.new_conversation()
    with socket_page(server.ws_url, hal) as page:
        message_id = send_on(page, conversation)
        killed = alice.post(f"/admin/api/live/{message_id}/kill")
        assert killed.status_code == 200 and killed.json()["status"] == "cancelled"
        assert page.take_until("final", message_id=message_id)["status"] == "cancelled"
        assert page.open  # a kill stops the reply, not the user
    entries = alice.http.get("/admin/api/audit", params={"who": hal_id}).json()["entries"]
    assert [e["action"] for e in entries] == ["kill_reply"]
    (entry,) = entries
    assert entry["actor_email"] == alice.email and entry["target_email"] == hal.email
    assert entry["address"] == "127.0.0.1"
    assert json.loads(entry["detail"]) == {
        "conversation": conversation,
        "message": message_id,
        "status": "cancelled",
        "was": "streaming",
    }
    hal.close()
