"""ENGINE=trtllm: TensorRT-LLM (>= 1.0, PyTorch backend) behind the engine contract, through its LLM
API (`engine.TrtLlmEngine`).

engine.py the adapter; setup.py finding and configuring TensorRT-LLM; limits.py the limits it
really enforces; errors.py its refusals and endings; stats.py its iteration stats; watch.py whether
its executor died; template.py the chat template and token counts. `tensorrt_llm` itself is
imported only when the engine starts.

TensorRT-LLM batches, schedules and manages the KV cache itself; this adapter turns its per-request
async streams into our events. What it relies on was read in NVIDIA/TensorRT-LLM's sources (1.0
and the newer releases; paths relative to `tensorrt_llm/`), cited where it is used; finding and
configuring TensorRT-LLM (version, sampler, worker process) is `setup`, what its refusals and
endings mean here `errors`, its iteration stats `stats`.

- the prompt is the model's chat template, tokenised once here (`add_special_tokens=False`: the
  template holds BOS already) and handed to `LLM.generate_async` as token ids, so TensorRT-LLM does
  not re-tokenise and `prompt_tokens` is what the model sees;
- `generate_async(ids, SamplingParams(...), streaming=True)` is called on the running event loop
  (executor/result.py: a result made without a running loop has no async queue and cannot be
  iterated) and followed by one task per request;
- `max_tokens` is always set (SamplingParams defaults to 32) and cut to what the context has room
  for, against the limits TensorRT-LLM really enforces (`limits`: the model engine may lower
  `max_seq_len`; without chunked prefill a prompt may not pass `max_num_tokens`). A prompt over
  them is refused here, with the real limit. A reply cut by the context ends with `length`;
- admission is ours, fair across owners (app/engine/fair_queue.py, as on the other engines): at
  most `max_batch_size` requests are in TensorRT-LLM at once, whose own queue is first come first
  served (py_executor.py); the rest wait here, and the next one in goes to the owner with the
  fewest running. A request is handed to `generate_async` when it is admitted, at once when a
  slot is free, so that what TensorRT-LLM refuses on the spot is a 400;
- with a worker process, what the worker refuses comes back on the request's stream (executor/
  worker.py `worker_main` sends an `ErrorResponse`; result.py raises it as `RequestError`): an
  error before the first token is a refusal (the reply ends `error` saying why, with the real limit
  where it is one, learnt for later requests), after it a failure (`error`, the text so far kept);
- each request is salted with its owner where `generate_async` takes `cache_salt`, and block reuse
  is off where it does not (`setup.cache_options`): no owner gets a faster first token from
  another's prompt;
- stop strings stay ours: `IncrementalDetokenizer` holds back a possible stop-string prefix exactly
  as on the CPU engines; on a stop string the reply ends with `stop` and the TensorRT-LLM request is
  aborted;
- Stop: `RequestOutput.abort()`. A request TensorRT-LLM has already answered ends with the final
  `cancelled` response it sends at its next iteration (ABORT_GRACE_S at the latest). One it has not
  answered yet may still sit in the executor's waiting queue, and such a request is dropped with
  no response at all (_torch/pyexecutor/py_executor.py `_handle_canceled_requests` ->
  `update_waiting_queue`): it ends `cancelled` at once, with no tokens, and whatever TensorRT-LLM
  still sends for it is drained and ignored. One still waiting here just leaves the queue;
- a dead executor (the worker process killed, a CUDA fault: `watch`) leaves its requests without
  a final response forever: the engine looks every WATCH_S, ends every open reply `error` (their
  text is kept by the layers above), reports itself unavailable (`stats().unavailable`, so
  /readyz answers 503 with the reason) and builds a new LLM, retrying with backoff;
- refusals become `EngineError` / `PromptTooLongError` (a 400), a shut-down LLM
  `EngineUnavailableError` (see `errors`).

`kv_cells` and the step settings (`step_stretch`, `max_step_tokens`) do not apply (TensorRT-LLM
sizes its KV cache from free GPU memory and schedules tokens itself); `max_seqs` becomes
`max_batch_size`, `context_size` `max_seq_len`. `stats()`: `running` is our requests in flight,
`waiting` those queued here and in TensorRT-LLM; KV use comes from TensorRT-LLM's iteration
stats (see `stats`).
"""
