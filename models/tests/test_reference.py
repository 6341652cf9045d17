"""The reference CLI, run as the Rust tests run it: a separate process, arrays in files."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podctl_models.config import OptimizerConfig, TrainConfig, preset
from podctl_models.programs import build_programs

from conftest import (arithmetic_batch, assert_close_to_scale, full_sequences, grpo_prompts,
                      tiny_init)

PROGRAMS = build_programs(preset("tiny"), TrainConfig(), OptimizerConfig())


def reference(*args):
    return subprocess.run([sys.executable, "-m", "podctl_models.reference", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def write_inputs(folder, arrays):
    folder.mkdir()
    for i, array in enumerate(arrays):
        array = np.asarray(array)
        array.astype(array.dtype.newbyteorder("<")).tofile(folder / f"{i}.bin")


def read_outputs(folder, program):
    return [np.fromfile(folder / f"{i}.bin", dtype=t.dtype).reshape(t.shape)
            for i, t in enumerate(program.outputs)]


def test_run_on_a_2x2_mesh_matches_single_device_jax(bundle_2x2, tmp_path):
    # init on 4 devices, from a file, is bitwise the single-device init.
    write_inputs(tmp_path / "init_in", [np.uint32(11)])
    done = reference("run", "--bundle", bundle_2x2, "--program", "init",
                     "--inputs", tmp_path / "init_in", "--outputs", tmp_path / "init_out")
    assert done.returncode == 0, done.stderr
    state = read_outputs(tmp_path / "init_out", PROGRAMS["init"])
    want_state = tiny_init(jnp.uint32(11))
    for got, want in zip(state, want_state):
        np.testing.assert_array_equal(got, np.asarray(want))

    # grad_step on 4 devices equals the unsharded computation up to float32 rounding.
    n = len(state) // 3
    params = state[:n]
    grads = [np.full(p.shape, 0.5, np.float32) for p in params]
    batch = arithmetic_batch(8, 128, seed=3)
    write_inputs(tmp_path / "grad_in", [*params, *grads, *batch])
    done = reference("run", "--bundle", bundle_2x2, "--program", "grad_step",
                     "--inputs", tmp_path / "grad_in", "--outputs", tmp_path / "grad_out")
    assert done.returncode == 0, done.stderr
    got = read_outputs(tmp_path / "grad_out", PROGRAMS["grad_step"])
    want = jax.jit(PROGRAMS["grad_step"].fn)(*params, *grads, *batch)
    for g, w in zip(got[:n], want[:n]):
        assert_close_to_scale(g - 0.5, np.asarray(w) - 0.5, 1e-5)
    np.testing.assert_allclose(got[n], want[n], rtol=1e-5)
    assert got[n + 1] == batch[2].sum()


def test_run_refuses_an_input_of_the_wrong_size(bundle_single, tmp_path):
    write_inputs(tmp_path / "in", [np.uint64(11)])
    done = reference("run", "--bundle", bundle_single, "--program", "init",
                     "--inputs", tmp_path / "in", "--outputs", tmp_path / "out")
    assert done.returncode == 2
    assert "input seed" in done.stderr and "has 8 bytes" in done.stderr and "needs 4" in done.stderr
    done = reference("run", "--bundle", bundle_single, "--program", "train",
                     "--inputs", tmp_path / "in", "--outputs", tmp_path / "out")
    assert done.returncode == 2 and "program = 'train'" in done.stderr


@pytest.mark.parametrize("client", ["jaxlib", "plugin"])
def test_bench_prints_steady_state_step_time(bundle_single, client):
    # "plugin": plain jax.jit on the xla_cpu_pjrt plugin podctl loads (the step_time bench's
    # like-with-like runtime comparison).
    done = reference("bench", "--bundle", bundle_single, "--steps", "2", "--accum", "2",
                     "--client", client)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result) == {"step_ms", "steps", "client"}
    assert result["steps"] == 2 and result["step_ms"] > 0 and result["client"] == client


def test_run_executes_grpo_programs_on_a_2x2_mesh(grpo_bundle_2x2, grpo_programs, tmp_path):
    """rollout and grpo_grad_step of a 2x2 GRPO bundle, run by the CLI from files, against the
    single-device bundle run in-process."""
    manifest = json.loads((grpo_bundle_2x2 / "manifest.json").read_text())
    train = manifest["train"]
    n = len(manifest["params"])
    params = [np.asarray(p) for p in tiny_init(jnp.uint32(9))[:n]]
    prompts, lengths = grpo_prompts(seed=2)
    sampling = [np.array([1, 2, 3, 4], np.uint32), np.float32(0.0), np.float32(1.0),
                np.full(8, -1, np.int32), np.int32(0)]
    write_inputs(tmp_path / "rollout_in", [*params, prompts, lengths, *sampling])
    done = reference("run", "--bundle", grpo_bundle_2x2, "--program", "rollout",
                     "--inputs", tmp_path / "rollout_in", "--outputs", tmp_path / "rollout_out")
    assert done.returncode == 0, done.stderr
    outputs = manifest["programs"]["rollout"]["outputs"]
    tokens, gen_lengths, logprobs = [
        np.fromfile(tmp_path / "rollout_out" / f"{i}.bin", t["dtype"]).reshape(t["shape"])
        for i, t in enumerate(outputs)]
    want = grpo_programs("rollout", *params, prompts, lengths, *sampling)
    np.testing.assert_array_equal(tokens, want[0])
    np.testing.assert_array_equal(gen_lengths, want[1])
    np.testing.assert_allclose(logprobs, want[2], rtol=0, atol=1e-5)

    prompt_len, seq = train["prompt_len"], train["seq_len"]
    sequence, targets = full_sequences(prompts, tokens)
    mask = np.zeros(sequence.shape, np.float32)
    mask[:, prompt_len - 1:seq - 1] = 1.0
    old = np.zeros(sequence.shape, np.float32)
    old[:, prompt_len - 1:seq - 1] = logprobs - 0.1
    grads = [np.full(p.shape, 0.5, np.float32) for p in params]
    args = [*params, *grads, sequence, targets, lengths, mask,
            np.array([1.0, -1.0, 0.5, -0.5], np.float32), old, old + 0.2, np.float32(1.0),
            np.float32(0.2), np.float32(0.2), np.float32(0.05)]
    write_inputs(tmp_path / "step_in", args)
    done = reference("run", "--bundle", grpo_bundle_2x2, "--program", "grpo_grad_step",
                     "--inputs", tmp_path / "step_in", "--outputs", tmp_path / "step_out")
    assert done.returncode == 0, done.stderr
    outputs = manifest["programs"]["grpo_grad_step"]["outputs"]
    got = [np.fromfile(tmp_path / "step_out" / f"{i}.bin", t["dtype"]).reshape(t["shape"])
           for i, t in enumerate(outputs)]
    want = grpo_programs("grpo_grad_step", *args)
    for g, w in zip(got[:n], want[:n]):
        assert_close_to_scale(g - 0.5, np.asarray(w) - 0.5, 1e-5)
    # The GRPO loss sum is a small difference of O(1) terms (advantages of both signs, one per
    # masked token): compare it to the scale of those terms, not to itself. The 2x2 program sums
    # its shards in another order, so f32 rounding of the 32 terms alone moves it by ~4e-6.
    term_scale = float(mask.sum())
    np.testing.assert_allclose(got[n:], [float(w) for w in want[n:]], rtol=1e-5,
                               atol=1e-6 * term_scale)
    assert got[n + 1] == mask.sum() == 32


def test_bench_refuses_a_grpo_bundle(grpo_bundle_single):
    done = reference("bench", "--bundle", grpo_bundle_single, "--steps", "1")
    assert done.returncode == 2
    assert "train.kind is 'grpo'" in done.stderr and "--kind sft" in done.stderr
