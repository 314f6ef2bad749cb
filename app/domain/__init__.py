"""The domain: conversations and messages, users and API keys. Each package holds its models and
the service functions the web layer and the streaming core call."""
