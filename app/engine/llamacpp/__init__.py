"""ENGINE=llamacpp: llama.cpp on the CPU with continuous batching (`engine.LlamaCppEngine`).

engine.py the contract's side on the event loop; loop.py the stepping thread; scheduler.py admission
and chunked prefill; step_clock.py prompt chunks sized by time; prefix_cache.py reused cells;
sampling.py numpy sampling; native.py the C API; model_files.py where the GGUF comes from.
Nothing is imported here, so that `model_files` can be used without loading llama.cpp.
"""
