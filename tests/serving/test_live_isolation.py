"""Other users' requests must not change yours: through `/v1` on a real server with SmolLM2.

The server runs llama.cpp with 2 threads (the live tests' default is 1): with one thread the
flash-attention kernel that made a reply depend on the other users' cells cannot split its work,
and the dependence this module guards against would not show. On SQLite and PostgreSQL.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.live_server import LiveServer, PageClient
from tests.serving.conftest import unique_email

MODEL = "SmolLM2-135M-Instruct.Q4_1"  # the bundled GGUF's stem (GET /v1/models)
QUESTION = "What is the capital of France?"
OTHER_PROMPTS = [
    "Write a long story about a lighthouse keeper.",
    "Explain how rain forms, in detail.",
    "List ten animals and describe each.",
    "Write a poem about autumn leaves.",
    "Describe the history of bread.",
]


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    # the prefix cache's cells kept in the pool: they widen the KV window past 512 cells
    return {
        "DEFAULT_MAX_TOKENS": 32,
        "ENGINE_THREADS": 2,
        "ENGINE_MAX_SEQS": 8,
        "ENGINE_PREFIX_CACHE_STORE": "pool",
    }


def api_key(client: PageClient) -> str:
    response = client.post("/api/keys", {"name": "isolation"})
    assert response.status_code == 201, response.text
    return response.json()["secret"]


def complete(
    server: LiveServer, key: str, content: str, max_tokens: int, model: str = MODEL
) -> dict[str, Any]:
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "temperature": 0,
        },
        timeout=300,
    )
    assert response.status_code == 200, response.text
    return response.json()


def reused_tokens(admin: PageClient) -> int:
    return int(admin.engine_stats()["extra"]["prefix_reused_tokens"])


def test_the_same_greedy_request_gives_the_same_reply_after_other_users_traffic(
    server: LiveServer, alice: PageClient, bob: PageClient
) -> None:
    """Alice asks at temperature 0 on a fresh server; Bob then sends five unrelated requests at
    once; Alice asks again (her own first request's cells are reused: a cache hit) and gets the
    same text. Checked to fail before the engine's pad token: the reply changed."""
    alice_key, bob_key = api_key(alice), api_key(bob)
    first = complete(server, alice_key, QUESTION, 48)
    with ThreadPoolExecutor(len(OTHER_PROMPTS)) as pool:
        list(pool.map(lambda p: complete(server, bob_key, p, 120), OTHER_PROMPTS))
    alice.wait_engine_idle()
    assert alice.engine_stats()["extra"]["prefix_cache_cells"] >= 512
    before = reused_tokens(alice)
    again = complete(server, alice_key, QUESTION, 48)
    assert reused_tokens(alice) - before == first["usage"]["prompt_tokens"] - 1  # a cache hit
    text = first["choices"][0]["message"]["content"]
    assert text and again["choices"][0]["message"]["content"] == text


def test_another_users_identical_prompt_is_not_a_cache_hit(
    server: LiveServer, alice: PageClient
) -> None:
    """Carol (new: nothing of hers is cached) sends exactly what Alice just sent: every token of
    her prompt past the chat template's opening (the one prefix everybody shares, cached at
    start) is prefilled, so her time to first token cannot tell her that someone sent it before;
    Alice's repeat reuses hers. Checked to fail with one cache for everyone (Carol reused all but
    one token)."""
    carol = PageClient(server.url)
    try:
        carol.signup(unique_email("carol"))
        alice_key, carol_key = api_key(alice), api_key(carol)
    finally:
        carol.close()
    secret = "My locker code is 4417; remind me of it tomorrow morning, please."
    complete(server, alice_key, secret, 4)
    before = reused_tokens(alice)
    carols = complete(server, carol_key, secret, 4)
    opening = int(alice.engine_stats()["extra"]["prefix_shared_tokens"])
    assert 10 <= opening < carols["usage"]["prompt_tokens"] - 15  # no user text in it
    assert reused_tokens(alice) - before == opening
    before = reused_tokens(alice)
    complete(server, alice_key, secret, 4)
    assert reused_tokens(alice) - before == carols["usage"]["prompt_tokens"] - 1
