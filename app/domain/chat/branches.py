"""Edit and branch: the rows behind a conversation's versions (the tree itself: tree.py).

Regenerate adds a sibling reply (same question); edit adds a sibling question (same parent as the
edited one) with its streaming reply. Either way the new reply becomes the conversation's current
leaf, and the old versions stay, one click away (the page's "2/3" switcher). Switching moves the
current leaf to the newest end of the chosen version's branch; the next turn follows the branch
shown.

The writes start, like `write_turn`, with a conditional UPDATE of the conversation (which also moves
its leaf), never a read, so a racing DELETE either waits for them or wins outright
(ConversationNotFoundError); see app/domain/chat/reply_rows.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID, uuid4

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.chat.context_window import Fitted
from app.domain.chat.conversations import ConversationNotFoundError
from app.domain.chat.models import Conversation, Message
from app.domain.chat.reply_rows import (
    NotRegenerableError,
    new_reply,
    take_conversation,
    turn_rows,
)
from app.domain.chat.token_counts import store_counts
from app.domain.chat.tree import Tree
from app.domain.errors import DomainError
from app.streaming.events import Status


class NotEditableError(DomainError):
    """This message cannot be edited (the message says why, for the user)."""

    status = 409


class UnknownBranchError(DomainError, LookupError):
    """The message to switch to is not one of this conversation's."""

    status = 404
    message = "no such message in this conversation"


class NotShownError(DomainError, LookupError):
    """A page of messages asked for before a message that is not on the branch shown (another
    tab switched versions since): the client reloads the conversation."""

    status = 409
    message = "that message is not on the branch shown now: reload the conversation"


class StaleBranchError(DomainError):
    """A send after a message that something follows already: the page that sent it did not see
    a turn added since (another tab or device). It reloads the conversation; nothing is written."""

    status = 409
    message = (
        "this conversation has moved on since this page showed it (another tab or device added "
        "to it): look at it again and send once more"
    )


def branch_to(tree: Tree, current_leaf: UUID | None, parent_id: UUID | None) -> list[Message]:
    """The branch a new turn follows: the one ending at `parent_id`, the last message on the
    sender's screen (None: the branch the server shows, through `current_leaf`). Raises
    UnknownBranchError (not a message of this conversation) or StaleBranchError (not a branch's
    end any more)."""
    if parent_id is None:
        return tree.shown(current_leaf)
    parent = tree.by_id.get(parent_id)
    if parent is None:
        raise UnknownBranchError(parent_id)
    if not tree.is_leaf(parent):
        raise StaleBranchError(parent_id)
    return tree.path(parent_id)


@dataclass(frozen=True, slots=True)
class Thread:
    """A conversation as its owner sees it: the messages of the branch shown, and every tree."""

    conversation: Conversation
    tree: Tree
    messages: list[Message]

    def sibling_ids(self, message: Message) -> list[str]:
        return [str(m.id) for m in self.tree.siblings(message)]

    def page(self, before: UUID | None, limit: int) -> tuple[int, int]:
        """Where the newest `limit` messages before `before` (None: the newest of all) are in
        `messages`, as a slice's start and end. Keyed by a message, not an offset, so a turn added
        meanwhile does not shift the pages. Raises NotShownError."""
        end = len(self.messages)
        if before is not None:
            end = next((i for i, m in enumerate(self.messages) if m.id == before), -1)
            if end < 0:
                raise NotShownError(before)
        return max(0, end - limit), end


async def load_tree(session: AsyncSession, conversation_id: UUID) -> Tree:
    return Tree(
        await session.scalars(select(Message).where(Message.conversation_id == conversation_id))
    )


async def _owned(session: AsyncSession, user_id: UUID, conversation_id: UUID) -> Conversation:
    conversation = await session.scalar(
        select(Conversation).where(
            Conversation.id == conversation_id, Conversation.user_id == user_id
        )
    )
    if conversation is None:
        raise ConversationNotFoundError(conversation_id)
    return conversation


async def visible_thread(sessions: Sessions, user_id: UUID, conversation_id: UUID) -> Thread:
    """The user's conversation with the branch it shows. Raises ConversationNotFoundError."""
    async with transaction(sessions) as session:
        conversation = await _owned(session, user_id, conversation_id)
        tree = await load_tree(session, conversation_id)
    return Thread(conversation, tree, tree.shown(conversation.current_leaf_id))


async def switch_branch(
    sessions: Sessions, user_id: UUID, conversation_id: UUID, message_id: UUID
) -> Thread:
    """Show the branch through `message_id` (to its newest end); the next turn follows it.
    Raises ConversationNotFoundError or UnknownBranchError. The conversation's `updated_at` stays:
    looking at another version is not activity."""
    async with transaction(sessions) as session:
        conversation = await _owned(session, user_id, conversation_id)
        tree = await load_tree(session, conversation_id)
        if message_id not in tree.by_id:
            raise UnknownBranchError(message_id)
        conversation.current_leaf_id = tree.latest_leaf(message_id)
    return Thread(conversation, tree, tree.shown(conversation.current_leaf_id))


async def add_sibling_reply(
    sessions: Sessions,
    reply: Message,
    model: str | None,
    *,
    engine_request_id: str | None = None,
    replica_id: str | None = None,
    window: Fitted | None = None,
) -> Message:
    """A new `streaming` answer to `reply`'s question, next to it, shown from now on; `window`:
    its prompt's fitting (where its window begins, counts to keep).

    Checked again inside the transaction: the reply must have ended and have nothing after it
    (NotRegenerableError). Two regenerations of one reply at once make two versions."""
    now = utcnow()
    successor = new_reply(reply.conversation_id, model, engine_request_id, replica_id, now)
    successor.id, successor.parent_id = uuid4(), reply.parent_id
    successor.window_start_id = window.window_start_id if window else None
    async with transaction(sessions) as session:
        await take_conversation(session, reply.conversation_id, now, successor.id)
        await store_counts(session, window.counted if window else {})
        if await session.scalar(select(Message.id).where(Message.parent_id == reply.id).limit(1)):
            raise NotRegenerableError("only the latest reply can be regenerated")
        if await session.scalar(select(Message.status).where(Message.id == reply.id)) in (
            None,
            Status.STREAMING,
        ):
            raise NotRegenerableError("this reply is still streaming: stop it first")
        session.add(successor)
    return successor


async def add_edited_turn(
    sessions: Sessions,
    edited: Message,
    content: str,
    model: str | None,
    *,
    engine_request_id: str | None = None,
    replica_id: str | None = None,
    window: Fitted | None = None,
) -> tuple[Message, Message]:
    """The edited question, next to `edited`, and its `streaming` reply, shown from now on;
    `window`: the prompt's fitting (the question's id and count, the reply's window)."""
    now = utcnow()
    question, reply = turn_rows(
        edited.conversation_id,
        content,
        model,
        edited.parent_id,
        engine_request_id=engine_request_id,
        replica_id=replica_id,
        now=now,
        window=window,
    )
    async with transaction(sessions) as session:
        await take_conversation(session, edited.conversation_id, now, reply.id)
        await store_counts(session, window.counted if window else {})
        session.add_all([question, reply])
    return question, reply
