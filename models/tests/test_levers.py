"""Memory levers: blockwise attention equals plain attention; LoRA trains only its adapters."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podctl_models import attention, qwen3
from podctl_models.config import ConfigError, OptimizerConfig, TrainConfig, preset
from podctl_models.export import BundleConfig, export_programs, manifest, resolve, write_bundle
from podctl_models.programs import TensorSpec, build_programs

from conftest import MESH_2X2, arithmetic_batch, assert_close_to_scale


def _qkv(seed, b=2, t=24, kv=2, g=3, hd=8):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (b, t, kv, g, hd), jnp.float32) * hd ** -0.5
    k = jax.random.normal(keys[1], (b, t, kv, hd), jnp.float32)
    v = jax.random.normal(keys[2], (b, t, kv, hd), jnp.float32)
    return q, k, v


@pytest.mark.parametrize("block", [4, 8, 24, 7])
@pytest.mark.parametrize("padded", [False, True])
def test_blockwise_equals_plain_forward_and_gradients(block, padded):
    q, k, v = _qkv(0)
    t = q.shape[1]
    start = jnp.array([0, 5], jnp.int32) if padded else None
    _, mask = qwen3.positions_and_mask(t, start)
    w = jax.random.normal(jax.random.key(1), q.shape, jnp.float32)

    def plain(q, k, v):
        return qwen3.attention_core(q, k, v, mask)

    def blockwise(q, k, v):
        return attention.blockwise_attention(q, k, v, start, block)

    np.testing.assert_allclose(blockwise(q, k, v), plain(q, k, v), atol=1e-5, rtol=1e-5)
    grads = [jax.grad(lambda *a: jnp.sum(f(*a) * w), argnums=(0, 1, 2))(q, k, v)
             for f in (plain, blockwise)]
    for want, got in zip(*grads):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_block_size_divides_the_sequence():
    assert attention.block_size(2048, 512) == 512
    assert attention.block_size(24, 7) == 6
    assert attention.block_size(16, 512) == 16


def test_blockwise_model_matches_xla_model_loss_and_gradients():
    model = preset("tiny")
    tokens, targets, mask = arithmetic_batch(4, 32, seed=3)
    params = qwen3.init_params(model, jnp.uint32(0), jnp.float32)
    results = []
    for impl in ("xla", "blockwise"):
        train = TrainConfig(micro_batch=4, seq_len=32, loss_chunk=16, attention=impl,
                            attention_block=8)
        fn = jax.jit(jax.value_and_grad(
            lambda p: qwen3.sft_loss(p, tokens, targets, mask, model, train)[0]))
        results.append(fn(params))
    (loss_x, grads_x), (loss_b, grads_b) = results
    np.testing.assert_allclose(loss_b, loss_x, rtol=1e-5)
    for path in grads_x:
        np.testing.assert_allclose(grads_b[path], grads_x[path], atol=1e-5, rtol=1e-4,
                                   err_msg=path)


def test_blockwise_lowers_without_a_whole_sequence_score_matrix():
    model = preset("tiny")
    seq = 96  # no dimension of the tiny model
    train = TrainConfig(micro_batch=2, seq_len=seq, loss_chunk=16, attention="blockwise",
                        attention_block=16)
    tokens = jnp.zeros((2, seq), jnp.int32)
    params = qwen3.init_params(model, jnp.uint32(0), jnp.float32)
    text = jax.jit(jax.grad(lambda p: qwen3.sft_loss(p, tokens, tokens, jnp.ones((2, seq)),
                                                      model, train)[0])).lower(params).as_text()
    assert "x96x96x" not in text and "<96x96x" not in text
    xla = TrainConfig(micro_batch=2, seq_len=seq, loss_chunk=16)
    text = jax.jit(jax.grad(lambda p: qwen3.sft_loss(p, tokens, tokens, jnp.ones((2, seq)),
                                                      model, xla)[0])).lower(params).as_text()
    assert "x96x96x" in text  # the plain path's [b, kv, g, T, T] scores


def test_pallas_on_cpu_falls_back_to_blockwise(capsys):
    cfg = BundleConfig(preset("tiny"), TrainConfig(attention="pallas"))
    resolved = resolve(cfg)
    assert resolved.train.attention == "blockwise"
    assert "uses 'blockwise'" in capsys.readouterr().err
    assert resolve(BundleConfig(preset("tiny"), TrainConfig(attention="pallas"),
                                platform="tpu")).train.attention == "pallas"


def test_unknown_attention_and_bad_lora_are_refused():
    for train, field in ((TrainConfig(attention="flash"), "train.attention"),
                         (TrainConfig(lora_rank=4, lora_targets=("q_proj", "nope")),
                          "train.lora_targets"),
                         (TrainConfig.grpo(8, 8, 4, lora_rank=4), "train.lora_rank")):
        with pytest.raises(ConfigError, match=field):
            train.validate()


LORA = TrainConfig(micro_batch=8, seq_len=32, loss_chunk=16, lora_rank=4, lora_alpha=8.0,
                   lora_targets=("q_proj", "v_proj", "o_proj", "down_proj"))


def test_lora_trains_only_its_adapters_and_drives_the_loss_down():
    model = preset("tiny")
    programs = build_programs(model, LORA, OptimizerConfig(weight_decay=0.0))
    f = len(qwen3.param_specs(model))
    n = len(programs["zero_grads"].outputs)
    assert n == 2 * len(LORA.lora_targets)
    assert [t.name for t in programs["grad_step"].inputs[:f]] == [
        f"frozen/{s.path}" for s in qwen3.param_specs(model)]
    assert all(t.dtype == "bfloat16" for t in programs["grad_step"].inputs[:f])
    grad_step = jax.jit(programs["grad_step"].fn)
    apply_step = jax.jit(programs["apply_step"].fn)
    state = jax.jit(programs["init"].fn)(jnp.uint32(0))
    base, params = state[:f], state[f:f + n]
    mu, nu = state[f + n:f + 2 * n], state[f + 2 * n:]
    # The base is a full bundle's init, in bf16; B starts at zero (training starts at the base).
    full = jax.jit(build_programs(model, TrainConfig(), OptimizerConfig())["init"].fn)(
        jnp.uint32(0))
    for got, want in zip(base, full[:f]):
        np.testing.assert_array_equal(np.asarray(got, np.float32),
                                      np.asarray(want.astype(jnp.bfloat16), np.float32))
    assert not any(np.any(np.asarray(p)) for p in params[1::2])
    before_base = [np.asarray(b) for b in base]
    before = [np.asarray(p) for p in params]
    grads = jax.jit(programs["zero_grads"].fn)()
    tokens, targets, mask = arithmetic_batch(8, 32, seed=0)
    losses = []
    for step in range(1, 31):
        out = grad_step(*base, *params, *grads, tokens, targets, mask)
        grads, loss_sum, count = out[:n], out[n], out[n + 1]
        losses.append(float(loss_sum / count))
        out = apply_step(*params, *mu, *nu, *grads, jnp.int32(step), jnp.float32(1e-2),
                         1.0 / count)
        params, mu, nu, grads = out[:n], out[n:2 * n], out[2 * n:3 * n], out[3 * n:4 * n]
    for b, was in zip(base, before_base):
        np.testing.assert_array_equal(np.asarray(b), was)
    assert all(np.any(np.asarray(p) != was) for p, was in zip(params, before))
    assert losses[-1] < 0.7 * losses[0], losses


def test_lora_equals_the_merged_model():
    """A forward with adapters equals the base with `W + A @ B * alpha / r` merged in."""
    model = preset("tiny")
    train = TrainConfig(micro_batch=2, seq_len=16, loss_chunk=16, lora_rank=4, lora_alpha=8.0,
                        lora_targets=("q_proj", "up_proj"))
    base = qwen3.init_params(model, jnp.uint32(0), jnp.float32)
    adapters = qwen3.init_lora(model, train, jnp.uint32(0), jnp.float32)
    adapters = {k: v + 0.01 if k.endswith(qwen3.LORA_B) else v for k, v in adapters.items()}
    merged = dict(base)
    for target in train.lora_targets:
        path = f"layers/{target}"
        merged[path] = base[path] + adapters[path + qwen3.LORA_A] @ adapters[
            path + qwen3.LORA_B] * (train.lora_alpha / train.lora_rank)
    tokens = jnp.arange(32, dtype=jnp.int32).reshape(2, 16) % 100
    plain_train = TrainConfig(micro_batch=2, seq_len=16, loss_chunk=16)
    np.testing.assert_allclose(qwen3.logits({**base, **adapters}, tokens, model, train),
                               qwen3.logits(merged, tokens, model, plain_train),
                               atol=2e-4, rtol=2e-4)


def test_lora_and_blockwise_bundle_manifest():
    cfg = BundleConfig(preset("tiny"), TrainConfig(micro_batch=4, seq_len=32, loss_chunk=16,
                                                   attention="blockwise", attention_block=8,
                                                   lora_rank=4, lora_targets=("q_proj",)),
                       mesh=MESH_2X2)
    document = manifest(cfg, export_programs(cfg))
    assert document["train"]["attention"] == "blockwise"
    assert document["train"]["lora"] == {"rank": 4, "alpha": 16.0, "targets": ["q_proj"],
                                         "base_dtype": "bfloat16"}
    assert [p["name"] for p in document["params"]] == [
        "params/layers/q_proj.lora_a", "params/layers/q_proj.lora_b"]
    assert document["params"][0]["sharding"] == [[], ["fsdp"], []]
    assert document["params"][1]["sharding"] == [[], [], ["tp"]]
    assert len(document["frozen"]) == len(qwen3.param_specs(preset("tiny")))
    init_outputs = [t["name"] for t in document["programs"]["init"]["outputs"]]
    assert init_outputs[0] == "frozen/embed" and len(init_outputs) == len(document["frozen"]) + 6


def test_optimizer_offload_keeps_adamw_state_in_host_memory(tmp_path):
    """A TPU bundle with offload marks the moments `pinned_host` wherever they cross a program
    boundary, and libtpu compiles `apply_step` with exactly them as host arguments."""
    cfg = BundleConfig(preset("tiny"), TrainConfig(micro_batch=4, seq_len=32, loss_chunk=16,
                                                   optimizer_offload=True),
                       mesh=MESH_2X2, platform="tpu")
    write_bundle(cfg, tmp_path)
    document = json.loads((tmp_path / "manifest.json").read_text())
    assert document["train"]["optimizer_offload"] is True
    for program in ("init", "apply_step"):
        entry = document["programs"][program]
        for tensor in entry["inputs"] + entry["outputs"]:
            want = "pinned_host" if tensor["name"].startswith("opt/") else None
            assert tensor.get("memory_kind") == want, (program, tensor)
    grad_step = document["programs"]["grad_step"]
    assert all("memory_kind" not in t for t in grad_step["inputs"] + grad_step["outputs"])
    # Compiling needs libtpu's environment: a child process, as podctl's planner does.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-m", "podctl_models.compiled_memory", str(tmp_path), "--program",
         "apply_step", "--topology", "v6e:2x2"], env=env, capture_output=True, text=True,
        timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    sizes = {"fsdp": 2, "tp": 2}
    moments = sum(TensorSpec(t["name"], tuple(t["shape"]), t["dtype"],
                             tuple(a[0] if a else None for a in t["sharding"])).shard_bytes(sizes)
                  for t in document["params"]) * 2
    # Host bytes are laid out like device bytes (padded), so at least the dense moments.
    assert stats["host_argument"] >= moments and stats["host_output"] == stats["host_argument"]
    assert stats["host_argument"] < 2 * moments


def test_optimizer_offload_is_refused_on_cpu():
    cfg = BundleConfig(preset("tiny"), TrainConfig(optimizer_offload=True), mesh=MESH_2X2)
    with pytest.raises(ConfigError, match="train.optimizer_offload on platform 'cpu'"):
        cfg.validate()


def test_a_sequence_axis_computes_the_same_step():
    """A mesh with a sequence axis (fsdp=2, sp=2: activations split over time, parameters over
    fsdp and sp together) gives the grad step of the plain (fsdp=2, tp=2) mesh."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    model, train = preset("tiny"), TrainConfig(micro_batch=4, seq_len=32, loss_chunk=16)
    tokens, targets, mask = arithmetic_batch(4, 32, seed=9)
    params = qwen3.init_params(model, jnp.uint32(3), jnp.float32)
    results = []
    for axes in (("fsdp", "tp", "sp"), ("fsdp", "sp", "tp")):
        mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2, 1), axes)
        program = build_programs(model, train, OptimizerConfig(), mesh)["grad_step"]
        shardings = tuple(NamedSharding(mesh, P(*t.spec)) for t in program.inputs)
        flat = [params[s.path] for s in qwen3.param_specs(model)]
        zeros = [jnp.zeros_like(p) for p in flat]
        out = jax.jit(program.fn, in_shardings=shardings)(*flat, *zeros, tokens, targets, mask)
        results.append([np.asarray(x) for x in out])
    assert any("sp" in str(t.spec) for t in program.inputs)
    for plain, split in zip(*results):
        assert_close_to_scale(split, plain, 1e-5)
