"""ENGINE=openai: the contract over OpenAI-compatible inference servers (`engine.OpenAIRemoteEngine`).

engine.py requests, Stop and failover; upstreams.py routing; health.py health checks; stream.py the
wire format; sampling.py each server's names for the sampling fields; request.py one request's
state.
"""
