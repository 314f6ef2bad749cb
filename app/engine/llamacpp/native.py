"""The llama.cpp C API, as the engine loop uses it: one model, one context, one reusable batch.

Everything that touches a raw pointer lives here, so the scheduler and the engine deal in Python
ints and lists. The objects are not thread-safe: the engine's loop thread is their only user once
the engine runs (tokenising and reading the vocabulary, which only read the immutable model, are the
exception and may run on the event loop thread). ctypes releases the GIL for the duration of every
C call, which is what lets `llama_decode` run while the event loop serves sockets.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

if "OMP_WAIT_POLICY" not in os.environ:
    # The llama.cpp wheel is built with OpenMP, whose threads meet at a barrier after each of the
    # ~900 graph nodes of a step. libgomp spins up to 300,000 times there before sleeping: free on
    # an idle machine, ruinous when the cores are shared (replicas, test suites, the event loop
    # thread), because a spinning thread burns the time slice its partner needs. Measured on the
    # 2-core dev box with two busy processes beside it: default spin, ~100 small steps did not
    # finish in 100 s; 1,000 spins, 34 ms per single-token step (passive: 20 ms). Idle, 1,000
    # spins is as fast as the default (~10 ms) while passive waiting costs 2.5x. Must be set
    # before libgomp loads (the import below); an operator's GOMP_SPINCOUNT/OMP_WAIT_POLICY wins.
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")

import llama_cpp as C
import numpy as np

log = logging.getLogger(__name__)
_native_log = logging.getLogger("app.engine.llamacpp.native")

# ggml log levels: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous line
_LEVELS = {
    1: logging.DEBUG,
    2: logging.DEBUG,
    3: logging.WARNING,
    4: logging.ERROR,
}  # info is chatter
_last_level = logging.DEBUG
_EXPECTED_WARNINGS = (
    # with a unified KV pool llama.cpp compares the whole pool to the trained context; the engine
    # itself caps each sequence at min(context_size, n_ctx_train)
    b"n_ctx_seq (",
)


# The KV window a step's attention walks (llama.cpp's `n_kv`) is not in the C API. With
# LLAMA_KV_CACHE_DEBUG=1, `llama_kv_cache::find_slot` logs, for every ubatch it places (one line
# per KV stream in it), "find_slot: stream[S], n = N, used = U, head = H, size = Z, ..." where N
# is `used_max_p1()`: the highest occupied cell + 1 (src/llama-kv-cache.cpp). `get_n_kv` then
# walks min(Z, max(256, N rounded up to 256)) cells. Only levels above 1 also dump cell maps.
_FIND_SLOT = re.compile(rb"^find_slot: stream\[\d+\], n = *(\d+), .*size = *(\d+)")
_KV_PAD = 256  # get_n_kv's rounding: max(n_pad, 256)
_window = threading.local()  # per loop thread: the log callback runs inside its llama_decode


def walked_cells(used_max_p1: int, size: int) -> int:
    """The cells one query walks (`llama_kv_cache::get_n_kv`) given the highest occupied cell."""
    padded = -(-used_max_p1 // _KV_PAD) * _KV_PAD
    return min(size, max(_KV_PAD, padded))


@C.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    """Route llama.cpp's chatter (hundreds of lines per model load) into `logging`, quietly;
    keep find_slot's KV window reading (see `_FIND_SLOT`) for the decode that logged it."""
    global _last_level
    if level == 1 and text.startswith(b"find_slot") and (m := _FIND_SLOT.match(text)):
        walked = walked_cells(int(m[1]), int(m[2]))
        if walked > getattr(_window, "walked", 0):
            _window.walked = walked
        return
    py_level = _last_level if level == 5 else _LEVELS.get(level, logging.DEBUG)
    _last_level = py_level
    if py_level >= logging.WARNING and any(m in text for m in _EXPECTED_WARNINGS):
        py_level = logging.DEBUG
    if _native_log.isEnabledFor(py_level):
        _native_log.log(py_level, "%s", text.decode("utf-8", "replace").rstrip("\n"))


