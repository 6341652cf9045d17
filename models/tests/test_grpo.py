"""GRPO's log-probs and loss: the exported grpo_grad_step against a direct JAX reference, and
chunked log-probs against unchunked ones (values, gradients, and the logits they hold)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podctl_models import grpo, qwen3
from podctl_models.config import ModelConfig, OptimizerConfig, preset
from podctl_models.programs import build_programs

from conftest import GRPO_TRAIN, assert_close_to_scale, full_sequences, grpo_prompts, tiny_init

MODEL = preset("tiny")
PATHS = [s.path for s in qwen3.param_specs(MODEL)]
N = len(PATHS)
ROWS, PROMPT, SEQ = GRPO_TRAIN.micro_batch, GRPO_TRAIN.prompt_len, GRPO_TRAIN.seq_len
TEMPERATURE, CLIP_LOW, CLIP_HIGH, KL_BETA = 0.8, 0.2, 0.28, 0.1


def perturbed_params(seed: int) -> list:
    """Init with the norm scales perturbed so they are exercised too."""
    params = tiny_init(jnp.uint32(seed))[:N]
    rng = np.random.default_rng(seed)
    return [np.asarray(p) + (rng.normal(0, 0.2, p.shape).astype(np.float32) if "norm" in path
                             else 0) for path, p in zip(PATHS, params)]


def reference_logprobs(params: dict, tokens, targets, lengths, temperature):
    """Per-token log-probs written independently of the bundle's left-padding machinery: each
    row is shifted left so its real tokens start at column 0 (the padding wraps to the end,
    where causality hides it), run through the plain causal model, and shifted back."""
    start = PROMPT - lengths
    columns = (np.arange(SEQ)[None, :] + start[:, None]) % SEQ
    compact = np.take_along_axis(tokens, columns, axis=1)
    compact_targets = np.take_along_axis(targets, columns, axis=1)
    logits = qwen3.logits(params, compact, MODEL, GRPO_TRAIN) / temperature
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, compact_targets[..., None], axis=-1)[..., 0]
    back = (np.arange(SEQ)[None, :] - start[:, None]) % SEQ
    return jnp.take_along_axis(picked, back, axis=1)


def reference_grpo(params: dict, batch: dict):
    """The GRPO loss over the counted tokens only, as the formulas read (DeepSeekMath's clipped
    surrogate, Schulman's k3 KL estimator), with its gradient."""
    rows, cols = np.nonzero(batch["mask"])
    weight = batch["mask"][rows, cols]

    def loss(params):
        logp = reference_logprobs(params, batch["tokens"], batch["targets"], batch["lengths"],
                                  TEMPERATURE)[rows, cols]
        ratio = jnp.exp(logp - batch["old"][rows, cols])
        advantage = batch["advantages"][rows]
        surrogate = jnp.minimum(ratio * advantage,
                                jnp.clip(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH) * advantage)
        log_ref = batch["ref"][rows, cols] - logp
        kl = jnp.exp(log_ref) - log_ref - 1
        metrics = {"kl_sum": jnp.sum(weight * kl),
                   "clipped_count": jnp.sum(weight * (surrogate != ratio * advantage)),
                   "ratio_sum": jnp.sum(weight * ratio), "ratio_min": jnp.min(ratio),
                   "ratio_max": jnp.max(ratio)}
        return jnp.sum(weight * (-surrogate + KL_BETA * kl)), metrics

    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


@pytest.fixture(scope="module")
def grpo_batch() -> dict:
    """Left-padded prompts, random completions of known lengths, a completion-only mask, and
    old/reference log-probs placed around the policy's so every clipping case occurs. Positions
    outside the mask hold inf/NaN: the program must ignore them."""
    params = dict(zip(PATHS, perturbed_params(21)))
    prompts, lengths = grpo_prompts(seed=5)
    rng = np.random.default_rng(6)
    completions = rng.integers(3, 128, (ROWS, GRPO_TRAIN.max_new_tokens)).astype(np.int32)
    tokens, targets = full_sequences(prompts, completions)
    mask = np.zeros((ROWS, SEQ), np.float32)
    for row, generated in enumerate((8, 5, 3, 8)):
        mask[row, PROMPT - 1:PROMPT - 1 + generated] = 1.0
    policy = np.asarray(jax.jit(reference_logprobs)(
        params, tokens, targets, lengths, TEMPERATURE))
    # Ratios exp(delta) of 1.49, 1.05, 0.95, 0.67: both sides of both clip bounds, none near one.
    delta = rng.choice(np.array([0.4, 0.05, -0.05, -0.4], np.float32), size=(ROWS, SEQ))
    old = np.where(mask != 0, policy - delta, np.inf).astype(np.float32)
    ref = np.where(mask != 0, policy + rng.normal(0, 0.3, (ROWS, SEQ)), np.nan).astype(np.float32)
    return {"params": params, "tokens": tokens, "targets": targets, "lengths": lengths,
            "mask": mask, "advantages": np.array([1.0, -0.5, 0.8, -1.2], np.float32),
            "old": old, "ref": ref, "policy": policy}


def step_args(batch: dict, grads: list) -> list:
    return [*[batch["params"][p] for p in PATHS], *grads, batch["tokens"], batch["targets"],
            batch["lengths"], batch["mask"], batch["advantages"], batch["old"], batch["ref"],
            np.float32(TEMPERATURE), np.float32(CLIP_LOW), np.float32(CLIP_HIGH),
            np.float32(KL_BETA)]


def zeros_like_params(batch: dict) -> list:
    return [np.zeros_like(batch["params"][p]) for p in PATHS]


def test_exported_grpo_grad_step_equals_a_direct_jax_reference(grpo_programs, grpo_batch):
    out = grpo_programs("grpo_grad_step", *step_args(grpo_batch, zeros_like_params(grpo_batch)))
    (want_loss, want_metrics), want_grads = reference_grpo(grpo_batch["params"], grpo_batch)
    loss_sum, token_count, *metrics = (float(x) for x in out[N:])
    np.testing.assert_allclose(loss_sum, float(want_loss), rtol=1e-5)
    assert token_count == grpo_batch["mask"].sum() == 24
    got_metrics = dict(zip(grpo.METRIC_NAMES, metrics))
    for name in ("kl_sum", "ratio_sum", "ratio_min", "ratio_max"):
        np.testing.assert_allclose(got_metrics[name], float(want_metrics[name]), rtol=1e-5)
    assert got_metrics["clipped_count"] == float(want_metrics["clipped_count"]) > 0
    for path, got in zip(PATHS, out[:N]):
        assert np.all(np.isfinite(got)), path
        assert_close_to_scale(got, want_grads[path], 1e-5)


@pytest.fixture(scope="module")
def grouped_batch(grpo_batch) -> dict:
    """`grpo_batch` with rows 0-1 and 2-3 answering one prompt each (the rollout's layout for
    two generations): the prompts of rows 0 and 2, each row its own completion."""
    b = grpo_batch
    prompts, lengths = grpo_prompts(seed=5)
    prompts, lengths = prompts[[0, 0, 2, 2]], lengths[[0, 0, 2, 2]]
    tokens, targets = full_sequences(prompts, b["tokens"][:, PROMPT:])
    policy = np.asarray(jax.jit(reference_logprobs)(b["params"], tokens, targets, lengths,
                                                   TEMPERATURE))
    counted = b["mask"] != 0
    # The same ratios and reference offsets as grpo_batch, around this batch's policy.
    old = np.where(counted, policy - (b["policy"] - b["old"]), np.inf).astype(np.float32)
    ref = np.where(counted, policy + (b["ref"] - b["policy"]), np.nan).astype(np.float32)
    return dict(b, tokens=tokens, targets=targets, lengths=lengths, old=old, ref=ref)


def test_a_grouped_bundle_runs_each_prompt_once_and_equals_the_reference(
        grpo_grouped_programs, grouped_batch):
    """`prompt_group = 2`: the prompt is computed once per pair of rows, and the loss, metrics,
    gradients and log-probs are still those of the plain per-row formulas."""
    b = grouped_batch
    out = grpo_grouped_programs("grpo_grad_step", *step_args(b, zeros_like_params(b)))
    (want_loss, want_metrics), want_grads = reference_grpo(b["params"], b)
    loss_sum, token_count, *metrics = (float(x) for x in out[N:])
    np.testing.assert_allclose(loss_sum, float(want_loss), rtol=1e-5)
    assert token_count == 24
    got_metrics = dict(zip(grpo.METRIC_NAMES, metrics))
    for name in ("kl_sum", "ratio_sum", "ratio_min", "ratio_max"):
        np.testing.assert_allclose(got_metrics[name], float(want_metrics[name]), rtol=1e-5)
    assert got_metrics["clipped_count"] == float(want_metrics["clipped_count"]) > 0
    for path, got in zip(PATHS, out[:N]):
        assert_close_to_scale(got, want_grads[path], 1e-5)

    params = [b["params"][p] for p in PATHS]
    (logprobs,) = grpo_grouped_programs("logprobs", *params, b["tokens"], b["targets"],
                                        b["lengths"], np.float32(TEMPERATURE))
    want = np.asarray(jax.jit(reference_logprobs)(b["params"], b["tokens"], b["targets"],
                                                 b["lengths"], TEMPERATURE))
    # The positions before the first prediction are not computed at all on this path.
    assert not np.asarray(logprobs)[:, :PROMPT - 1].any()
    predicting = slice(PROMPT - 1, SEQ - 1)
    np.testing.assert_allclose(np.asarray(logprobs)[:, predicting], want[:, predicting],
                               rtol=1e-5, atol=1e-5)


def test_grpo_grad_step_adds_to_the_gradients_it_is_given(grpo_programs, grpo_batch):
    first = grpo_programs("grpo_grad_step", *step_args(grpo_batch, zeros_like_params(grpo_batch)))
    again = grpo_programs("grpo_grad_step", *step_args(grpo_batch, list(first[:N])))
    # Equal up to rounding: XLA may fold the addition into the gradient's own sums.
    for once, twice in zip(first[:N], again[:N]):
        assert_close_to_scale(twice, 2 * np.asarray(once), 1e-6)


def test_on_policy_ratios_are_one_and_kl_to_itself_is_zero(grpo_programs, grpo_batch):
    """Old and reference log-probs from the bundle's own `logprobs` with the same parameters:
    the ratio is 1, nothing is clipped, the KL is 0, and the gradient is the plain policy
    gradient sum(mask * -A * dlogp)."""
    b = grpo_batch
    params = [b["params"][p] for p in PATHS]
    (logprobs,) = grpo_programs("logprobs", *params, b["tokens"], b["targets"], b["lengths"],
                                np.float32(TEMPERATURE))
    logprobs = np.asarray(logprobs)
    out = grpo_programs("grpo_grad_step", *step_args(dict(b, old=logprobs, ref=logprobs),
                                                     zeros_like_params(b)))
    metrics = dict(zip(grpo.METRIC_NAMES, (float(x) for x in out[N + 2:])))
    assert abs(metrics["ratio_min"] - 1) < 1e-6 and abs(metrics["ratio_max"] - 1) < 1e-6
    assert metrics["clipped_count"] == 0 and abs(metrics["kl_sum"]) < 1e-6
    np.testing.assert_allclose(float(out[N]), -np.sum(b["mask"] * b["advantages"][:, None]),
                               rtol=1e-5)


def test_chunked_logprobs_equal_unchunked_values_and_gradients():
    rng = np.random.default_rng(3)
    batch, seq, width, vocab, chunk = 3, 24, 16, 40, 8
    hidden = rng.normal(size=(batch, seq, width)).astype(np.float32)
    embed = rng.normal(scale=0.4, size=(vocab, width)).astype(np.float32)
    targets = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    weights = rng.normal(size=(batch, seq)).astype(np.float32)

    def weighted(chunk):
        def f(h, e):
            logprobs = grpo.token_logprobs(h, e, targets, jnp.float32(0.7), chunk)
            return jnp.sum(weights * logprobs), logprobs
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))

    (_, chunked), grads_c = weighted(chunk)(hidden, embed)
    (_, plain), grads_p = weighted(0)(hidden, embed)
    np.testing.assert_allclose(chunked, plain, rtol=0, atol=1e-5)
    logits = hidden.astype(np.float64) @ embed.T.astype(np.float64) / 0.7
    direct = np.take_along_axis(logits, targets[..., None], -1)[..., 0] - np.log(
        np.exp(logits).sum(-1))
    np.testing.assert_allclose(chunked, direct, rtol=0, atol=1e-5)
    for got, want in zip(grads_c, grads_p):
        assert_close_to_scale(got, want, 1e-5)


