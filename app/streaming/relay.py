"""The receiving end of the cross-replica relay: an action another replica published for a reply
that may be live here (the sending end is the `ReplyLedger`'s `publish`: app/streaming/ledger.py)."""

from __future__ import annotations

import logging

from app.streaming.events import CancelCause
from app.streaming.ledger import ATTACH
from app.streaming.manager import GenerationManager

log = logging.getLogger(__name__)


def receive(manager: GenerationManager, message_id: str, action: str) -> None:
    """Apply `action` (ATTACH or a CancelCause's value) if the reply is live here; else nothing:
    every replica hears every action, and only the one running the reply acts."""
    if action == ATTACH:
        generation = manager.get(message_id)
        if generation is not None:
            generation.attached_elsewhere()
        return
    try:
        cause = CancelCause(action)
    except ValueError:  # not a cause this version knows (a mixed-version roll-out)
        log.warning("ignoring a cancel with unknown cause %r", action)
        return
    manager.cancel(message_id, cause)
