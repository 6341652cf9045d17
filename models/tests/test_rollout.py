"""The exported rollout: greedy decoding against a naive decode without KV cache, stop ids and
PAD, seeded sampling, and the top-p nucleus (exact, and statistically through sampling)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podctl_models import qwen3, rollout
from podctl_models.config import preset

from conftest import GRPO_TRAIN, full_sequences, grpo_prompts, tiny_init

MODEL = preset("tiny")
PATHS = [s.path for s in qwen3.param_specs(MODEL)]
N = len(PATHS)
ROWS, PROMPT, NEW = GRPO_TRAIN.micro_batch, GRPO_TRAIN.prompt_len, GRPO_TRAIN.max_new_tokens
NO_STOP, PAD = (), 0

PARAMS = [np.asarray(p) for p in tiny_init(jnp.uint32(9))[:N]]
PROMPTS, LENGTHS = grpo_prompts(seed=1)
SEEDS = np.array([11, 12, 13, 14], np.uint32)


def stop_slots(stop):
    """`stop` ids in the program's fixed slots, the unused ones -1."""
    slots = np.full(rollout.STOP_IDS, -1, np.int32)
    slots[:len(stop)] = stop
    return slots


def run_rollout(programs, temperature, top_p=1.0, stop=NO_STOP, pad=PAD, prompts=PROMPTS,
                lengths=LENGTHS, seeds=SEEDS):
    out = programs("rollout", *PARAMS, prompts, lengths, seeds, np.float32(temperature),
                   np.float32(top_p), stop_slots(stop), np.int32(pad))
    return tuple(np.asarray(x) for x in out)


_logits = jax.jit(lambda p, tokens: qwen3.logits(p, tokens, MODEL, GRPO_TRAIN))


def naive_greedy(row: int) -> list[int]:
    """Greedy decoding of one row without padding or cache: the whole sequence so far through
    the plain model each step (right-padded to one shape; causality hides the padding)."""
    params = dict(zip(PATHS, PARAMS))
    length = int(LENGTHS[row])
    buffer = np.zeros((1, PROMPT + NEW), np.int32)
    buffer[0, :length] = PROMPTS[row, PROMPT - length:]
    tokens = []
    for t in range(NEW):
        logits = np.asarray(_logits(params, buffer))[0, length + t - 1]
        top2 = np.sort(logits)[-2:]
        assert top2[1] - top2[0] > 1e-3, "a near tie: float rounding could flip the argmax"
        tokens.append(int(np.argmax(logits)))
        buffer[0, length + t] = tokens[-1]
    return tokens


@pytest.fixture(scope="module")
def greedy(grpo_programs):
    return run_rollout(grpo_programs, temperature=0.0)


def test_greedy_rollout_is_deterministic_and_equals_a_naive_decode(grpo_programs, greedy):
    tokens, lengths, logprobs = greedy
    again = run_rollout(grpo_programs, temperature=0.0, seeds=SEEDS + 100)
    for a, b in zip(greedy, again):
        np.testing.assert_array_equal(a, b)
    assert tokens.shape == (ROWS, NEW) and tokens.dtype == np.int32
    for row in range(ROWS):
        assert tokens[row].tolist() == naive_greedy(row), row
    np.testing.assert_array_equal(lengths, [NEW] * ROWS)
    assert np.all(logprobs < 0)


def test_rollout_logprobs_equal_the_logprobs_program(grpo_programs, greedy):
    """The sampler's log-probs (temperature 0 scores at 1) and the `logprobs` program on the
    assembled sequences agree: the host may use either as the old policy's."""
    for temperature, (tokens, _, logprobs) in ((0.0, greedy), (0.7, run_rollout(
            grpo_programs, temperature=0.7))):
        sequence, targets = full_sequences(PROMPTS, tokens)
        (scored,) = grpo_programs("logprobs", *PARAMS, sequence, targets, LENGTHS,
                                  np.float32(temperature))
        # Target column PROMPT - 1 + t predicts completion token t.
        completion_scores = np.asarray(scored)[:, PROMPT - 1:PROMPT - 1 + NEW]
        np.testing.assert_allclose(completion_scores, logprobs, rtol=0, atol=1e-5)


