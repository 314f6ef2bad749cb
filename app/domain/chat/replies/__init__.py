"""Replies: started, resumed and stopped; the reply row's life, its frames and its errors."""
