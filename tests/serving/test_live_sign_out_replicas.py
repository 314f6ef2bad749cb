"""Effective at once on every replica (issue 24, item 3): two servers on one PostgreSQL database
(the multi-replica set-up; the relay between them is NOTIFY). The admin acts on replica A; the
user's page is on replica B, where their reply runs: it is stopped and saved `cancelled`, and B
closes the user's socket and push channel, within about a second. A user ending one of their
sessions on A closes that session's socket on B at once.

PostgreSQL only: SQLite is one process (its sign-outs are in test_live_sign_out.py). Each client
keeps to one replica (sessions here are each process's own; the shared session store is
tests/ops/test_replicas.py's business)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live_databases import migrated_database
from tests.live_server import LiveServer, PageClient, running_server, server_env
from tests.serving.sign_out_pages import event_stream, socket_page
from tests.serving.test_live_sign_out import AT_ONCE_S, EFFECTIVE_S, send_on, stored


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, LiveServer]]:
    directory = tmp_path_factory.mktemp("sign-out-replicas")
    with migrated_database("postgresql", directory) as url:

        def env(replica: str) -> dict[str, str]:
            return server_env(
                "synthetic", url, directory / replica, SYNTHETIC_STEP_MS=10, REPLICA_ID=replica
            )

        for replica in ("a", "b"):
            Path(directory / replica).mkdir()
        with (
            running_server(env("a"), directory / "replica_a.log") as a,
            running_server(env("b"), directory / "replica_b.log") as b,
        ):
            yield a, b


def test_an_admin_on_one_replica_stops_the_users_reply_and_sockets_on_the_other(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    a, b = replicas
    admin = PageClient(a.url)
    assert admin.signup("admin@example.com")["is_admin"] is True
    user = PageClient(b.url)
    user_id = user.signup("ivy@example.com")["id"]
    conversation = user.new_conversation()
    with socket_page(b.ws_url, user) as page, event_stream(b.url, user) as events:
        message_id = send_on(page, conversation)
        running = stored(database(a), message_id)
        assert running is not None and running["replica_id"] == "b"  # the reply runs on B
        acted = time.monotonic()
        assert admin.post(f"/admin/api/users/{user_id}/disable").status_code == 200

        final = page.take_until("final", message_id=message_id)
        assert final["status"] == "cancelled" and final["stopped_by"] == "signed_out", final
        code, closed_at = page.wait_closed()
        assert code == 4401 and closed_at - acted < EFFECTIVE_S, (code, closed_at - acted)
        assert page.events()[-1] == {"event": "signed_out", "reason": "disabled"}
        assert events.wait_ended() - acted < EFFECTIVE_S
        assert events.rest()[-1] == {"event": "signed_out", "reason": "disabled"}

    row = stored(database(a), message_id)
    assert row is not None and row["status"] == "cancelled"
    assert row["content"] == page.text_of(message_id) != ""
    assert user.http.get("/api/me").status_code == 401  # and B's requests refuse the session
    admin.close()
    user.close()


def test_a_user_logging_out_a_session_on_another_replica_closes_its_socket_there_at_once(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    """The user ends, from replica A's account page, the session they have on replica B: B
    closes that session's socket at once (told by A: nothing else would, as the account's epoch
    does not change); A's own socket stays."""
    a, b = replicas
    on_a = PageClient(a.url)
    on_a.signup("jan@example.com")
    on_b = PageClient(b.url)
    on_b.login("jan@example.com")
    with socket_page(a.ws_url, on_a) as mine, socket_page(b.ws_url, on_b) as theirs:
        (row,) = [s for s in on_a.http.get("/api/account/sessions").json() if not s["current"]]
        ended = on_a.http.delete(f"/api/account/sessions/{row['id']}", headers=on_a.csrf_headers())
        answered = time.monotonic()
        assert ended.status_code == 204, ended.text
        code, closed_at = theirs.wait_closed()
        assert code == 4401 and closed_at - answered < AT_ONCE_S, (code, closed_at - answered)
        assert theirs.events()[-1] == {"event": "signed_out", "reason": "logged_out"}
        time.sleep(2.5)  # two of each server's once-a-second checks
        assert mine.open
    assert on_b.http.get("/api/me").status_code == 401
    on_a.close()
    on_b.close()


def database(server: LiveServer) -> str:
    return server.env["DATABASE_URL"]
