"""What the model is shown: the branch of the conversation on screen as chat messages, for a new
turn, to answer a reply's question again, or to answer an edited question."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.session import Sessions, transaction
from app.domain.accounts.models import User
from app.domain.chat.conversations.branches import NotEditableError, branch_to, load_tree
from app.domain.chat.conversations.store import DEFAULT_TITLE, ConversationNotFoundError
from app.domain.chat.models import Conversation, ConversationSource, Message, MessageRole
from app.domain.chat.prompts.window import Said
from app.domain.chat.replies.rows import NotRegenerableError
from app.domain.chat.settings.models import ConversationSettings
from app.domain.chat.settings.schemas import ChatSettings
from app.domain.chat.settings.service import NO_SETTINGS, as_settings
from app.domain.chat.tree import Tree
from app.domain.errors import NotLoggedInError
from app.streaming.events import Status


def _in_prompt(m: Message) -> bool:
    """Replies still streaming or that ended with no text at all are left out of prompts (a
    cut-short reply keeps the part the user saw)."""
    return m.status is not Status.STREAMING and bool(
        m.content or m.role is not MessageRole.ASSISTANT
    )


def _as_chat(path: list[Message]) -> list[dict[str, str]]:
    """A branch as chat messages (`_in_prompt`'s)."""
    return [{"role": str(m.role), "content": m.content} for m in path if _in_prompt(m)]


def as_said(path: list[Message]) -> list[Said]:
    """A branch as the context window fits it (`_in_prompt`'s, with their stored counts)."""
    return [Said(m.id, str(m.role), m.content, m.token_count) for m in path if _in_prompt(m)]


def previous_window(path: list[Message]) -> UUID | None:
    """Where the branch's last reply's window began (None: from the start, or no reply yet)."""
    reply = next((m for m in reversed(path) if m.role is MessageRole.ASSISTANT), None)
    return None if reply is None else reply.window_start_id


@dataclass(frozen=True, slots=True)
class Branch:
    """What a reply's prompt is fitted from (app/domain/chat/prompts/window.py)."""

    history: list[Said]  # the branch before the question, oldest first
    question: Said  # the question (stored, or about to be)
    previous_start: UUID | None  # where the previous reply's window began


def with_system_prompt(system_prompt: str, messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The conversation's system prompt first (from its settings: chat_settings.py), if it has one."""
    if not system_prompt.strip():
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


async def _page_tree(sessions: Sessions, message: Message, refusal: Exception) -> Tree:
    """The tree of `message`'s conversation; raises `refusal` unless it is a page conversation (an
    API conversation's prompt was the client's own message list, not what is stored).

    Raises ConversationNotFoundError when a racing delete got there first: the conversation gone,
    or `message` missing from its tree (on SQLite these reads are separate snapshots, so they can
    see the conversation before the delete and its messages after it)."""
    async with transaction(sessions) as session:
        conversation = await session.get(Conversation, message.conversation_id)
        if conversation is None:
            raise ConversationNotFoundError(message.conversation_id)
        if conversation.source is not ConversationSource.PAGE:
            raise refusal
        tree = await load_tree(session, message.conversation_id)
    if message.id not in tree.by_id:
        raise ConversationNotFoundError(message.conversation_id)
    return tree


@dataclass(frozen=True, slots=True)
class NextTurn:
    """What a new turn of a conversation is built on, read in the transaction that writes it."""

    title: str
    source: ConversationSource
    settings: ChatSettings  # the conversation's (none chosen: all defaults)
    history: list[dict[str, str]]  # the branch on screen as chat messages, oldest first
    parent_id: UUID | None  # the branch's last message (None: the conversation is empty)
    said: list[Said]  # the same branch, as the context window fits it
    previous_start: UUID | None  # where its last reply's window began
    # the user's own token quotas, day and month (None: the default), for Quotas.admit
    quota_overrides: tuple[int | None, int | None] = (None, None)

    def branch(self, content: str, question_id: UUID) -> Branch:
        """The new turn's question after the branch on screen."""
        question = Said(question_id, str(MessageRole.USER), content, None)
        return Branch(self.said, question, self.previous_start)

    @property
    def untitled(self) -> bool:
        return self.title == DEFAULT_TITLE

    def prompt(self, content: str) -> list[dict[str, str]]:
        """The chat messages for the model: system prompt, history, then the new question."""
        turn = [*self.history, {"role": "user", "content": content}]
        return with_system_prompt(self.settings.system_prompt, turn)


# One statement for all of it: the user (still there? their token quotas), the conversation (if it
# is theirs), its settings row (if any) and its messages, one row per message (one row with NULL
# message columns when it has none; no row at all when the user is gone). Built once, with the ids
# as bound parameters. Plain columns, not ORM objects: nothing read here is changed or kept, and
# rows load for less. They carry the attributes `Tree`, `_as_chat` and `as_said` read (id,
# parent_id, created_at, role, status, content, token_count, window_start_id).
_NEXT_TURN = (
    select(
        User.quota_tokens_per_day,
        User.quota_tokens_per_month,
        Conversation.title,
        Conversation.source,
        Conversation.current_leaf_id,
        ConversationSettings.conversation_id.label("settings_of"),
        ConversationSettings.system_prompt,
        ConversationSettings.sampling,
        Message.id,
        Message.parent_id,
        Message.created_at,
        Message.role,
        Message.status,
        Message.content,
        Message.token_count,
        Message.window_start_id,
    )
    .select_from(User)
    .outerjoin(
        Conversation,
        (Conversation.id == bindparam("conversation_id")) & (Conversation.user_id == User.id),
    )
    .outerjoin(ConversationSettings, ConversationSettings.conversation_id == Conversation.id)
    .outerjoin(Message, Message.conversation_id == Conversation.id)
    .where(User.id == bindparam("user_id"))
)


async def next_turn(
    session: AsyncSession, user_id: UUID, conversation_id: UUID, parent_id: UUID | None = None
) -> NextTurn:
    """The user's conversation, its settings and the branch the new turn follows (the one
    ending at `parent_id`, the sender's last shown message; None: the one the server shows), in
    one query in the caller's transaction, which also checks that the user still exists. Raises
    NotLoggedInError (no such user), ConversationNotFoundError (also for another user's),
    UnknownBranchError or StaleBranchError (`branches.branch_to`)."""
    params = {"user_id": user_id, "conversation_id": conversation_id}
    rows = (await session.execute(_NEXT_TURN, params)).all()
    if not rows:
        raise NotLoggedInError("log in first")
    head = rows[0]
    if head.title is None:
        raise ConversationNotFoundError(conversation_id)
    tree = Tree(row for row in rows if row.id is not None)  # type: ignore[misc]  # duck-typed
    path = branch_to(tree, head.current_leaf_id, parent_id)
    return NextTurn(
        title=head.title,
        source=head.source,
        settings=NO_SETTINGS if head.settings_of is None else as_settings(head),
        history=_as_chat(path),
        parent_id=path[-1].id if path else None,
        said=as_said(path),
        previous_start=previous_window(path),
        quota_overrides=(head.quota_tokens_per_day, head.quota_tokens_per_month),
    )


async def regeneration_prompt(
    sessions: Sessions, reply: Message
) -> tuple[list[dict[str, str]], UUID]:
    """The chat messages `reply` answered, to answer them again, and the question's id.

    A reply of a page conversation can be regenerated once it has ended, if nothing follows it
    on its branch (a later turn was built on it). Raises NotRegenerableError saying which.
    """
    branch = await regeneration_branch(sessions, reply)
    history = [{"role": s.role, "content": s.content} for s in (*branch.history, branch.question)]
    return history, branch.question.id


async def regeneration_branch(sessions: Sessions, reply: Message) -> Branch:
    """What `reply` answered, to answer it again: its question and the branch before it; its
    window start is the one to keep (the same prompt again: a prefix-cache hit). Raises
    NotRegenerableError (see `regeneration_prompt`)."""
    tree = await _page_tree(
        sessions, reply, NotRegenerableError("only replies in the chat page can be regenerated")
    )
    if not reply.is_final:
        raise NotRegenerableError("this reply is still streaming: stop it first")
    if not tree.is_leaf(reply):
        raise NotRegenerableError("only the latest reply can be regenerated")
    said = as_said(tree.path(reply.parent_id))
    if reply.parent_id is None or not said or said[-1].role != MessageRole.USER:
        raise NotRegenerableError("there is no question before this reply to answer again")
    return Branch(said[:-1], said[-1], reply.window_start_id)


async def edit_prompt(sessions: Sessions, message: Message, content: str) -> list[dict[str, str]]:
    """The chat messages an edited version of the user's `message` makes: its branch up to it,
    then `content`. Raises NotEditableError for a message outside the chat page."""
    branch = await edit_branch(sessions, message, content, message.id)
    history = [{"role": s.role, "content": s.content} for s in branch.history]
    return [*history, {"role": "user", "content": content}]


async def edit_branch(
    sessions: Sessions, message: Message, content: str, question_id: UUID
) -> Branch:
    """The edited question (`content`, to be stored as `question_id`) after the branch before
    `message`. Raises NotEditableError for a message outside the chat page."""
    tree = await _page_tree(
        sessions, message, NotEditableError("only messages in the chat page can be edited")
    )
    path = tree.path(message.parent_id)
    question = Said(question_id, str(MessageRole.USER), content, None)
    return Branch(as_said(path), question, previous_window(path))