_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        C.llama_log_set(_log_callback, ctypes.c_void_p(0))
        C.llama_backend_init()
        _backend_ready = True


UBATCH = 512
"""The most tokens llama.cpp computes in one graph (`n_ubatch`, llama-server's default too)."""

EXACT_ROWS = 63
"""The most query rows of an EXACT graph: one whose logits for a sequence do not depend on the
other sequences in the pool. With 64 or more query rows, ggml's CPU flash attention switches to a
tiled kernel whose rounding depends on which other sequences share the tile, so a greedy reply
would change with the load. Below that, flash attention walks each query's KV cells one by one and
skips other sequences' cells exactly, so a sequence's logits are bit-for-bit the same alone or
batched (see `tests/engine/test_llamacpp.py`). (Without flash attention, the masked softmax and the
V product run over the whole shared window and do differ with the batch: hence flash_attn=True.)

At the other end, a graph of exactly ONE query row takes a split-KV kernel once the KV window
(`n_kv`: the highest occupied cell of the whole pool, rounded up to 256) reaches 512 cells: each
thread sums a slice of the window and the slices are merged, so where the slices cut depends on
the window, i.e. on what OTHER requests (and prefix-cache entries) occupy. A lone sequence's
greedy reply would then change with everyone else's traffic (ggml/src/ggml-cpu/ops.cpp,
`ggml_compute_forward_flash_attn_ext_f16`: `use_split_kv_path = ... neq1 == 1 ... nek1 >= 512`).

So an exact step is decoded in graphs of 2 to EXACT_ROWS rows (`NativeModel.decode(max_rows=)`),
and a lone token gets a pad token beside it: see `PAD_TOKEN_POS` and `StepLoop._decode`
(app/engine/llamacpp/loop.py), which asks for exactness only where a greedy reply needs it."""

PAD_TOKEN_POS = 0
"""Where the engine's pad token sits in its own scratch sequence (dropped again after the step)."""


def exact_slices(n_tokens: int, max_rows: int) -> list[tuple[int, int]]:
    """Cut `n_tokens` into consecutive graphs of at most `max_rows` and never exactly one row
    (a one-row remainder borrows a row from the graph before it)."""
    slices = list(pairwise([*range(0, n_tokens, max_rows), n_tokens]))
    if len(slices) > 1 and slices[-1][1] - slices[-1][0] == 1:
        (a, b), (_, c) = slices[-2], slices[-1]
        slices[-2:] = [(a, b - 1), (b - 1, c)]
    return slices


class DecodeError(RuntimeError):
    """llama_decode refused or failed a batch."""


def _check(rc: int) -> None:
    if rc != 0:
        reason = {1: "no free KV cells for the batch", 2: "aborted", -1: "invalid batch"}
        raise DecodeError(f"llama_decode returned {rc}: {reason.get(rc, 'fatal error')}")


@dataclass(frozen=True, slots=True)
class ContextConfig:
    kv_cells: int  # n_ctx: KV cells in all (kv_unified: shared by every sequence)
    max_seqs: int  # n_seq_max: distinct sequence ids (kv_unified False: one stream each)
    batch_tokens: int  # n_batch: the most tokens one step may submit
    threads: int  # n_threads and n_threads_batch
    flash_attn: bool
    kv_unified: bool = True  # False: a KV stream per sequence id, n_ctx / n_seq_max cells each