def _float_arrays(hlo: str) -> set[tuple[int, ...]]:
    return {tuple(int(d) for d in dims.split(",") if d)
            for dims in re.findall(r"f32\[([\d,]*)\]", hlo)}


# Vocabulary distinct from every other dimension and product, so the logits are recognizable
# by shape in the compiled program (tiny's vocabulary equals its hidden size).
ODD_MODEL = ModelConfig("odd", vocab_size=96, hidden_size=48, num_layers=2, num_heads=6,
                        num_kv_heads=2, head_dim=8, intermediate_size=80)


def test_chunked_grpo_step_equals_unchunked_and_never_holds_all_logits(grpo_batch):
    """grpo_grad_step with 4 chunks of 4 steps against the same program unchunked: same loss
    and gradients within 1e-5, and only the unchunked one compiles a float32 array of
    `[rows, seq, vocab]` elements, forward or backward."""
    def compiled(train):
        programs = build_programs(ODD_MODEL, train, OptimizerConfig())
        params = jax.jit(programs["init"].fn)(jnp.uint32(4))[:N]
        batch = dict(grpo_batch, params=dict(zip(PATHS, params)),
                     tokens=grpo_batch["tokens"] % 96, targets=grpo_batch["targets"] % 96)
        args = step_args(batch, [np.zeros(p.shape, np.float32) for p in params])
        return jax.jit(programs["grpo_grad_step"].fn).lower(*args).compile(), args

    chunked, args = compiled(GRPO_TRAIN)
    unchunked, _ = compiled(dataclasses.replace(GRPO_TRAIN, logprob_chunk=0, loss_chunk=SEQ))
    got, want = chunked(*args), unchunked(*args)
    np.testing.assert_allclose(float(got[N]), float(want[N]), rtol=1e-5)
    for g, w in zip(got[:N], want[:N]):
        assert_close_to_scale(g, w, 1e-5)

    vocab = ODD_MODEL.vocab_size
    all_logits, chunk_logits = ROWS * SEQ * vocab, ROWS * GRPO_TRAIN.logprob_chunk * vocab
    sizes = {int(np.prod(s)) for s in _float_arrays(chunked.as_text()) if vocab in s}
    assert chunk_logits in sizes, "no chunk of logits at all: the check would be vacuous"
    assert max(sizes) < all_logits, sorted(sizes)
    plain = {int(np.prod(s)) for s in _float_arrays(unchunked.as_text()) if vocab in s}
    assert all_logits in plain, sorted(plain)
