"""ENGINE=trtllm: TensorRT-LLM's LLM API behind the contract (`engine.TrtLlmEngine`).

engine.py the adapter; setup.py finding and configuring TensorRT-LLM; errors.py its refusals and
endings; stats.py its iteration stats. `tensorrt_llm` itself is imported only when the engine starts.
"""