def check_stops(free, free_logprobs, stop, tokens, lengths, logprobs, pad):
    """Each row equals the free-running one up to its first stop id, then PAD; returns how many
    rows stopped early."""
    stopped = 0
    for row in range(ROWS):
        hits = np.flatnonzero(np.isin(free[row], stop))
        length = int(hits[0]) + 1 if len(hits) else NEW
        stopped += length < NEW
        assert lengths[row] == length, row
        np.testing.assert_array_equal(tokens[row, :length], free[row, :length])
        np.testing.assert_array_equal(tokens[row, length:], pad)
        np.testing.assert_array_equal(logprobs[row, :length], free_logprobs[row, :length])
        np.testing.assert_array_equal(logprobs[row, length:], 0.0)
    return stopped


def test_a_stop_id_stops_a_row_and_pads_after_it(grpo_programs, greedy):
    free, _, free_logprobs = greedy
    # A token row 0 first produces at step 2: rows stop at their first occurrence of it.
    stop = next(int(tok) for tok in free[0, 2:] if tok not in free[0, :2])
    tokens, lengths, logprobs = run_rollout(grpo_programs, temperature=0.0, stop=[stop], pad=5)
    stopped = check_stops(free, free_logprobs, [stop], tokens, lengths, logprobs, pad=5)
    assert lengths[0] == np.flatnonzero(free[0] == stop)[0] + 1 and stopped >= 1


def test_a_row_stops_at_whichever_stop_id_comes_first(grpo_programs, greedy):
    """Two stop ids (a chat model's end of turn and end of text): each row stops at the first of
    either, and the id in the second slot stops rows as the first does."""
    free, _, free_logprobs = greedy
    # Row 0 stops at its third token (the second slot's id); another row at a token row 0 does
    # not start with (the first slot's id).
    second = int(free[0, 2])
    first = next(int(tok) for row in range(1, ROWS) for tok in free[row, 1:] if tok not in free[0, :3])
    tokens, lengths, logprobs = run_rollout(grpo_programs, temperature=0.0, stop=[first, second], pad=7)
    stopped = check_stops(free, free_logprobs, [first, second], tokens, lengths, logprobs, pad=7)
    assert lengths[0] <= 3 and stopped >= 2
    # Without the second slot, row 0 runs on: the second slot is read.
    only_first = run_rollout(grpo_programs, temperature=0.0, stop=[first], pad=7)
    assert only_first[1][0] > lengths[0]
    # Every slot filled (ids no token has after the two): the same stops.
    full = [first, second] + [10**6] * (rollout.STOP_IDS - 2)
    np.testing.assert_array_equal(run_rollout(grpo_programs, temperature=0.0, stop=full, pad=7)[1], lengths)


def test_sampling_repeats_with_the_same_seeds_and_differs_with_others(grpo_programs, greedy):
    first = run_rollout(grpo_programs, temperature=1.0)
    again = run_rollout(grpo_programs, temperature=1.0)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    other = run_rollout(grpo_programs, temperature=1.0, seeds=SEEDS + 100)
    assert all(not np.array_equal(first[0][r], other[0][r]) for r in range(ROWS))
    assert not np.array_equal(first[0], greedy[0])
    # Seeds are per row: the same (prompt, seed) rows in another order sample the same tokens.
    order = np.array([2, 0, 3, 1])
    shuffled = run_rollout(grpo_programs, temperature=1.0, prompts=PROMPTS[order],
                           lengths=LENGTHS[order], seeds=SEEDS[order])
    np.testing.assert_array_equal(shuffled[0], first[0][order])


