"""ENGINE=synthetic: the contract without a model, for load tests (`engine.SyntheticEngine`).

engine.py the stepping; text.py and markdown.py the deterministic replies.
"""
