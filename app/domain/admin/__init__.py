"""The admin console: every user's conversations, live generations with a kill switch, charts."""
