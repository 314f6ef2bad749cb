"""How an exact step is laid out in llama_decode calls with a KV stream per sequence, and the
host-memory prefix cache's bookkeeping: pure Python, no model (the model tests are in
test_llamacpp_streams.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.engine.llamacpp.host_cache import HostPrefixCache
from app.engine.llamacpp.native import EXACT_ROWS
from app.engine.llamacpp.stream_calls import Layout, Part, plan_calls


def ubatches(call: list[Part]) -> list[dict[int, int]]:
    """What llama.cpp's `split_equal(sequential=true)` makes of one call (src/llama-batch.cpp):
    the first unused token's sequence and the next consecutive ids after it, in batch order,
    then as many tokens of each as all of them have. {slot: tokens} per ubatch."""
    rows = [p.slot for p in call for _ in range(p.n)]
    used = [False] * len(rows)
    out = []
    while not all(used):
        chosen: list[int] = []
        for i, slot in enumerate(rows):
            if used[i] or slot in chosen:
                continue
            if not chosen or slot == chosen[-1] + 1:
                chosen.append(slot)
        left = {s: [i for i, r in enumerate(rows) if r == s and not used[i]] for s in chosen}
        n = min(len(v) for v in left.values())
        for v in left.values():
            for i in v[:n]:
                used[i] = True
        out.append({s: n for s in chosen})
    return out


def check(layout: Layout, asked: dict[int, int]) -> None:
    """Every taken token once, in order per slot; no ubatch the split-KV or tiled kernel takes."""
    seen: dict[int, list[int]] = {}
    for call in layout.calls:
        for part in call:
            if not part.pad:
                seen.setdefault(part.slot, []).extend(range(part.offset, part.offset + part.n))
        for ub in ubatches(call):
            assert all(n < 64 for n in ub.values()), "a tiled graph"
            if layout.exact:
                assert len(ub) >= 2 or next(iter(ub.values())) >= 2, f"a lone row: {ub}"
    assert seen == {s: list(range(n)) for s, n in layout.taken.items()}
    for slot, n in layout.taken.items():
        # all it asked for, or a two-token chunk keeping one (its tail would be a lone row)
        assert n == asked[slot] or (asked[slot], n) == (2, 1), (slot, asked[slot], n)
    pads = [p.slot for call in layout.calls for p in call if p.pad]
    assert len(pads) == len(set(pads)) and not set(pads) & set(asked)


def test_a_lone_decoder_gets_a_pad_in_the_next_free_stream() -> None:
    layout = plan_calls({0: 1}, 4, EXACT_ROWS)
    assert layout.calls == [[Part(0, 0, 1), Part(1, -1, 1)]] and layout.exact


def test_a_prompt_chunk_beside_lends_its_first_token_and_goes_alone() -> None:
    """The decoder in slot 0 and a newcomer's prompt in slot 1, the common case: no free
    neighbour, so the chunk's first token keeps the decoder company."""
    layout = plan_calls({0: 1, 1: 16}, 2, EXACT_ROWS)
    assert layout.calls == [[Part(0, 0, 1), Part(1, 0, 1)], [Part(1, 1, 15)]]
    check(layout, {0: 1, 1: 16})


def test_a_two_token_chunk_gives_its_last_token_back() -> None:
    layout = plan_calls({0: 1, 1: 2}, 2, EXACT_ROWS)
    assert layout.taken == {0: 1, 1: 1} and layout.calls == [[Part(0, 0, 1), Part(1, 0, 1)]]


def test_a_gap_between_decoders_is_padded() -> None:
    layout = plan_calls({0: 1, 2: 1, 5: 1}, 8, EXACT_ROWS)
    check(layout, {0: 1, 2: 1, 5: 1})
    assert {p.slot for p in layout.calls[0] if p.pad} == {1, 6}


def test_one_stream_alone_cannot_be_exact() -> None:
    assert not plan_calls({0: 1}, 1, EXACT_ROWS).exact


def test_long_chunks_go_in_graphs_of_at_most_63_rows() -> None:
    layout = plan_calls({3: 200}, 4, EXACT_ROWS)
    assert [p.n for call in layout.calls for p in call] == [63, 63, 63, 11]
    check(layout, {3: 200})


