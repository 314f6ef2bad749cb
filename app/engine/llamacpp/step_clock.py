"""How many prompt tokens the next step may take: sized by time, learnt from the steps just run.

On a CPU a step costs about as much per prompt token as per decode token, so a prompt chunk
stretches every running stream's gap by its own length. Chunked prefill bounds that stretch in
time, not tokens:

- When somebody is decoding, a step may last `stretch` times a decode-only step of the same
  decoders, or `floor_s` where that is longer (a one-stream 12 ms gap may become 100 ms, still
  ten tokens a second, faster than anyone reads). With 8 streams decoding and a 1,500-token prompt
  arriving, their gaps thus stay within ~2x of the steady gap (bench/chunked_prefill.py), while
  prompts enter in chunks as big as that allows rather than a fixed 16 tokens.
- When nobody is decoding, nobody waits: everything waiting goes in as few steps as the batch
  allows (`capacity`), the way llama.cpp's own server prefills a burst.

What a step costs is learnt as the engine runs (exponential averages, so a busier machine or a
longer context is caught within a few steps): the decode-only step per running stream, and the
extra cost of one prompt token measured on steps that carried both. Until the first measurement
a prompt token is assumed to cost what a decode token does. The clock is plain arithmetic with no
llama.cpp in it, so the policy can be read and tested on its own (tests/engine/test_llamacpp.py).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_PREFILL = 8  # tokens a step always gives waiting prompts (the old fixed budget gave 8 beside 8)


@dataclass(slots=True)
class StepClock:
    stretch: float = 2.0  # a step with prompt chunks may last this many decode-only steps ...
    floor_s: float = 0.1  # ... or this long, whichever is longer
    smoothing: float = 0.3  # weight of the newest step in the averages
    per_decoder_s: float | None = None  # a decode-only step's seconds, per running stream
    per_prompt_token_s: float | None = None  # what one prompt token adds to a step

    def steady_s(self, decoders: int) -> float | None:
        """The expected decode-only step with `decoders` running (None until measured)."""
        return None if self.per_decoder_s is None else self.per_decoder_s * decoders

    def prefill_budget(self, decoders: int, capacity: int) -> int:
        """Prompt tokens the next step may carry beside `decoders` decode tokens."""
        room = capacity - decoders
        if decoders == 0 or self.per_decoder_s is None:
            return room  # nobody to stall (or nothing learnt yet: the first steps teach it)
        steady = self.per_decoder_s * decoders
        spare = max(self.stretch * steady, self.floor_s) - steady
        per_token = self.per_prompt_token_s or self.per_decoder_s
        return max(MIN_PREFILL, min(room, int(spare / per_token)))

    def record(self, decoders: int, prompt_tokens: int, seconds: float) -> None:
        """Learn from one step: `decoders` decode tokens and `prompt_tokens` took `seconds`."""
        if prompt_tokens == 0:
            if decoders:
                self.per_decoder_s = self._mix(self.per_decoder_s, seconds / decoders)
            return
        steady = self.steady_s(decoders)
        if decoders and steady is None:
            return  # cannot split this step's time between the two kinds of tokens yet
        extra = seconds - (steady or 0.0)
        # a noisy decode estimate may exceed the step itself: count such a step as a cheap one
        sample = max(extra, 0.1 * seconds) / prompt_tokens
        self.per_prompt_token_s = self._mix(self.per_prompt_token_s, sample)

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)
