"""Reading a JSON export back: a new conversation owned by whoever imports it, its rows as they
were (text, end states, timings, regenerated replies), under fresh ids."""

from __future__ import annotations

from uuid import UUID

import msgspec

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.chat.archive_schemas import ConversationExport
from app.domain.chat.conversations import clean_title
from app.domain.chat.models import Conversation, ConversationSource, Message
from app.domain.errors import InvalidInputError
from app.domain.json_input import text_problem
from app.streaming.events import Status


class ImportRefusedError(InvalidInputError):
    """A file that is not a conversation export this server can read; the message says why."""


def decode_export(body: bytes) -> ConversationExport:
    """The export in `body`, validated strictly; ImportRefusedError saying where it is wrong."""
    try:
        export = msgspec.json.decode(body, type=ConversationExport)
    except msgspec.ValidationError as exc:  # msgspec names the path: "... - at `$.messages[3]`"
        raise ImportRefusedError(f"not a conversation export: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ImportRefusedError(f"not JSON: {exc}") from exc
    if (problem := text_problem(export.conversation.title)) is not None:
        raise ImportRefusedError(f"conversation.title: {problem}")
    for index, message in enumerate(export.messages):
        if (problem := text_problem(msgspec.structs.astuple(message))) is not None:
            raise ImportRefusedError(f"messages[{index}]: {problem}")
        if message.status == Status.STREAMING:  # nothing would ever finish it
            raise ImportRefusedError(
                f"messages[{index}]: a reply still streaming cannot be imported"
            )
    return export


async def import_conversation(
    sessions: Sessions, user_id: UUID, export: ConversationExport
) -> Conversation:
    """One transaction: the conversation (on top of the user's list) and all its messages."""
    now = utcnow()
    async with transaction(sessions) as session:
        conversation = Conversation(
            user_id=user_id,
            title=clean_title(export.conversation.title),
            source=ConversationSource.PAGE,  # it shows in the importer's chat list
            created_at=now,
            updated_at=now,
        )
        session.add(conversation)
        await session.flush()
        session.add_all(
            Message(conversation_id=conversation.id, **msgspec.structs.asdict(m))
            for m in export.messages
        )
    return conversation
