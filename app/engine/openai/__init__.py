"""ENGINE=openai: the contract over OpenAI-compatible inference servers (`engine.OpenAIRemoteEngine`).

engine.py requests, Stop and failover; upstreams.py routing; health.py health checks; stream.py the
wire format; request.py one request's state.
"""
