"""The chat page in Chromium over the TensorRT-LLM adapter, on the FAKE `tensorrt_llm`
(tests/fakes/tensorrt_llm/; TensorRT-LLM needs a GPU, which this machine lacks): Stop, over SSE and
over the WebSocket, ends the reply `cancelled` with exactly the text on screen, the engine idle.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from e2e.conftest import User
from e2e.helpers import ChatPage, stop_mid_reply_then_reload


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "trtllm-fake"


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_stop_mid_reply_over_the_trtllm_adapter(
    new_user: Callable[..., User], admin: User, database_url: str, transport: str
) -> None:
    """Stop in the page: "stopped" badge, the row `cancelled` with the text on screen, the
    TensorRT-LLM adapter running nothing; a reload brings the same text and badge back."""
    stop_mid_reply_then_reload(
        ChatPage(new_user().page), admin.context.request, database_url, transport
    )
