"""Starting, finding and stopping replies: the glue between the chat rows and the streaming core.

Order matters for "nothing half-written", and the manager keeps it (`GenerationManager.start_reply`):
the engine validates the prompt first (a prompt over the context is refused before any row
exists), then the user message and the `streaming` assistant row are written in one transaction,
and only then does the reply start pumping. If the write fails, the engine request is aborted.

A send is one transaction from its first read to that write (`send`): one query reads the user
(and their quotas: no second read when no limit applies), the conversation, its settings and the
branch on screen, the engine checks the prompt, two statements write the turn. Each round trip
saved is taken off the time-to-first-token of every request queued behind it in a burst
(bench/setup_cost.py, bench/serving_overhead.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from uuid import UUID, uuid4

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.session import Sessions, transaction
from app.domain.chat.conversations import branches
from app.domain.chat.conversations import store as conversations
from app.domain.chat.models import Message, MessageRole
from app.domain.chat.prompts import fitting
from app.domain.chat.prompts import turns as prompts
from app.domain.chat.push.events import ConversationRenamed, UserPush
from app.domain.chat.replies import rows as reply_rows
from app.domain.chat.replies import turn_rows
from app.domain.chat.replies.errors import NotFoundError, TooManyRepliesError
from app.domain.chat.replies.limits import ReplyLimits
from app.domain.chat.schemas import (
    CancelReply,
    ReplyOptions,
    ResumeReply,
    SendMessage,
    SendTurn,
    StopResult,
)
from app.domain.chat.settings import service as chat_settings
from app.domain.errors import ContextLengthExceededError, EngineRefusedError, UnavailableError
from app.domain.quotas.service import Overrides, Quotas, reply_bound
from app.engine.base import EngineError, EngineUnavailableError, PromptTooLongError, SamplingParams
from app.streaming.events import CancelCause, StreamEvent
from app.streaming.generation import Generation
from app.streaming.manager import GenerationManager, Persist, ReplyRequest, ReplyRows
from app.streaming.poller import ReplyPoller
from app.streaming.subscriber import live_events


@dataclass(frozen=True, slots=True)
class ReplyEvents:
    """One client's view of a reply: its id, and its events from `ReplyService.reply_events` (None: idle,
    send a heartbeat), which the transport frames (app/domain/chat/replies/frames.py)."""

    message_id: str
    events: AsyncGenerator[StreamEvent | None, None]  # what `reply_events`, a generator, returns


class ReplyService:
    """The one entry to replies for every transport: `send`, `regenerate`, `edit`, `resume` and
    `cancel` take the protocol's request structs and raise domain errors only (each transport
    answers those through the app's one map, app/domain/refusals.py)."""

    def __init__(
        self,
        sessions: Sessions,
        manager: GenerationManager,
        *,
        limits: ReplyLimits,
        keepalive_s: float,
        page_grace_s: float,
        api_grace_s: float,
        replica_id: str | None = None,
        max_replies_per_user: int = 0,
        push: UserPush | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        """`keepalive_s`: how long a reply's stream may say nothing before a heartbeat.
        `max_replies_per_user`: live replies (running or queued in the engine) one user may have
        in this process; 0 for no limit.
        `push`: where the user's pages hear of a page reply that starts (and ends), and of a
        chat its first message names.
        `quotas`: the users' token quotas, reserved as each reply starts (None: not counted)."""
        self.sessions = sessions
        self.manager = manager
        self.limits = limits
        self.keepalive_s = keepalive_s
        self.grace_by_source = {"page": page_grace_s, "api": api_grace_s}
        self.elsewhere = ReplyPoller(manager.ledger, grace_s=page_grace_s)
        self.replica_id = replica_id
        self.max_replies_per_user = max_replies_per_user
        self._starting: Counter[str] = Counter()  # replies past the check, not yet live
        self.push = push
        self.quotas = quotas

    @contextlib.contextmanager
    def _reply_slot(self, user_id: UUID) -> Iterator[None]:
        """Hold one of the user's reply slots while a reply starts, or raise TooManyRepliesError.

        Checked and taken without an await in between, so concurrent sends cannot both slip in;
        once the reply is live (`_launch`) the manager counts it and the hold is let go."""
        key = str(user_id)
        limit = self.max_replies_per_user
        if limit > 0:
            # still generating (an ended reply whose end is being saved holds no engine slot)
            live = sum(1 for g in self.manager.live() if g.user_id == key and g.outcome is None)
            if live + self._starting[key] >= limit:
                raise TooManyRepliesError(limit)
        self._starting[key] += 1
        try:
            yield
        finally:
            self._starting[key] -= 1
            if self._starting[key] <= 0:
                del self._starting[key]

    @property
    def model_name(self) -> str:
        return self.manager.engine.model_name

    # -- the transports' API ---------------------------------------------------------------------

    async def send(
        self, user_id: UUID, conversation_id: UUID, request: SendTurn, *, transport: str
    ) -> ReplyEvents:
        """Add the user's message to their conversation, after `request.parent_id` (the end of
        the branch on the sender's screen; None: the branch shown), and stream the reply from its
        start.

        One transaction, in `_launch`'s order: the conversation with its settings and the branch
        on screen are read (one query, which also checks that the session's user still exists
        and reads their quotas), the engine accepts the prompt, then the turn's
        rows are written and committed in `write`, so that a failing commit aborts the engine
        request too. On SQLite the read takes no lock: Python's sqlite3 opens a transaction only
        before the first INSERT/UPDATE/DELETE (its default "legacy transaction control", which
        SQLAlchemy keeps: sqlalchemy/dialects/sqlite/base.py, "Legacy Transaction Mode"), so the
        write transaction starts with `write_turn`'s UPDATE."""
        async with self.sessions(expire_on_commit=False) as session:
            turn = await prompts.next_turn(session, user_id, conversation_id, request.parent_id)
            content = self.limits.content(request.content)
            options = chat_settings.turn_options(request, turn.settings)
            params = self.limits.sampling(options, self.manager.engine.context_size)
            branch, system_prompt = turn.branch(content, uuid4()), turn.settings.system_prompt
            window = fitting.fit_branch(self.manager.engine, branch, system_prompt, params)

            async def write(request_id: str) -> ReplyRows:
                question, reply, title = await turn_rows.write_turn(
                    session,
                    conversation_id,
                    content,
                    self.model_name,
                    parent_id=turn.parent_id,
                    engine_request_id=request_id,
                    replica_id=self.replica_id,
                    title_if_untitled=content if turn.untitled else None,
                    window=window,
                )
                await session.commit()
                if title is not None and self.push is not None:  # named by this first message
                    self.push.publish(user_id, ConversationRenamed(str(conversation_id), title))
                return _rows(reply, question.id)

            launch = (user_id, str(turn.source), window.messages, params, write, session)
            generation = await self._launch(*launch, turn.quota_overrides)
        return self._from_start(generation, transport)

    async def regenerate(
        self, user_id: UUID, message_id: UUID, options: ReplyOptions, *, transport: str
    ) -> ReplyEvents:
        """Answer the latest reply's question again: a new version of the reply, shown from now on
        (the old one stays, a version away)."""
        try:
            generation = await self._regenerate(user_id, message_id, options)
        except conversations.ConversationNotFoundError as exc:  # deleted meanwhile, with it
            raise NotFoundError(message_id) from exc
        return self._from_start(generation, transport)

    async def edit(
        self, user_id: UUID, message_id: UUID, request: SendMessage, *, transport: str
    ) -> ReplyEvents:
        """Send a new version of one of the user's questions; its reply streams from its start
        (the old question and its replies stay, a version away)."""
        content = self.limits.content(request.content)
        try:
            generation = await self._edit(user_id, message_id, content, request)
        except conversations.ConversationNotFoundError as exc:  # deleted meanwhile, with it
            raise NotFoundError(message_id) from exc
        return self._from_start(generation, transport)

    async def resume(self, user_id: UUID, request: ResumeReply, *, transport: str) -> ReplyEvents:
        """What the client missed since offset `after`, then the rest live (or as stored)."""
        reply = await self.find(user_id, request.message_id)
        events = self.reply_events(
            reply, transport=transport, after=max(0, request.after), keepalive_s=self.keepalive_s
        )
        return ReplyEvents(str(request.message_id), events)

    async def cancel(self, user_id: UUID, request: CancelReply, wait_s: float) -> StopResult:
        """The user's Stop (idempotent): the reply's status once its end is saved, or after
        `wait_s` (0: do not wait; the reply's own stream carries its end)."""
        reply = await self.find(user_id, request.message_id)
        status = await self.stop(reply, CancelCause.USER, wait_s)
        return StopResult(message_id=str(request.message_id), status=status)

    def _from_start(self, generation: Generation, transport: str) -> ReplyEvents:
        events = self.reply_events(
            generation, transport=transport, after=0, keepalive_s=self.keepalive_s
        )
        return ReplyEvents(generation.message_id, events)

    # -- starting and finding replies --------------------------------------------------------------

    async def start_api_call(
        self, user_id: UUID, messages: list[dict[str, str]], params: SamplingParams
    ) -> Generation:
        """A `/v1` call (the client's whole message list): once the engine accepts it, its `api`
        conversation, question and streaming reply in one transaction. Raises EngineRefusedError (or
        TooManyRepliesError) before writing anything."""

        async def write(request_id: str) -> ReplyRows:
            async with transaction(self.sessions) as session:
                question, reply = await turn_rows.write_api_call(
                    session,
                    user_id,
                    messages[-1]["content"],
                    self.model_name,
                    engine_request_id=request_id,
                    replica_id=self.replica_id,
                )
            return _rows(reply, question.id)

        return await self._launch(user_id, "api", messages, params, write)

    async def _regenerate(
        self, user_id: UUID, message_id: UUID, options: ReplyOptions
    ) -> Generation:
        """Answer a reply's question again; the new reply is a new version next to the old one.

        Same order as `send` (`_launch`): the engine accepts the prompt before any row changes.
        Raises NotFoundError, reply_rows.NotRegenerableError, TooManyRepliesError or
        EngineRefusedError before writing anything."""
        old = await conversations.get_message(self.sessions, user_id, message_id)
        if old is None or old.role is not MessageRole.ASSISTANT:
            raise NotFoundError(message_id)
        chosen = await chat_settings.for_conversation(self.sessions, old.conversation_id)
        options = chat_settings.turn_options(options, chosen)
        params = self.limits.sampling(options, self.manager.engine.context_size)
        branch = await prompts.regeneration_branch(self.sessions, old)
        window = fitting.fit_branch(self.manager.engine, branch, chosen.system_prompt, params)

        async def write(request_id: str) -> ReplyRows:
            reply = await branches.add_sibling_reply(
                self.sessions,
                old,
                self.model_name,
                engine_request_id=request_id,
                replica_id=self.replica_id,
                window=window,
            )
            return _rows(reply, window.question_id)

        return await self._launch(user_id, "page", window.messages, params, write)

    async def _edit(
        self, user_id: UUID, message_id: UUID, content: str, options: ReplyOptions
    ) -> Generation:
        """The edited question and its reply, in `send`'s order (`_launch`), with the conversation's
        settings like any turn. Raises NotFoundError, branches.NotEditableError,
        TooManyRepliesError or EngineRefusedError before writing anything."""
        edited = await conversations.get_message(self.sessions, user_id, message_id)
        if edited is None or edited.role is not MessageRole.USER:
            raise NotFoundError(message_id)
        chosen = await chat_settings.for_conversation(self.sessions, edited.conversation_id)
        options = chat_settings.turn_options(options, chosen)
        params = self.limits.sampling(options, self.manager.engine.context_size)
        branch = await prompts.edit_branch(self.sessions, edited, content, uuid4())
        window = fitting.fit_branch(self.manager.engine, branch, chosen.system_prompt, params)

        async def write(request_id: str) -> ReplyRows:
            question, reply = await branches.add_edited_turn(
                self.sessions,
                edited,
                content,
                self.model_name,
                engine_request_id=request_id,
                replica_id=self.replica_id,
                window=window,
            )
            return _rows(reply, question.id)

        return await self._launch(user_id, "page", window.messages, params, write)

    async def _launch(
        self,
        user_id: UUID,
        source: str,
        messages: list[dict[str, str]],
        params: SamplingParams,
        persist: Persist,
        session: AsyncSession | None = None,
        overrides: Overrides | None = None,
    ) -> Generation:
        """The manager starts the reply (`GenerationManager.start_reply`): the engine accepts the
        prompt (or EngineRefusedError is raised), then `persist(request_id)` writes the turn; a
        write that fails aborts the engine request, so nothing is left half-done on either side.
        `session`: the one `persist` writes in, if any (the quota is reserved in it too), where
        the user's own quotas were read (`overrides`: no quota read when no limit applies)."""
        if not self.manager.accepting:
            raise UnavailableError("the server is shutting down: try again in a moment")
        grace_s = self.grace_by_source.get(source, 0.0)
        request = ReplyRequest(messages, params, str(user_id), source, grace_s)
        with self._reply_slot(user_id):  # may raise TooManyRepliesError
            admitted = None
            if self.quotas is not None:  # may raise QuotaExceededError
                bound = reply_bound(messages, params.max_tokens, self.manager.engine.context_size)
                admitted = await self.quotas.admit(user_id, bound, persist, session, overrides)
                persist = admitted.persist
            try:
                generation = await self.manager.start_reply(request, persist)
            except BaseException as exc:
                if admitted is not None:  # the reply never started: nothing to count
                    await admitted.release()
                if isinstance(exc, EngineUnavailableError):  # the engine's, in the domain's terms
                    raise UnavailableError(str(exc)) from exc
                if isinstance(exc, PromptTooLongError):
                    raise context_refusal(exc) from exc
                if isinstance(exc, EngineError):
                    raise EngineRefusedError(str(exc)) from exc
                raise
            if admitted is not None:  # settled with its final save (no await since the start)
                admitted.hold(generation.message_id)
        if self.push is not None and source == "page":  # its rows are committed: tell the others
            self.push.reply_started(generation)
        return generation

    async def find(self, user_id: UUID, message_id: UUID) -> Generation | Message:
        """A user's reply: live in this process, or as stored. Raises NotFoundError otherwise."""
        message = await conversations.get_message(self.sessions, user_id, message_id)
        if message is None or message.role is not MessageRole.ASSISTANT:
            raise NotFoundError(message_id)
        live = self.manager.get(str(message_id))
        return live if live is not None else message

    def reply_events(
        self, reply: Generation | Message, *, transport: str, after: int, keepalive_s: float
    ) -> AsyncGenerator[StreamEvent | None, None]:
        """Start, what was missed since offset `after`, then live deltas, then Final. None means "nothing to say for keepalive_s": the transport sends a heartbeat.
        A reply that is not live here is read from the database (`ReplyPoller`): a finished one replays to
        its end; one still streaming elsewhere (another replica) is polled until it ends."""
        if isinstance(reply, Generation):
            return live_events(reply, transport=transport, after=after, keepalive_s=keepalive_s)
        return self.elsewhere.events(
            reply_rows.stored_outcome(reply),
            conversation_id=str(reply.conversation_id),
            after=after,
            keepalive_s=keepalive_s,
        )

    async def stop(
        self,
        reply: Generation | Message,
        cause: CancelCause = CancelCause.USER,
        wait_s: float = 5.0,
    ) -> str:
        """Stop a reply wherever it runs (idempotent); returns its status once the end is saved.

        Live here: abort it, and answer once its end is saved, or after `wait_s` with the end
        status it has in memory (its save is then still being retried: see
        app/streaming/saving.py). Ended here but not saved yet: its end status, at once.
        Streaming on another replica: ask over the cancel channel and watch the database for its
        end. Already finished: nothing to do."""
        if isinstance(reply, Generation):
            if reply.outcome is None:
                reply.cancel(cause)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reply.wait_done(), wait_s)
            return reply.status.value
        if reply.is_final:
            return str(reply.status)
        return await self.elsewhere.stop(str(reply.id), cause, wait_s)


def context_refusal(exc: PromptTooLongError) -> ContextLengthExceededError:
    # The context holds the prompt and the reply; an engine's other prompt limits (TensorRT-LLM's
    # max_num_tokens: app/engine/trtllm/limits.py) hold the prompt alone.
    reply_room = type(exc) is PromptTooLongError
    return ContextLengthExceededError(
        str(exc), exc.prompt_tokens, exc.context_size, reply_room=reply_room
    )


def _rows(reply: Message, question_id: UUID) -> ReplyRows:
    return ReplyRows(str(reply.id), str(reply.conversation_id), str(question_id))
