"""Conversations and messages: what was asked, what was answered, and how each reply ended."""
