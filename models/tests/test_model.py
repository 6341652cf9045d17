"""The model against an independent NumPy Qwen3, init determinism, and grad accumulation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from podctl_models import qwen3
from podctl_models.config import ModelConfig, OptimizerConfig, TrainConfig, preset
from podctl_models.programs import build_programs

from conftest import arithmetic_batch, assert_close_to_scale

# Small, with every head count distinct so a head-layout mistake cannot cancel out.
MODEL = ModelConfig("test", vocab_size=96, hidden_size=48, num_layers=2, num_heads=6,
                    num_kv_heads=2, head_dim=8, intermediate_size=80)
TRAIN = TrainConfig(micro_batch=2, seq_len=16, loss_chunk=8)


def numpy_logits(params: dict, tokens: np.ndarray, model: ModelConfig) -> np.ndarray:
    """Qwen3 written out head by head in float64, following Hugging Face's modeling_qwen3."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    eps, hd = model.rms_norm_eps, model.head_dim
    group = model.num_heads // model.num_kv_heads

    def norm(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rope(x, pos):  # x: [hd]
        inv = 1.0 / model.rope_theta ** (np.arange(0, hd, 2) / hd)
        ang = np.concatenate([pos * inv, pos * inv])
        rot = np.concatenate([-x[hd // 2:], x[:hd // 2]])
        return x * np.cos(ang) + rot * np.sin(ang)

    batch, seq = tokens.shape
    x = p["embed"][tokens]
    for layer in range(model.num_layers):
        w = {k[len("layers/"):]: v[layer] for k, v in p.items() if k.startswith("layers/")}
        h = norm(x, w["input_norm"])
        q = (h @ w["q_proj"]).reshape(batch, seq, model.num_heads, hd)
        k = (h @ w["k_proj"]).reshape(batch, seq, model.num_kv_heads, hd)
        v = (h @ w["v_proj"]).reshape(batch, seq, model.num_kv_heads, hd)
        attn = np.zeros((batch, seq, model.num_heads, hd))
        for b in range(batch):
            for head in range(model.num_heads):
                kv = head // group
                qs = np.stack([rope(norm(q[b, t, head], w["q_norm"]), t) for t in range(seq)])
                ks = np.stack([rope(norm(k[b, t, kv], w["k_norm"]), t) for t in range(seq)])
                scores = qs @ ks.T / np.sqrt(hd)
                scores = np.where(np.tril(np.ones((seq, seq), bool)), scores, -np.inf)
                probs = np.exp(scores - scores.max(-1, keepdims=True))
                probs /= probs.sum(-1, keepdims=True)
                attn[b, :, head] = probs @ v[b, :, kv]
        x = x + attn.reshape(batch, seq, -1) @ w["o_proj"]
        h = norm(x, w["post_norm"])
        gate = h @ w["gate_proj"]
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w["up_proj"])) @ w["down_proj"]
    return norm(x, p["final_norm"]) @ p.get("lm_head", p["embed"]).T


def random_params(model: ModelConfig, seed: int) -> dict:
    """Init, with norm scales perturbed so that they are exercised too."""
    params = jax.jit(lambda s: qwen3.init_params(model, s, jnp.float32))(jnp.uint32(seed))
    rng = np.random.default_rng(seed)
    return {k: v + (rng.normal(0, 0.2, v.shape).astype(np.float32) if "norm" in k else 0)
            for k, v in params.items()}


def test_logits_match_numpy_reference():
    params = random_params(MODEL, 3)
    tokens = np.random.default_rng(0).integers(0, MODEL.vocab_size, (2, 16)).astype(np.int32)
    got = np.asarray(jax.jit(lambda p, t: qwen3.logits(p, t, MODEL, TRAIN))(params, tokens))
    want = numpy_logits(params, tokens, MODEL)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_untied_output_head_is_its_own_parameter():
    untied = dataclasses.replace(MODEL, tie_embeddings=False)
    specs = qwen3.param_specs(untied)
    assert [s.path for s in specs] == [s.path for s in qwen3.param_specs(MODEL)] + ["lm_head"]
    head = specs[-1]
    assert (head.shape, head.spec, head.decays) == ((96, 48), ("tp", "fsdp"), True)
    assert qwen3.num_params(untied) == qwen3.num_params(MODEL) + 96 * 48
    params = random_params(untied, 3)
    # The tied parameters draw the same values: lm_head is drawn last, from its own key.
    tied = random_params(MODEL, 3)
    assert all(np.array_equal(params[k], tied[k]) for k in tied)
    assert not np.allclose(params["lm_head"], params["embed"])
    tokens = np.random.default_rng(0).integers(0, MODEL.vocab_size, (2, 16)).astype(np.int32)
    got = np.asarray(jax.jit(lambda p, t: qwen3.logits(p, t, untied, TRAIN))(params, tokens))
    np.testing.assert_allclose(got, numpy_logits(params, tokens, untied), rtol=1e-4, atol=1e-4)


_loss_and_grads_cache = {}


def loss_and_grads(train: TrainConfig, params, batch):
    """`(loss_sum, grads)` of MODEL, one compile per train setting across tests."""
    if train not in _loss_and_grads_cache:
        _loss_and_grads_cache[train] = jax.jit(jax.value_and_grad(
            lambda p, b: qwen3.sft_loss(p, *b, MODEL, train)[0]))
    return _loss_and_grads_cache[train](params, batch)


def test_remat_policies_do_not_change_gradients():
    params = random_params(MODEL, 4)
    batch = arithmetic_batch(2, 16, seed=1)
    _, want = loss_and_grads(TRAIN, params, batch)
    for remat in ("dots", "full"):
        _, grads = loss_and_grads(dataclasses.replace(TRAIN, remat=remat), params, batch)
        for k in params:
            assert_close_to_scale(grads[k], want[k], 1e-5)


def test_param_count_and_specs_of_tiny():
    specs = qwen3.param_specs(preset("tiny"))
    assert [s.path for s in specs][0] == "embed" and specs[-1].path == "final_norm"
    by_path = {s.path: s for s in specs}
    assert by_path["layers/q_proj"].shape == (2, 128, 128)
    assert by_path["layers/q_proj"].spec == (None, "fsdp", "tp")
    assert by_path["layers/o_proj"].spec == (None, "tp", "fsdp")
    assert by_path["embed"].spec == ("tp", "fsdp")
    assert not by_path["layers/input_norm"].decays and by_path["layers/down_proj"].decays
    assert qwen3.num_params(preset("tiny")) == 410_368


_init = jax.jit(build_programs(MODEL, TRAIN, OptimizerConfig())["init"].fn)


def _init_outputs(seed: int):
    return _init(jnp.uint32(seed))


def test_init_is_deterministic_per_seed():
    first, again, other = _init_outputs(7), _init_outputs(7), _init_outputs(8)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    specs = qwen3.param_specs(MODEL)
    n = len(specs)
    for spec, a, b in zip(specs, first, other):
        if spec.init_std is None:
            np.testing.assert_array_equal(a, np.ones(spec.shape, np.float32))
        else:
            assert not np.array_equal(a, b), spec.path
            assert abs(float(np.std(a)) / spec.init_std - 1) < 0.15, spec.path
    for moment in first[n:]:
        assert not np.any(moment)


def test_init_on_a_sharded_mesh_is_bitwise_the_single_device_init():
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("fsdp", "tp"))
    program = build_programs(MODEL, TRAIN, OptimizerConfig(), mesh)["init"]
    shardings = tuple(NamedSharding(mesh, P(*t.spec)) for t in program.outputs)
    sharded = jax.jit(program.fn, out_shardings=shardings)(jnp.uint32(7))
    for a, b in zip(sharded, _init_outputs(7)):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_grad_step_accumulates_micro_batches_as_one_batch():
    half = dataclasses.replace(TRAIN, micro_batch=2)
    full = dataclasses.replace(TRAIN, micro_batch=4)
    opt = OptimizerConfig()
    params = random_params(MODEL, 5)
    specs = qwen3.param_specs(MODEL)
    flat = [params[s.path] for s in specs]
    zeros = [jnp.zeros(s.shape, jnp.float32) for s in specs]
    tokens, targets, mask = arithmetic_batch(4, 16, seed=2)
    step_half = jax.jit(build_programs(MODEL, half, opt)["grad_step"].fn)
    step_full = jax.jit(build_programs(MODEL, full, opt)["grad_step"].fn)

    out_a = step_half(*flat, *zeros, tokens[:2], targets[:2], mask[:2])
    n = len(specs)
    out_b = step_half(*flat, *out_a[:n], tokens[2:], targets[2:], mask[2:])
    out_ab = step_full(*flat, *zeros, tokens, targets, mask)
    for got, want in zip(out_b[:n], out_ab[:n]):
        assert_close_to_scale(got, want, 1e-5)
    np.testing.assert_allclose(out_a[n] + out_b[n], out_ab[n], rtol=1e-5)
    assert float(out_a[n + 1] + out_b[n + 1]) == float(out_ab[n + 1]) == float(mask.sum())


def test_bfloat16_compute_tracks_float32_and_keeps_float32_gradients():
    params = random_params(MODEL, 6)
    batch = arithmetic_batch(2, 16, seed=4)
    value_32, _ = loss_and_grads(TRAIN, params, batch)
    value_16, grads_16 = loss_and_grads(dataclasses.replace(TRAIN, compute_dtype="bfloat16"),
                                        params, batch)
    np.testing.assert_allclose(float(value_16), float(value_32), rtol=2e-2)
    assert all(g.dtype == jnp.float32 for g in grads_16.values())