class StepBatch:
    """One `llama_batch`, allocated once and refilled every step.

    Typed views over the C arrays let a whole step's tokens, positions and output flags be written
    with a few slice assignments instead of one ctypes call per field per token.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw = C.llama_batch_init(capacity, 0, 1)
        raw = self.raw
        self._tokens = (ctypes.c_int32 * capacity).from_address(
            ctypes.addressof(raw.token.contents)
        )
        self._pos = (ctypes.c_int32 * capacity).from_address(ctypes.addressof(raw.pos.contents))
        self._outputs = (ctypes.c_int8 * capacity).from_address(
            ctypes.addressof(raw.logits.contents)
        )
        n_seq = (ctypes.c_int32 * capacity).from_address(ctypes.addressof(raw.n_seq_id.contents))
        n_seq[:] = [1] * capacity
        self._seq_slots = [raw.seq_id[i] for i in range(capacity)]
        self.tokens: list[int] = []
        self.positions: list[int] = []
        self.seq_ids: list[int] = []
        self.outputs: list[int] = []

    def clear(self) -> None:
        self.tokens.clear()
        self.positions.clear()
        self.seq_ids.clear()
        self.outputs.clear()

    def add_run(self, tokens: list[int], start_pos: int, seq_id: int, last_output: bool) -> int:
        """Append consecutive tokens of one sequence; returns the batch index of the last one."""
        n = len(tokens)
        self.tokens.extend(tokens)
        self.positions.extend(range(start_pos, start_pos + n))
        self.seq_ids.extend([seq_id] * n)
        self.outputs.extend([0] * (n - 1))
        self.outputs.append(1 if last_output else 0)
        return len(self.tokens) - 1

    def __len__(self) -> int:
        return len(self.tokens)

    def commit(self) -> None:
        """Copy the Python lists into the C batch."""
        n = len(self.tokens)
        if n > self.capacity:
            raise DecodeError(f"step holds {n} tokens, batch capacity is {self.capacity}")
        self._tokens[:n] = self.tokens
        self._pos[:n] = self.positions
        self._outputs[:n] = self.outputs
        slots = self._seq_slots
        for i, seq_id in enumerate(self.seq_ids):
            slots[i][0] = seq_id
        self.raw.n_tokens = n

    def view(self, start: int, end: int) -> C.llama_batch:
        """A `llama_batch` over tokens [start, end) of the committed batch: the same arrays, offset."""
        raw, view = self.raw, C.llama_batch()
        view.n_tokens = end - start

        def at(field: str, ptr_type: type) -> Any:
            base = ctypes.cast(getattr(raw, field), ctypes.c_void_p).value or 0
            size = ctypes.sizeof(getattr(raw, field)._type_)
            return ctypes.cast(ctypes.c_void_p(base + start * size), ptr_type)

        view.token = at("token", type(raw.token))
        view.pos = at("pos", type(raw.pos))
        view.n_seq_id = at("n_seq_id", type(raw.n_seq_id))
        view.seq_id = at("seq_id", type(raw.seq_id))
        view.logits = at("logits", type(raw.logits))
        return view

    def free(self) -> None:
        if self.raw is not None:
            C.llama_batch_free(self.raw)
            self.raw = None


class NativeModel:
    """A loaded GGUF with one context whose KV cache all sequences share."""

    def __init__(self, path: Path, config: ContextConfig) -> None:
        _init_backend()
        self.path = path
        self.config = config
        self.model = None
        self.ctx = None
        self.batch: StepBatch | None = None
        mparams = C.llama_model_default_params()
        mparams.n_gpu_layers = 0
        # Weights as they are, never repacked into ggml's "extra" CPU buffer types. On a CPU with
        # Intel AMX (Sapphire Rapids on), a native build repacks them for its AMX kernels, and
        # `ggml_backend_amx_mul_mat` crashes the process on the first batch of more than a few
        # tokens (seen on this project's machines with SmolLM2's Q4_1, whatever the context
        # settings; an open llama.cpp bug, ggml-org/llama.cpp#20824). `use_extra_bufts = false`
        # (include/llama.h) keeps the plain CPU kernels; llama.cpp's own binaries take
        # `--no-repack` for the same (common/arg.cpp), so tests/llama_server.py passes it too.
        mparams.use_extra_bufts = False
        self.model = C.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path} (is it a GGUF model file?)")
        try:
            self.vocab = C.llama_model_get_vocab(self.model)
            self.n_vocab = C.llama_vocab_n_tokens(self.vocab)
            self.n_ctx_train = C.llama_model_n_ctx_train(self.model)
            # read once, by llama_kv_cache's constructor: its one-line-per-ubatch find_slot
            # report (`_FIND_SLOT`); an operator's own setting (its cell maps) wins, and ours is
            # gone again before any child process could inherit it
            ours = "LLAMA_KV_CACHE_DEBUG" not in os.environ
            if ours:
                os.environ["LLAMA_KV_CACHE_DEBUG"] = "1"
            try:
                self.ctx = C.llama_init_from_model(self.model, self._context_params(config))
            finally:
                if ours:
                    del os.environ["LLAMA_KV_CACHE_DEBUG"]
            if not self.ctx:
                raise RuntimeError("llama.cpp could not create a context (out of memory?)")
            self.memory = C.llama_get_memory(self.ctx)
            self.n_ctx = C.llama_n_ctx(self.ctx)
            self.batch = StepBatch(config.batch_tokens)
        except BaseException:
            self.close()
            raise
        self.bos = C.llama_vocab_bos(self.vocab)
        self.eos = C.llama_vocab_eos(self.vocab)
        self.add_bos = bool(C.llama_vocab_get_add_bos(self.vocab))
        self.pad_token = self.bos if self.bos >= 0 else 0  # any valid id will do
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._piece_buf = ctypes.create_string_buffer(256)
        self._row_type = ctypes.c_float * self.n_vocab
        self._copied: dict[int, np.ndarray] | None = None  # logits kept by a sliced decode
        # KV cells the widest graph of the last decode walked per query (llama.cpp's n_kv, as
        # find_slot reported it before placing the graph's own tokens); 0 before any decode
        self.kv_walked = 0

    @staticmethod
    def _context_params(config: ContextConfig) -> C.llama_context_params:
        params = C.llama_context_default_params()
        params.n_ctx = config.kv_cells
        params.n_batch = config.batch_tokens
        params.n_ubatch = min(config.batch_tokens, UBATCH)
        params.n_seq_max = config.max_seqs
        params.kv_unified = config.kv_unified  # True: one pool, any sequence may use any cell
        params.n_threads = config.threads
        params.n_threads_batch = config.threads
        params.flash_attn_type = (
            C.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if config.flash_attn
            else C.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        params.no_perf = True
        return params

    # --- metadata and vocabulary (read-only: safe from any thread) -------------------------------

    def meta(self, key: str) -> str | None:
        size = 1024
        while True:
            buf = ctypes.create_string_buffer(size)
            n = C.llama_model_meta_val_str(self.model, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", "replace")
            size = n + 1

    def token_text(self, token: int) -> str:
        """The vocabulary entry of a (special) token, e.g. '<|im_end|>'; '' for none."""
        if token < 0:
            return ""
        raw = C.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", "replace") if raw else ""

    def tokenize(self, text: str) -> list[int]:
        """Prompt text to tokens: special tokens in the text are parsed, BOS added if the model wants
        one and the text does not already start with it (templates often write it themselves)."""
        data = text.encode("utf-8")
        cap = len(data) + 2
        buf = (C.llama_token * cap)()
        n = C.llama_tokenize(self.vocab, data, len(data), buf, cap, False, True)
        if n < 0:  # cannot happen with cap > bytes, but the API allows it
            cap = -n
            buf = (C.llama_token * cap)()
            n = C.llama_tokenize(self.vocab, data, len(data), buf, cap, False, True)
        tokens = buf[:n]
        if self.add_bos and self.bos >= 0 and (not tokens or tokens[0] != self.bos):
            tokens.insert(0, self.bos)
        return tokens

    def piece(self, token: int) -> bytes:
        """The raw bytes a sampled token stands for (control tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is None:
            buf = self._piece_buf
            n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            cached = buf.raw[:n]
            self._pieces[token] = cached
        return cached

    def is_eog(self, token: int) -> bool:
        cached = self._eog.get(token)
        if cached is None:
            cached = self._eog[token] = bool(C.llama_vocab_is_eog(self.vocab, token))
        return cached

    # --- the loop thread's calls ----------------------------------------------------------------

    def decode(
        self, max_rows: int | None = None, slices: list[tuple[int, int]] | None = None
    ) -> None:
        """Run the step batch through the model (releases the GIL while it computes).

        With `max_rows`, as consecutive graphs of at most that many rows and never one
        (`exact_slices`, for `EXACT_ROWS`); with `slices`, as exactly those consecutive ranges.
        Each is its own llama_decode; each one's output rows are copied out before the next
        decode overwrites llama.cpp's logits buffer."""
        batch = self.batch
        assert batch is not None
        batch.commit()
        self._copied = None
        _window.walked = 0
        try:
            n = len(batch)
            if slices is None:
                if max_rows is None or n <= max_rows:
                    _check(C.llama_decode(self.ctx, batch.raw))
                    return
                slices = exact_slices(n, max_rows)
            copied: dict[int, np.ndarray] = {}
            for start, end in slices:
                _check(C.llama_decode(self.ctx, batch.view(start, end)))
                for i in range(start, end):
                    if batch.outputs[i]:
                        copied[i] = self._logits_row(i - start).copy()
            self._copied = copied
        finally:
            self.kv_walked = _window.walked or self.kv_walked

    def logits(self, batch_index: int) -> np.ndarray:
        """The last decode's logits at one batch position: a numpy view of llama.cpp's own buffer
        (no copy) valid until the next decode, which rewrites it; a copy after a sliced decode."""
        if self._copied is not None:
            return self._copied[batch_index]
        return self._logits_row(batch_index)

    def _logits_row(self, batch_index: int) -> np.ndarray:
        row = C.llama_get_logits_ith(self.ctx, batch_index)
        if not row:
            raise DecodeError(f"no logits at batch position {batch_index}")
        address = ctypes.cast(row, ctypes.c_void_p).value
        return np.frombuffer(self._row_type.from_address(address), dtype=np.float32)

    def share(self, src: int, dst: int, n_tokens: int) -> None:
        """Give sequence `dst` the first `n_tokens` positions of `src`: the same cells, tagged twice."""
        C.llama_memory_seq_cp(self.memory, src, dst, 0, n_tokens)

    def forget(self, seq_id: int) -> None:
        """Drop every KV cell of one sequence, so the cells serve others from the next step."""
        C.llama_memory_seq_rm(self.memory, seq_id, -1, -1)

    def forget_from(self, seq_id: int, pos: int) -> None:
        """Drop one sequence's cells from position `pos` on (a reused prefix's tail, a pad)."""
        C.llama_memory_seq_rm(self.memory, seq_id, pos, -1)

    # With a KV stream per sequence (`ContextConfig.kv_unified` False) cells cannot be shared
    # across sequences by tagging (llama_memory_seq_cp copies whole streams: src/llama-kv-cache.cpp,
    # `seq_cp`), so a prefix is kept in host memory as llama.cpp's own sequence state, as
    # llama-server's `--cache-ram` does (tools/server/server-context.cpp).

    def save_state(self, seq_id: int) -> bytearray:
        """One sequence's KV cells (positions and K/V rows), as llama.cpp serialises them."""
        size = C.llama_state_seq_get_size(self.ctx, seq_id)
        state = bytearray(size)
        written = C.llama_state_seq_get_data(
            self.ctx, (ctypes.c_uint8 * size).from_buffer(state), size, seq_id
        )
        if written == 0:
            raise DecodeError(f"could not save sequence {seq_id}'s state")
        return state if written == size else state[:written]

    def restore_state(self, seq_id: int, state: bytearray) -> None:
        """Replace a sequence's cells with a saved state (`save_state`, same model and context)."""
        n = len(state)
        if (
            C.llama_state_seq_set_data(self.ctx, (ctypes.c_uint8 * n).from_buffer(state), n, seq_id)
            == 0
        ):
            raise DecodeError(f"could not restore a saved state into sequence {seq_id}")

    @property
    def n_ctx_seq(self) -> int:
        """Cells one sequence may hold: the whole pool, or its own stream's."""
        return C.llama_n_ctx_seq(self.ctx)

    def forget_all(self) -> None:
        C.llama_memory_clear(self.memory, True)

    def close(self) -> None:
        """Free batch, context and model (idempotent)."""
        if self.batch is not None:
            self.batch.free()
            self.batch = None
        if self.ctx:
            C.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            C.llama_model_free(self.model)
            self.model = None
