"""The OpenAI-compatible `/v1` API, driven by the official `openai` package, against a real server
and the real SmolLM2 model (ENGINE=llamacpp), on SQLite and PostgreSQL; and the same over the
TensorRT-LLM adapter on the FAKE `tensorrt_llm` (ENGINE=trtllm, no GPU here).

Each completion is stored like a page reply (conversation source `api`); the tests read those rows
straight from the database, since the API does not return their ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from tests.live_server import BASE_ENV, LiveServer, PageClient, query, uuid_text

GREEDY: dict[str, Any] = {"temperature": 0, "seed": 3}
STORY = [{"role": "user", "content": "Write a long story about a dragon."}]


@pytest.fixture(scope="module", params=["llamacpp", "trtllm-fake"])
def engine_kind(request: pytest.FixtureRequest) -> str:
    """Real SmolLM2 on llama.cpp, and the TensorRT-LLM adapter over the FAKE `tensorrt_llm`
    (tests/fakes/tensorrt_llm/: TensorRT-LLM needs a GPU)."""
    return request.param


def api_replies(database_url: str) -> dict[str, dict[str, Any]]:
    """Every assistant row of an API conversation, by id."""
    rows = query(
        database_url,
        "SELECT m.id, m.content, m.status, m.completion_tokens, m.prompt_tokens, m.finished_at"
        " FROM messages m JOIN conversations c ON c.id = m.conversation_id"
        " WHERE c.source = 'api' AND m.role = 'assistant'",
    )
    return {uuid_text(row["id"]): {**row, "id": uuid_text(row["id"])} for row in rows}


# The API's disconnect grace is 0: a reply whose client left ends before a page's would (the server
# of these tests waits PAGE_GRACE_S for a page's reader to come back).
PAGE_GRACE_S = float(BASE_ENV["PAGE_GRACE_S"])


@pytest.fixture
def new_api_reply(live_database_url: str) -> Callable[..., dict[str, Any]]:
    """Call it after a request: the one API reply row created since the fixture was set up,
    polled until it has left `streaming` (or `wait=False`: as it is now)."""
    before = set(api_replies(live_database_url))

    def find(*, wait: bool = True, timeout_s: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            new = {k: v for k, v in api_replies(live_database_url).items() if k not in before}
            assert len(new) <= 1, new
            if new:
                (row,) = new.values()
                if not wait or row["status"] != "streaming":
                    return row
            if time.monotonic() > deadline:
                raise AssertionError(f"no finished API reply after {timeout_s} s: {new!r}")
            time.sleep(0.05)

    return find


@pytest.fixture(scope="module")
def api_key(alice: PageClient) -> str:
    response = alice.post("/api/keys", {"name": "live tests"})
    assert response.status_code == 201, response.text
    return response.json()["secret"]


@pytest.fixture(scope="module")
def client(server: LiveServer, api_key: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=api_key, max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    models = client.models.list().data
    assert len(models) == 1
    return models[0].id


def test_streaming_chunks_concatenate_to_the_stored_text(
    client: openai.OpenAI, model: str, new_api_reply: Callable[..., dict[str, Any]]
) -> None:
    """`stream=True` with `include_usage`: the content chunks concatenate to the stored reply, one
    chunk carries the finish reason, and a last chunk with no choices carries the usage."""
    stream = client.chat.completions.create(
        model=model,
        messages=STORY,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = list(stream)

    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["length"]
    assert all(c.usage is None for c in chunks[:-1])
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.completion_tokens == 24
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")

    stored = new_api_reply()
    assert stored["content"] == text and len(text) > 20
    assert stored["status"] == "length"
    assert stored["completion_tokens"] == usage.completion_tokens
    assert stored["prompt_tokens"] == usage.prompt_tokens


def test_streaming_without_include_usage_has_no_usage_chunk(
    client: openai.OpenAI, model: str
) -> None:
    """Without `stream_options.include_usage` no chunk carries usage, and every chunk has a choice."""
    chunks = list(
        client.chat.completions.create(
            model=model, messages=STORY, max_tokens=8, stream=True, **GREEDY
        )
    )
    assert chunks and all(c.usage is None and len(c.choices) == 1 for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_non_streaming_completion(
    client: openai.OpenAI, model: str, new_api_reply: Callable[..., dict[str, Any]]
) -> None:
    """A plain completion returns the whole stored reply, its finish reason and usage."""
    completion = client.chat.completions.create(
        model=model, messages=STORY, max_tokens=16, **GREEDY
    )
    choice = completion.choices[0]
    assert completion.object == "chat.completion" and completion.model == model
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 16
    stored = new_api_reply()
    assert stored["content"] == choice.message.content and stored["content"]
    assert stored["status"] == "length"


def test_closing_the_stream_stops_the_reply_at_once(
    client: openai.OpenAI,
    model: str,
    alice: PageClient,
    new_api_reply: Callable[..., dict[str, Any]],
) -> None:
    """Closing the client's stream cancels the reply: with an API grace of 0 the row becomes
    `disconnected` within moments, its text starts with what the client got, and the engine is
    freed."""
    stream = client.chat.completions.create(
        model=model, messages=STORY, max_tokens=400, stream=True, **GREEDY
    )
    seen = ""
    for chunk in stream:
        seen += chunk.choices[0].delta.content or ""
        if len(seen) > 20:
            break
    stream.close()
    closed_at = time.monotonic()

    stored = new_api_reply(timeout_s=5.0)
    assert time.monotonic() - closed_at < PAGE_GRACE_S  # ended before a page's grace could
    assert stored["status"] == "disconnected"
    assert stored["content"].startswith(seen)
    assert stored["completion_tokens"] < 400
    assert alice.wait_engine_idle(timeout_s=3)["running"] == 0


def test_penalties_and_min_p_are_taken(client: openai.OpenAI, model: str, engine_kind: str) -> None:
    """OpenAI's `frequency_penalty` and `presence_penalty`, and llama.cpp server's `min_p` and
    `repeat_penalty` (through the client's `extra_body`), reach the engine: on a prompt that
    makes SmolLM2 repeat itself, the greedy reply changes (the fake TensorRT-LLM's reply does not
    depend on sampling, so there it is only accepted)."""
    repetitive = [{"role": "user", "content": "Repeat after me: la la la la la la la la la la"}]

    def reply(**params: Any) -> str:
        done = client.chat.completions.create(
            model=model, messages=repetitive, max_tokens=48, **GREEDY, **params
        )
        assert done.choices[0].finish_reason in ("stop", "length")
        return done.choices[0].message.content or ""

    plain = reply()
    tuned = [
        reply(frequency_penalty=1.5),
        reply(presence_penalty=2.0),
        reply(extra_body={"repeat_penalty": 1.8, "min_p": 0.1}),
    ]
    assert plain and all(tuned)
    if engine_kind == "llamacpp":
        assert all(text != plain for text in tuned), (plain, tuned)


def test_a_wrong_api_key_is_an_authentication_error(server: LiveServer, model: str) -> None:
    """A wrong bearer key answers 401 in OpenAI's error shape: the client raises
    AuthenticationError, for models and for completions."""
    with openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="sk-not-a-real-key", max_retries=0
    ) as stranger:
        with pytest.raises(openai.AuthenticationError) as raised:
            stranger.models.list()
        assert raised.value.status_code == 401
        assert raised.value.body["type"] == "authentication_error"  # type: ignore[index]
        with pytest.raises(openai.AuthenticationError):
            stranger.chat.completions.create(model=model, messages=STORY, max_tokens=4)


def test_an_unknown_model_is_not_found(client: openai.OpenAI, live_database_url: str) -> None:
    """An unknown model answers 404 (NotFoundError) and writes nothing."""
    before = api_replies(live_database_url)
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model="gpt-imaginary", messages=STORY, max_tokens=4)
    assert raised.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert api_replies(live_database_url) == before


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"temperature": 5}, 400),
        ({"top_p": 0}, 400),
        ({"max_tokens": 0}, 400),
        ({"messages": []}, 400),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 400),
        ({"messages": [{"role": "user", "content": "7 " * 30000}]}, 400),
        ({"frequency_penalty": 2.5}, 400),
        ({"presence_penalty": -3}, 400),
        ({"extra_body": {"min_p": 1.5}}, 400),
        ({"extra_body": {"repeat_penalty": 0}}, 400),
    ],
    ids=[
        "temperature",
        "top_p",
        "max_tokens",
        "no-messages",
        "bad-role",
        "over-context",
        "frequency_penalty",
        "presence_penalty",
        "min_p",
        "repeat_penalty",
    ],
)
def test_bad_parameters_are_400_and_write_nothing(
    client: openai.OpenAI,
    model: str,
    live_database_url: str,
    params: dict[str, Any],
    status: int,
) -> None:
    """Out-of-range sampling parameters and unusable messages are a BadRequestError with a
    message, and leave no conversation or message behind."""
    counts_before = query(live_database_url, "SELECT count(*) AS n FROM conversations")
    request: dict[str, Any] = {"model": model, "messages": STORY, "max_tokens": 4, **params}
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(**request)
    assert raised.value.status_code == status
    assert raised.value.body["message"]  # type: ignore[index]
    assert query(live_database_url, "SELECT count(*) AS n FROM conversations") == counts_before


# Each message fits the page's per-message limit; together they are far over any context the
# model has (SmolLM2 was trained for 8,192 tokens), and under the server's character guard.
LONG_HISTORY: list[dict[str, str]] = [
    {"role": "user" if i % 2 == 0 else "assistant", "content": "7 " * 7400} for i in range(3)
] + [{"role": "user", "content": "And then?"}]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(
    "messages", [[{"role": "user", "content": "7 " * 30000}], LONG_HISTORY], ids=["one", "history"]
)
def test_messages_over_the_context_are_context_length_exceeded(
    client: openai.OpenAI,
    model: str,
    live_database_url: str,
    messages: list[dict[str, str]],
    stream: bool,
) -> None:
    """No silent truncation under /v1: messages too long for the context are OpenAI's 400
    `context_length_exceeded` (streaming too: refused before the stream's 200), with the counts
    in OpenAI's words, and nothing is stored."""
    counts_before = query(live_database_url, "SELECT count(*) AS n FROM conversations")
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=4,
            stream=stream,  # type: ignore[call-overload]
        )
    assert raised.value.status_code == 400
    error = raised.value.body
    assert isinstance(error, dict)
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "messages",
        "context_length_exceeded",
    )
    assert raised.value.code == "context_length_exceeded"  # as OpenAI's clients read it
    assert error["message"].startswith("This model's maximum context length is ")
    assert "However, your messages resulted in " in error["message"]
    assert query(live_database_url, "SELECT count(*) AS n FROM conversations") == counts_before


def test_a_non_streaming_client_that_gives_up_stops_the_reply(
    client: openai.OpenAI,
    model: str,
    alice: PageClient,
    new_api_reply: Callable[..., dict[str, Any]],
) -> None:
    """A non-streaming call whose client gives up (here: a 1 s timeout) is a disconnect like a
    closed stream: with an API grace of 0 the row becomes `disconnected` within moments and the
    engine stops, instead of generating a reply nobody will receive."""
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=1.0).chat.completions.create(
            model=model, messages=STORY, max_tokens=400, **GREEDY
        )
    given_up_at = time.monotonic()
    row = new_api_reply(wait=False)
    try:
        stored = new_api_reply(timeout_s=5.0)
        assert time.monotonic() - given_up_at < PAGE_GRACE_S  # before a page's grace could end
        assert stored["status"] == "disconnected"
        assert stored["completion_tokens"] < 400
    finally:  # do not leave the engine busy for the next tests
        if new_api_reply(wait=False)["status"] == "streaming":
            alice.post(f"/admin/api/live/{row['id']}/kill")
            new_api_reply(timeout_s=10.0)
