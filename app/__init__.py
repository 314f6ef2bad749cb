"""streamchat: a browser chat that streams an LLM's reply token by token."""