def test_a_tiny_top_p_keeps_only_the_most_likely_token(grpo_programs, greedy):
    tokens, lengths, logprobs = run_rollout(grpo_programs, temperature=1.0, top_p=1e-6)
    np.testing.assert_array_equal(tokens, greedy[0])
    np.testing.assert_allclose(logprobs, greedy[2], rtol=0, atol=1e-6)


def sort_nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """The textbook nucleus: sort descending, keep tokens until the cumulative mass reaches
    top_p (the token that crosses it included)."""
    keep = np.zeros(probs.shape, bool)
    for row, p in enumerate(probs.astype(np.float64)):
        order = np.argsort(-p)
        before = np.cumsum(p[order]) - p[order]
        keep[row, order[before < top_p]] = True
    return keep


def test_nucleus_equals_the_sort_based_nucleus():
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=2.0, size=(16, 200)).astype(np.float32)
    probs = np.asarray(jax.nn.softmax(logits, axis=-1))
    nucleus = jax.jit(rollout.nucleus)
    for top_p in (0.05, 0.3, 0.5, 0.9, 0.99):
        got = np.asarray(nucleus(probs, np.float32(top_p)))
        np.testing.assert_array_equal(got, sort_nucleus(probs, top_p), err_msg=str(top_p))
        assert 1 <= got.sum(-1).min() and got.sum(-1).max() < 200
    assert np.asarray(nucleus(probs, np.float32(1.0))).all()


def test_sampling_draws_from_the_renormalized_nucleus():
    """4000 draws from probabilities (0.5, 0.3, 0.15, 0.05): top-p 0.7 keeps exactly the first
    two, in proportion 5:3; top-p 1 reproduces all four. Counts within 4.5 standard errors."""
    draws = 4000
    probs = np.array([0.5, 0.3, 0.15, 0.05], np.float32)
    logits = np.tile(np.log(probs), (draws, 1))
    keys = jax.vmap(jax.random.key)(jnp.arange(draws, dtype=jnp.uint32))
    sample = jax.jit(rollout.sample)

    def frequencies(top_p, temperature=1.0):
        tokens, logprobs = sample(logits, keys, np.float32(temperature), np.float32(top_p))
        tokens = np.asarray(tokens)
        np.testing.assert_allclose(np.asarray(logprobs), np.log(probs)[tokens], atol=1e-6)
        return np.bincount(tokens, minlength=4) / draws

    def within(got, want):
        error = 4.5 * np.sqrt(want * (1 - want) / draws)
        assert np.all(np.abs(got - want) <= error + 1e-12), (got, want)

    nucleus = frequencies(0.7)
    assert nucleus[2] == nucleus[3] == 0
    within(nucleus, np.array([0.625, 0.375, 0, 0]))
    within(frequencies(1.0), probs)
    # Temperature 0 is greedy whatever the keys.
    assert frequencies(1.0, temperature=0.0)[0] == 1.0


def test_a_grouped_bundle_prefills_a_shared_prompt_once_and_samples_the_same(
        grpo_programs, grpo_grouped_programs):
    """`prompt_group = 2` with rows 0-1 and 2-3 sharing a prompt: each prompt is prefilled once
    and its cache given to both rows; the completions and log-probs are those of the per-row
    bundle. Rows that do not share prompts take the plain path and agree too."""
    grouped, lengths = PROMPTS[[0, 0, 2, 2]], LENGTHS[[0, 0, 2, 2]]
    for prompts, lengths in ((grouped, lengths), (PROMPTS, LENGTHS)):
        want = run_rollout(grpo_programs, 1.0, prompts=prompts, lengths=lengths)
        got = run_rollout(grpo_grouped_programs, 1.0, prompts=prompts, lengths=lengths)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-6)
    # Rows of one group sample with their own seeds: the two answers to one prompt differ.
    tokens = run_rollout(grpo_grouped_programs, 1.0, prompts=grouped, lengths=lengths)[0]
    assert not np.array_equal(tokens[0], tokens[1])
