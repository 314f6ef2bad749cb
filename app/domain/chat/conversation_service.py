"""A user's conversations as their pages see them: created, imported, renamed, filed (pinned or
archived), deleted and switched to another version, each change told, once committed, to every
open page of that user (app/domain/chat/push_events.py).

With ReplyService (a reply started or ended, a chat named by its first message), this is where
push events are published: the routes only call it, so every way in publishes the same events.
"""

from __future__ import annotations

from uuid import UUID

from app.db.session import Sessions
from app.domain.chat import branches, conversations, importing
from app.domain.chat.archive_schemas import ConversationExport
from app.domain.chat.models import Conversation
from app.domain.chat.push_events import (
    BranchShown,
    ConversationCreated,
    ConversationDeleted,
    ConversationFiled,
    ConversationRenamed,
    UserPush,
)
from app.domain.chat.schemas import ConversationChanges
from app.streaming.events import CancelCause
from app.streaming.manager import GenerationManager


class ConversationService:
    def __init__(self, sessions: Sessions, manager: GenerationManager, push: UserPush) -> None:
        self.sessions = sessions
        self.manager = manager
        self.push = push

    async def create(self, user_id: UUID, title: str | None) -> Conversation:
        created = await conversations.create_conversation(self.sessions, user_id, title)
        self.push.publish(user_id, ConversationCreated(str(created.id), created.title))
        return created

    async def import_export(self, user_id: UUID, export: ConversationExport) -> Conversation:
        """A JSON export as a new conversation of the user's (app/domain/chat/importing.py)."""
        imported = await importing.import_conversation(self.sessions, user_id, export)
        self.push.publish(user_id, ConversationCreated(str(imported.id), imported.title))
        return imported

    async def rename(self, user_id: UUID, conversation_id: UUID, title: str) -> Conversation:
        """The conversation as renamed (its title cleaned). Raises ConversationNotFoundError."""
        renamed = await conversations.rename_conversation(
            self.sessions, user_id, conversation_id, title
        )
        conversation = await conversations.get_conversation(self.sessions, user_id, conversation_id)
        if not renamed or conversation is None:
            raise conversations.ConversationNotFoundError(conversation_id)
        self.push.publish(user_id, ConversationRenamed(str(conversation_id), conversation.title))
        return conversation

    async def change(
        self, user_id: UUID, conversation_id: UUID, changes: ConversationChanges
    ) -> Conversation:
        """Rename, pin or unpin, archive or unarchive, as `changes` asks; the conversation as it
        is now. Raises ConversationNotFoundError (or PinnedAndArchivedError, before any write)."""
        if changes.pinned and changes.archived:
            raise conversations.PinnedAndArchivedError
        conversation = None
        if changes.title is not None:
            conversation = await self.rename(user_id, conversation_id, changes.title)
        if changes.pinned is not None or changes.archived is not None or conversation is None:
            conversation = await self.file(
                user_id, conversation_id, pinned=changes.pinned, archived=changes.archived
            )
        return conversation

    async def file(
        self,
        user_id: UUID,
        conversation_id: UUID,
        *,
        pinned: bool | None = None,
        archived: bool | None = None,
    ) -> Conversation:
        """Pin or unpin, archive or unarchive (conversations.file_conversation), told to the
        user's pages. Raises ConversationNotFoundError."""
        filed = await conversations.file_conversation(
            self.sessions, user_id, conversation_id, pinned=pinned, archived=archived
        )
        if filed is None:
            raise conversations.ConversationNotFoundError(conversation_id)
        if pinned is not None or archived is not None:
            self.push.publish(user_id, filed_event(filed))
        return filed

    async def show_branch(
        self, user_id: UUID, conversation_id: UUID, message_id: UUID
    ) -> branches.Thread:
        """Show the branch through `message_id` (branches.switch_branch); the user's other pages
        showing the conversation re-render it, so that each sends after what it shows."""
        thread = await branches.switch_branch(self.sessions, user_id, conversation_id, message_id)
        leaf = thread.conversation.current_leaf_id
        self.push.publish(
            user_id, BranchShown(str(conversation_id), None if leaf is None else str(leaf))
        )
        return thread

    async def delete(self, user_id: UUID, conversation_id: UUID) -> None:
        """Delete a conversation, then stop what it is still generating: after the delete, so
        that a reply whose turn a racing send wrote just before it is stopped too (its final
        write finds no row: a no-op). Raises ConversationNotFoundError."""
        deleted = await conversations.delete_conversation(self.sessions, user_id, conversation_id)
        owned = (str(conversation_id), str(user_id))
        for generation in self.manager.live():
            if (generation.conversation_id, generation.user_id) == owned:
                generation.cancel(CancelCause.USER)
        if not deleted:
            raise conversations.ConversationNotFoundError(conversation_id)
        self.push.publish(user_id, ConversationDeleted(str(conversation_id)))


def filed_event(c: Conversation) -> ConversationFiled:
    """Where the conversation now belongs in its owner's lists."""
    return ConversationFiled(
        str(c.id),
        c.title,
        c.updated_at.isoformat(),
        c.pinned_at.isoformat() if c.pinned_at else None,
        c.archived_at.isoformat() if c.archived_at else None,
    )
