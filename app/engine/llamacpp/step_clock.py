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
longer context is caught within a few steps): the decode-only step for each number of running
streams seen (a step has a fixed part, so one stream's cost times 32 overstates 32 streams' step:
measured 9 against 4.6 ms a stream, and the prompt chunks it let in tripled the gaps of a
32-stream burst), and the extra cost of one prompt token measured on steps that carried both. Until the first measurement
a prompt token is assumed to cost what a decode token does. The clock is plain arithmetic with no
llama.cpp in it, so the policy can be read and tested on its own (tests/engine/test_llamacpp.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_PREFILL = 8  # tokens a step always gives waiting prompts (the old fixed budget gave 8 beside 8)


@dataclass(slots=True)
class StepClock:
    stretch: float = 2.0  # a step with prompt chunks may last this many decode-only steps ...
    floor_s: float = 0.1  # ... or this long, whichever is longer
    smoothing: float = 0.3  # weight of the newest step in the averages
    decode_s: dict[int, float] = field(default_factory=dict)  # decode-only step, by decoders
    per_prompt_token_s: float | None = None  # what one prompt token adds to a step

    def steady_s(self, decoders: int) -> float | None:
        """The expected decode-only step with `decoders` running (None until measured): as
        measured with that many, else scaled from the nearest count measured, one above where
        there is (scaling up from fewer overstates it)."""
        measured = self.decode_s
        if not measured:
            return None
        if (seconds := measured.get(decoders)) is not None:
            return seconds
        above = [n for n in measured if n > decoders]
        nearest = min(above) if above else max(measured)
        return measured[nearest] * decoders / nearest

    def prefill_budget(self, decoders: int, capacity: int) -> int:
        """Prompt tokens the next step may carry beside `decoders` decode tokens."""
        room = capacity - decoders
        steady = self.steady_s(decoders) if decoders else None
        if steady is None:
            return room  # nobody to stall (or nothing learnt yet: the first steps teach it)
        spare = max(self.stretch * steady, self.floor_s) - steady
        per_token = self.per_prompt_token_s or steady / decoders
        return max(MIN_PREFILL, min(room, int(spare / per_token)))

    def record(self, decoders: int, prompt_tokens: int, seconds: float) -> None:
        """Learn from one step: `decoders` decode tokens and `prompt_tokens` took `seconds`."""
        if prompt_tokens == 0:
            if decoders:
                self.decode_s[decoders] = self._mix(self.decode_s.get(decoders), seconds)
            return
        steady = self.steady_s(decoders) if decoders else 0.0
        if steady is None:
            return  # cannot split this step's time between the two kinds of tokens yet
        if steady >= seconds and decoders not in self.decode_s:
            # the decode-only step was overstated (scaled up from fewer streams): this step
            # bounds it; split it by tokens until a decode-only step of this many is measured
            steady = self.decode_s[decoders] = seconds * decoders / (decoders + prompt_tokens)
        extra = seconds - steady
        # a noisy decode estimate may exceed the step itself: count such a step as a cheap one
        sample = max(extra, 0.1 * seconds) / prompt_tokens
        self.per_prompt_token_s = self._mix(self.per_prompt_token_s, sample)

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)
