"""Reading a JSON export back: a new conversation owned by whoever imports it, its rows as they
were (text, end states, timings, every version of every turn), under fresh ids.

A version 2 file carries the tree, checked before anything is written: ids unique, every parent a
message of the file, no cycle, the current leaf a message of the file that ends a branch. A
version 1 file (one line, from before branches) becomes a tree the way migration 0005 turned the
stored rows into one: each kept message follows the kept message before it, and a replaced reply
answers the question before it, next to its replacement; the last kept message is the leaf.
"""

from __future__ import annotations

from uuid import UUID, uuid4

import msgspec

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.chat.archive_schemas import (
    ACCOUNT_EXPORT_FORMAT,
    AccountExport,
    AnyConversationExport,
    ConversationExport,
    ConversationExportV1,
    ExportedConversation,
    ExportedMessage,
    ExportFormatOnly,
)
from app.domain.chat.conversations import clean_title
from app.domain.chat.models import Conversation, ConversationSource, Message, MessageRole
from app.domain.chat.tree import Tree
from app.domain.errors import InvalidInputError
from app.domain.json_input import text_problem
from app.streaming.events import Status


class ImportRefusedError(InvalidInputError):
    """A file that is not a conversation export this server can read; the message says why."""


def decode_export(body: bytes) -> ConversationExport:
    """The export in `body`, validated strictly, as the current version (a version 1 file turned
    into its tree); ImportRefusedError saying where it is wrong."""
    try:
        export = msgspec.json.decode(body, type=AnyConversationExport)
    except msgspec.ValidationError as exc:  # msgspec names the path: "... - at `$.messages[3]`"
        if format_of(body) == ACCOUNT_EXPORT_FORMAT:
            raise ImportRefusedError(
                "this file holds every conversation of an account: import it on the account "
                "page (POST /api/account/import)"
            ) from exc
        raise ImportRefusedError(f"not a conversation export: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ImportRefusedError(f"not JSON: {exc}") from exc
    return checked(export)


def decode_account_export(body: bytes) -> list[ConversationExport]:
    """Every conversation of an account export (app/domain/chat/export.py), each checked as
    `decode_export` checks one; ImportRefusedError saying where the file is wrong."""
    try:
        bundle = msgspec.json.decode(body, type=AccountExport)
    except msgspec.ValidationError as exc:
        raise ImportRefusedError(f"not an account export: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ImportRefusedError(f"not JSON: {exc}") from exc
    exports = []
    for index, export in enumerate(bundle.conversations):
        try:
            exports.append(checked(export))
        except ImportRefusedError as exc:
            raise ImportRefusedError(f"conversations[{index}]: {exc}") from exc
    return exports


def format_of(body: bytes) -> str:
    try:
        return msgspec.json.decode(body, type=ExportFormatOnly).format
    except msgspec.MsgspecError:
        return ""


def checked(export: AnyConversationExport) -> ConversationExport:
    """A decoded export whose text is storable and whose messages form a tree, as the current
    version; ImportRefusedError otherwise."""
    if (problem := text_problem(export.conversation.title)) is not None:
        raise ImportRefusedError(f"conversation.title: {problem}")
    for index, message in enumerate(export.messages):
        if (problem := text_problem(msgspec.structs.astuple(message))) is not None:
            raise ImportRefusedError(f"messages[{index}]: {problem}")
        if message.status == Status.STREAMING:  # nothing would ever finish it
            raise ImportRefusedError(
                f"messages[{index}]: a reply still streaming cannot be imported"
            )
    if isinstance(export, ConversationExportV1):
        return from_version_1(export)
    parents_first(export)
    return export


def from_version_1(old: ConversationExportV1) -> ConversationExport:
    """A one-line export as a tree (see the module's doc), under new file ids."""
    kept: UUID | None = None  # the last message still in the chat
    question: UUID | None = None  # the last question: what a replaced reply answered
    messages = []
    for message in old.messages:
        fields = msgspec.structs.asdict(message)
        replaced = fields.pop("replaced_at") is not None
        message_id = uuid4()
        messages.append(
            ExportedMessage(id=message_id, parent_id=question if replaced else kept, **fields)
        )
        if not replaced:
            kept = message_id
        if message.role == MessageRole.USER:
            question = message_id
    if any(m.parent_id == kept for m in messages):  # a replaced reply with no successor
        kept = None  # the import shows the newest branch, as the page would
    return ConversationExport(
        format=old.format,
        exported_at=old.exported_at,
        conversation=ExportedConversation(
            **msgspec.structs.asdict(old.conversation), current_leaf_id=kept
        ),
        messages=messages,
    )


def parents_first(export: ConversationExport) -> list[ExportedMessage]:
    """The messages ordered so that each comes after its parent; ImportRefusedError when they do
    not form a tree (a repeated id, a parent not in the file, a cycle) or the current leaf is not
    the end of one of its branches."""
    index: dict[UUID, int] = {}
    for i, message in enumerate(export.messages):
        if message.id in index:
            raise ImportRefusedError(
                f"messages[{i}].id: {message.id} is already messages[{index[message.id]}]'s"
            )
        index[message.id] = i
    for i, message in enumerate(export.messages):
        if message.parent_id is not None and message.parent_id not in index:
            raise ImportRefusedError(
                f"messages[{i}].parent_id: no message {message.parent_id} in the file"
            )
    ordered: list[ExportedMessage] = []
    placed: set[UUID] = set()  # in `ordered`, after all their ancestors
    for i, message in enumerate(export.messages):
        walk: dict[UUID, None] = {}  # the ancestors not yet placed, nearest first (ordered set)
        node: UUID | None = message.id
        while node is not None and node not in placed:
            if node in walk:
                raise ImportRefusedError(
                    f"messages[{i}]: following parent_id from it runs into a cycle"
                )
            walk[node] = None
            node = export.messages[index[node]].parent_id
        for ancestor in reversed(walk):
            ordered.append(export.messages[index[ancestor]])
            placed.add(ancestor)
    leaf = export.conversation.current_leaf_id
    if leaf is not None and leaf not in index:
        raise ImportRefusedError(f"conversation.current_leaf_id: no message {leaf} in the file")
    if leaf is not None and any(m.parent_id == leaf for m in export.messages):
        raise ImportRefusedError(
            "conversation.current_leaf_id: messages follow it; it must end a branch"
        )
    return ordered


async def import_conversation(
    sessions: Sessions, user_id: UUID, export: ConversationExport
) -> Conversation:
    """One transaction: the conversation (on top of the user's list) and all its messages, the
    tree re-made with new ids (parents and the current leaf mapped to them)."""
    ordered = parents_first(export)
    new_ids = {m.id: uuid4() for m in ordered}
    now = utcnow()
    async with transaction(sessions) as session:
        conversation = Conversation(
            id=uuid4(),
            user_id=user_id,
            title=clean_title(export.conversation.title),
            source=ConversationSource.PAGE,  # it shows in the importer's chat list
            created_at=now,
            updated_at=now,
        )
        messages = [
            Message(
                conversation_id=conversation.id,
                **{
                    **msgspec.structs.asdict(m),
                    "id": new_ids[m.id],
                    "parent_id": new_ids[m.parent_id] if m.parent_id is not None else None,
                    # a window start not in the file: from the start
                    "window_start_id": new_ids.get(m.window_start_id),  # type: ignore[arg-type]
                },
            )
            for m in ordered  # parents first: each row's foreign key finds its parent
        ]
        leaf = export.conversation.current_leaf_id
        # No leaf in the file: the newest branch, as the page would show it.
        conversation.current_leaf_id = new_ids[leaf] if leaf else Tree(messages).latest_leaf()
        session.add(conversation)
        await session.flush()
        session.add_all(messages)
    return conversation
