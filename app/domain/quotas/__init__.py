"""Per-user token quotas: limits per UTC day and month, counted from the engine's own usage.

- `models`: the per-user, per-day counter (`quota_usage`);
- `counter`: its SQL: the read a check needs, the conditional reservation, the settling upsert;
- `service`: the limits in force (settings' defaults, each user's overrides), the refusal, and
  the book of reservations held by this process's live replies (settled with their final save).
"""