@given(
    st.integers(2, 12).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.dictionaries(st.integers(0, n - 1), st.integers(1, 150), min_size=1),
        )
    )
)
def test_any_step_is_covered_without_lone_rows(case: tuple[int, dict[int, int]]) -> None:
    n_slots, asked = case
    layout = plan_calls(asked, n_slots, EXACT_ROWS)
    check(layout, asked)
    if len(asked) < n_slots or any(n >= 2 for n in asked.values()):
        assert layout.exact, (asked, layout)


# --- the host-memory prefix cache -----------------------------------------------------------------


def state(n: int) -> bytearray:
    return bytearray(n)


def test_host_cache_serves_each_owner_its_own_and_everyone_the_opening() -> None:
    cache = HostPrefixCache(max_bytes=1000)
    opening = [1, 2, 3, 4, 5]
    cache.pin(opening, state(10))
    cache.store([*opening, 6, 7, 8, 9], "alice", exact=True, state=state(100))
    entry, n = cache.lookup([*opening, 6, 7, 8, 9, 10], "alice", exact_only=True)
    assert entry is not None and n == 9 and not entry.shared
    entry, n = cache.lookup([*opening, 6, 7, 8, 9, 10], "bob", exact_only=True)
    assert entry is not None and entry.shared and n == 5
    assert cache.lookup([9, 9, 9, 9, 9], "bob", exact_only=False) == (None, 0)
    assert (cache.hits, cache.misses, cache.reused_tokens) == (2, 1, 14)


def test_host_cache_keeps_the_prompts_last_token_for_its_logits() -> None:
    cache = HostPrefixCache(max_bytes=1000)
    cache.store([1, 2, 3, 4, 5, 6], "a", exact=True, state=state(1))
    assert cache.lookup([1, 2, 3, 4, 5, 6], "a", exact_only=False)[1] == 5


def test_host_cache_a_later_turn_replaces_the_one_it_extends() -> None:
    cache = HostPrefixCache(max_bytes=1000)
    cache.store([1, 2, 3, 4, 5], "a", exact=True, state=state(10))
    cache.store([7, 7, 7, 7, 7], "a", exact=True, state=state(10))
    assert not cache.wants([1, 2, 3, 4], "a", exact=True)  # already held
    assert cache.wants([1, 2, 3, 4], "b", exact=True)  # not for b
    cache.store([1, 2, 3, 4, 5, 6, 7], "a", exact=True, state=state(14))
    assert sorted(len(e.tokens) for e in cache.entries) == [5, 7]
    assert cache.bytes == 24


def test_host_cache_greedy_prompts_reuse_only_exact_states() -> None:
    cache = HostPrefixCache(max_bytes=1000)
    cache.store([1, 2, 3, 4, 5, 6], "a", exact=False, state=state(10))
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7], "a", exact_only=True) == (None, 0)
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7], "a", exact_only=False)[1] == 6
    cache.store([1, 2, 3, 4, 5, 6], "a", exact=True, state=state(10))  # exact replaces inexact
    assert [e.exact for e in cache.entries] == [True]
    assert not cache.wants([1, 2, 3, 4, 5, 6], "a", exact=False)


def test_host_cache_stays_under_its_bytes_least_recently_used_first() -> None:
    cache = HostPrefixCache(max_bytes=100)
    cache.pin([0, 0, 0, 0], state(10))
    for i in range(1, 4):
        cache.store([i] * 5, f"u{i}", exact=True, state=state(40))
    assert cache.bytes <= 100
    assert {e.owner for e in cache.entries} == {None, "u2", "u3"}  # u1 was the oldest
    cache.lookup([2] * 6, "u2", exact_only=True)  # u2 used: u3 goes next
    cache.store([4] * 5, "u4", exact=True, state=state(40))
    assert {e.owner for e in cache.entries} == {None, "u2", "u4"}
    cache.store([5] * 5, "u5", exact=True, state=state(101))  # bigger than the whole bound
    assert {e.owner for e in cache.entries} == {None, "u2", "u4"}
    cache.clear()
    assert [e.shared for e in cache.entries] == [True]
