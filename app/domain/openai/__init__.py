"""The OpenAI-compatible API (`/v1`), so that standard clients work unchanged."""
