"""Users, passwords and API keys."""
