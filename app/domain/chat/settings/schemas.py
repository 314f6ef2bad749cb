"""The chat settings' wire shapes: what the settings panel sends and is answered (msgspec)."""

from __future__ import annotations

import msgspec

from app.domain.chat.schemas import ReplyOptions


class ChatSettings(ReplyOptions, kw_only=True):
    """A system prompt and sampling settings; a sampling field left null takes the default."""

    system_prompt: str = ""

    def options(self) -> ReplyOptions:
        """The sampling part alone."""
        return ReplyOptions(**{f: getattr(self, f) for f in ReplyOptions.__struct_fields__})

    def given(self) -> dict[str, object]:
        """The sampling fields that are set, as stored (JSON)."""
        return {k: v for k, v in msgspec.structs.asdict(self.options()).items() if v is not None}


class SettingsView(msgspec.Struct):
    """Settings as stored, and what a null field means (the model's defaults, max_tokens included),
    so that the panel can show them."""

    settings: ChatSettings
    model_defaults: ReplyOptions
