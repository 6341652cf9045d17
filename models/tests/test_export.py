"""Exported bundles against docs/BUNDLE.md, and refusals of settings that cannot work."""

import json
import os
import math
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax import export as jax_export
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

from podctl_models import qwen3
from podctl_models.config import ConfigError, MeshConfig, TrainConfig, preset
from podctl_models.export import BundleConfig, check_kept_args, export_programs, main
from podctl_models.programs import TensorSpec

PARAM_PATHS = [s.path for s in qwen3.param_specs(preset("tiny"))]
GRPO_TRAIN_KEYS = {"prompt_len", "max_new_tokens", "logprob_chunk"}


def validate_manifest(bundle_dir) -> dict:
    """Checks a bundle against docs/BUNDLE.md, written from the document, not from the exporter."""
    m = json.loads((bundle_dir / "manifest.json").read_text())
    assert m["format"] == "podctl-bundle/1"
    assert m["exporter"] == {"version": "0.1.0", "jax": jax.__version__}
    assert m["platform"] in ("cpu", "tpu", "cuda")
    mesh = {axis["name"]: axis["size"] for axis in m["mesh"]}
    assert len(mesh) == len(m["mesh"]) and all(size >= 1 for size in mesh.values())
    assert set(m["model"]) == {"preset", "vocab_size", "hidden_size", "num_layers", "num_heads",
                               "num_kv_heads", "head_dim", "intermediate_size", "rope_theta",
                               "rms_norm_eps", "tie_embeddings"}
    kind = m["train"]["kind"]
    assert kind in ("sft", "grpo")
    # An sft bundle that evaluates has the rollout's buffers (and the rollout program).
    decode_keys = GRPO_TRAIN_KEYS if kind == "grpo" else GRPO_TRAIN_KEYS - {"logprob_chunk"}
    assert set(m["train"]) == {"kind", "micro_batch", "seq_len", "param_dtype", "compute_dtype",
                               "remat", "loss_chunk", "attention"} | (
        decode_keys if kind == "grpo" or "rollout" in m["programs"] else set())
    assert m["train"]["remat"] in ("none", "dots", "full")
    assert m["optimizer"]["name"] == "adamw"
    assert set(m["optimizer"]) == {"name", "b1", "b2", "eps", "weight_decay", "max_grad_norm"}
    train, pdtype = m["train"], m["train"]["param_dtype"]

    def check_tensor(t, is_input):
        keys = {"name", "shape", "dtype", "sharding"} | ({"donated"} if is_input else set())
        assert set(t) == keys, t
        assert len(t["sharding"]) == len(t["shape"]), t
        used = [axis for axes in t["sharding"] for axis in axes]
        assert len(used) == len(set(used)), t
        for size, axes in zip(t["shape"], t["sharding"]):
            assert all(axis in mesh for axis in axes), t
            assert size % math.prod(mesh[axis] for axis in axes) == 0, t

    params = m["params"]
    head = [] if m["model"]["tie_embeddings"] else ["lm_head"]
    assert [p["name"] for p in params] == [f"params/{path}" for path in PARAM_PATHS + head]
    for p in params:
        check_tensor(p, False)
        assert p["dtype"] == pdtype
    by_path = {p["name"][len("params/"):]: p for p in params}
    layers = m["model"]["num_layers"]
    for path, p in by_path.items():
        assert (p["shape"][0] == layers) == path.startswith("layers/"), path

    def group(prefix, donated=None):
        out = []
        for p in params:
            t = dict(p, name=prefix + p["name"][len("params/"):])
            if donated is not None:
                t["donated"] = donated
            out.append(t)
        return out

    def scalar(name, dtype, donated=None):
        t = {"name": name, "shape": [], "dtype": dtype, "sharding": []}
        return t if donated is None else dict(t, donated=donated)

    rows, seq = train["micro_batch"], train["seq_len"]

    def per_row(name, dtype, *width, donated=None):
        t = {"name": name, "shape": [rows, *width], "dtype": dtype,
             "sharding": [["fsdp"]] + [[] for _ in width]}
        return t if donated is None else dict(t, donated=donated)

    want = {
        "init": ([scalar("seed", "uint32", False)],
                 group("params/") + group("opt/mu/") + group("opt/nu/")),
        "zero_grads": ([], group("grads/")),
        "apply_step": (group("params/", True) + group("opt/mu/", True) + group("opt/nu/", True)
                       + group("grads/", True) + [scalar("step", "int32", False),
                                                  scalar("learning_rate", "float32", False),
                                                  scalar("grad_scale", "float32", False)],
                       group("params/") + group("opt/mu/") + group("opt/nu/") + group("grads/")
                       + [scalar("grad_norm", "float32")]),
    }
    temperature = scalar("sample/temperature", "float32", False)
    if kind == "grpo" or "rollout" in m["programs"]:
        prompt, new = train["prompt_len"], train["max_new_tokens"]
        assert prompt > 0 and new > 0
        want["rollout"] = (
            group("params/", False)
            + [per_row("prompt/tokens", "int32", prompt, donated=False),
               per_row("prompt/lengths", "int32", donated=False),
               per_row("sample/seeds", "uint32", donated=False), temperature,
               scalar("sample/top_p", "float32", False),
               {"name": "sample/stop_ids", "shape": [8], "dtype": "int32", "sharding": [[]],
                "donated": False},
               scalar("sample/pad_id", "int32", False)],
            [per_row("completion/tokens", "int32", new), per_row("completion/lengths", "int32"),
             per_row("completion/logprobs", "float32", new)])
    if kind == "sft":
        batch = [per_row(f"batch/{n}", d, seq, donated=False)
                 for n, d in (("tokens", "int32"), ("targets", "int32"), ("loss_mask", "float32"))]
        want["grad_step"] = (group("params/", False) + group("grads/", True) + batch,
                             group("grads/") + [scalar("loss_sum", "float32"),
                                                scalar("token_count", "float32")])
    else:
        assert seq == prompt + new
        assert train["loss_chunk"] == (train["logprob_chunk"] or seq)
        sequence = [per_row("batch/tokens", "int32", seq, donated=False),
                    per_row("batch/targets", "int32", seq, donated=False),
                    per_row("batch/prompt_lengths", "int32", donated=False)]
        want["logprobs"] = (group("params/", False) + sequence + [temperature],
                            [per_row("logprobs", "float32", seq)])
        want["grpo_grad_step"] = (
            group("params/", False) + group("grads/", True) + sequence
            + [per_row("batch/loss_mask", "float32", seq, donated=False),
               per_row("batch/advantages", "float32", donated=False),
               per_row("batch/old_logprobs", "float32", seq, donated=False),
               per_row("batch/ref_logprobs", "float32", seq, donated=False), temperature,
               scalar("grpo/clip_low", "float32", False),
               scalar("grpo/clip_high", "float32", False),
               scalar("grpo/kl_beta", "float32", False)],
            group("grads/") + [scalar(name, "float32") for name in (
                "loss_sum", "token_count", "kl_sum", "clipped_count", "ratio_sum", "ratio_min",
                "ratio_max")])
    if "logits" in m["programs"]:
        want["logits"] = (group("params/", False) + [per_row("batch/tokens", "int32", seq,
                                                             donated=False)],
                          [per_row("logits", "float32", seq, m["model"]["vocab_size"])])
    assert set(m["programs"]) == set(want)
    for name, (inputs, outputs) in want.items():
        entry = m["programs"][name]
        assert entry["file"] == f"programs/{name}.mlirbc"
        assert entry["jax_file"] == f"programs/{name}.jaxexport"
        assert entry["inputs"] == inputs, name
        assert entry["outputs"] == outputs, name
        for t in entry["inputs"]:
            check_tensor(t, True)
        for t in entry["outputs"]:
            check_tensor(t, False)
        check_module(bundle_dir, name, entry, mesh)
    return m


def check_module(bundle_dir, name, entry, mesh):
    """The module itself: every input an argument, shardings as listed, donations aliased."""
    blob = (bundle_dir / entry["jax_file"]).read_bytes()
    exported = jax_export.deserialize(bytearray(blob))
    assert (bundle_dir / entry["file"]).read_bytes() == exported.mlir_module_serialized
    assert exported.module_kept_var_idx == tuple(range(len(entry["inputs"])))
    assert exported.nr_devices == math.prod(mesh.values())
    text = exported.mlir_module()
    signature = re.search(r"func\.func public @main\((.*?)\)\s*->", text, re.S).group(1)
    args = re.split(r"%arg\d+:", signature)[1:]
    assert len(args) == len(entry["inputs"]), name
    for arg, tensor in zip(args, entry["inputs"]):
        spec = ", ".join("{" + ", ".join(f'"{a}"' for a in axes) + "}"
                         for axes in tensor["sharding"])
        assert f"#sdy.sharding<@mesh, [{spec}]>" in arg, (name, tensor["name"], arg)
        assert ("tf.aliasing_output" in arg) == tensor["donated"], (name, tensor["name"])


def test_single_device_bundle_matches_the_contract(bundle_single):
    m = validate_manifest(bundle_single)
    assert m["mesh"] == [{"name": "fsdp", "size": 1}, {"name": "tp", "size": 1}]
    assert m["model"]["preset"] == "tiny" and m["platform"] == "cpu"


def test_2x2_bundle_matches_the_contract(bundle_2x2):
    m = validate_manifest(bundle_2x2)
    assert m["mesh"] == [{"name": "fsdp", "size": 2}, {"name": "tp", "size": 2}]
    q_proj = next(p for p in m["params"] if p["name"] == "params/layers/q_proj")
    assert q_proj == {"name": "params/layers/q_proj", "shape": [2, 128, 128], "dtype": "float32",
                      "sharding": [[], ["fsdp"], ["tp"]]}


def test_grpo_bundles_match_the_contract(grpo_bundle_single, grpo_bundle_2x2):
    for bundle in (grpo_bundle_single, grpo_bundle_2x2):
        m = validate_manifest(bundle)
        assert m["train"]["kind"] == "grpo" and m["train"]["logprob_chunk"] == 4
    assert validate_manifest(grpo_bundle_2x2)["mesh"][0] == {"name": "fsdp", "size": 2}


def test_cli_writes_an_unchunked_grpo_bundle(tmp_path, capsys):
    code = main(["--kind", "grpo", "--preset", "tiny", "--mesh", "fsdp=2", "--micro-batch", "4",
                 "--prompt-len", "6", "--max-new-tokens", "10", "--logprob-chunk", "0",
                 "--out", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "rollout" in printed and "grpo_grad_step" in printed and " grad_step " not in printed
    train = validate_manifest(tmp_path)["train"]
    assert (train["seq_len"], train["loss_chunk"], train["logprob_chunk"]) == (16, 16, 0)


def test_an_sft_bundle_that_evaluates_carries_a_rollout(tmp_path, capsys):
    code = main(["--preset", "tiny", "--micro-batch", "4", "--seq-len", "32", "--prompt-len", "6",
                 "--max-new-tokens", "4", "--out", str(tmp_path)])
    assert code == 0
    m = validate_manifest(tmp_path)
    assert list(m["programs"]) == ["init", "zero_grads", "grad_step", "apply_step", "rollout"]
    assert (m["train"]["prompt_len"], m["train"]["max_new_tokens"]) == (6, 4)
    assert "logprob_chunk" not in m["train"]
    outputs = {t["name"]: t["shape"] for t in m["programs"]["rollout"]["outputs"]}
    assert outputs["completion/tokens"] == [4, 4]


def test_cli_writes_a_valid_bundle_and_prints_a_summary(tmp_path, capsys):
    code = main(["--preset", "tiny", "--mesh", "tp=2", "--micro-batch", "4", "--seq-len", "32",
                 "--remat", "dots", "--loss-chunk", "16", "--weight-decay", "0.05",
                 "--out", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "410,368 parameters" in printed and "grad_step" in printed and " s" in printed
    m = validate_manifest(tmp_path)
    assert m["mesh"] == [{"name": "tp", "size": 2}, {"name": "fsdp", "size": 1}]
    assert m["train"]["remat"] == "dots" and m["train"]["loss_chunk"] == 16
    assert m["optimizer"]["weight_decay"] == 0.05


UNTIED = {"preset": "hf:untied", "vocab_size": 64, "hidden_size": 32, "num_layers": 2,
          "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 48,
          "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_embeddings": False}


def test_cli_exports_an_untied_model_given_as_json_with_its_logits_program(tmp_path, capsys):
    code = main(["--model-json", json.dumps(UNTIED), "--mesh", "fsdp=2,tp=2", "--micro-batch",
                 "2", "--seq-len", "8", "--loss-chunk", "8", "--with-logits",
                 "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    # embed + lm_head 2 x 64 x 32, 2 layers of q/k/v/o, MLP and norms, the final norm.
    per_layer = 32 * 64 + 2 * 32 * 32 + 64 * 32 + 3 * 32 * 48 + 2 * 32 + 2 * 16
    assert f"hf:untied: {2 * 64 * 32 + 2 * per_layer + 32:,} parameters" in capsys.readouterr().out
    m = validate_manifest(tmp_path)
    assert m["model"] == UNTIED
    head = next(p for p in m["params"] if p["name"] == "params/lm_head")
    assert head == {"name": "params/lm_head", "shape": [64, 32], "dtype": "float32",
                    "sharding": [["tp"], ["fsdp"]]}


@pytest.mark.parametrize("model_json, field", [
    ('{"preset": "x"}', "missing fields"),
    (json.dumps({**UNTIED, "rope_scaling": 2}), "unknown fields ['rope_scaling']"),
    ("[1]", "JSON object"),
    ("{", "not JSON"),
    (json.dumps({**UNTIED, "rope_theta": -1}), "model.rope_theta"),
    (json.dumps({**UNTIED, "tie_embeddings": "no"}), "model.tie_embeddings"),
])
def test_cli_refuses_a_bad_model_json(tmp_path, capsys, model_json, field):
    assert main(["--model-json", model_json, "--out", str(tmp_path / "b")]) == 2
    assert field in capsys.readouterr().err


def test_export_is_bitwise_reproducible_from_any_caller(bundle_single, tmp_path):
    assert main(["--preset", "tiny", "--out", str(tmp_path)]) == 0
    files = sorted(p.relative_to(bundle_single) for p in bundle_single.rglob("*") if p.is_file())
    assert len(files) == 9
    for name in files:
        assert (tmp_path / name).read_bytes() == (bundle_single / name).read_bytes(), name
    for name in files:
        assert b"/work/" not in (tmp_path / name).read_bytes(), name


@pytest.mark.parametrize("argv, field", [
    (["--preset", "llama-7b"], "preset"),
    ([], "give exactly one of --preset NAME or --model-json OBJECT"),
    (["--preset", "tiny", "--mesh", "tp=3"], "model.num_heads"),
    (["--preset", "tiny", "--mesh", "tp=4"], "model.num_kv_heads"),
    (["--preset", "tiny", "--mesh", "fsdp=3", "--micro-batch", "9"], "model.hidden_size"),
    (["--preset", "tiny", "--mesh", "fsdp=4", "--micro-batch", "6"], "train.micro_batch"),
    (["--preset", "qwen3-1.7b", "--mesh", "tp=16"], "model.num_kv_heads"),
    (["--preset", "tiny", "--mesh", "dp=2"], "mesh"),
    (["--preset", "tiny", "--mesh", "fsdp=two"], "mesh"),
    (["--preset", "tiny", "--mesh", "fsdp=0"], "mesh"),
    (["--preset", "tiny", "--seq-len", "100", "--loss-chunk", "64"], "train.loss_chunk"),
    (["--preset", "tiny", "--param-dtype", "float16"], "train.param_dtype"),
    (["--preset", "tiny", "--compute-dtype", "int8"], "train.compute_dtype"),
    (["--preset", "tiny", "--remat", "some"], "train.remat"),
    (["--preset", "tiny", "--attention", "flash"], "train.attention"),
    (["--preset", "tiny", "--platform", "gpu"], "platform"),
    (["--preset", "tiny", "--micro-batch", "0"], "train.micro_batch"),
    (["--preset", "tiny", "--b2", "1.5"], "optimizer.b2"),
    (["--preset", "tiny", "--max-grad-norm", "0"], "optimizer.max_grad_norm"),
    (["--preset", "tiny", "--kind", "rl"], "train.kind"),
    (["--preset", "tiny", "--prompt-len", "8"], "train.prompt_len"),
    (["--preset", "tiny", "--prompt-len", "8", "--max-new-tokens", "8", "--lora-rank", "4"],
     "train.prompt_len"),
    (["--preset", "tiny", "--logprob-chunk", "8"], "train.logprob_chunk"),
    (["--preset", "tiny", "--kind", "grpo", "--max-new-tokens", "8"], "train.prompt_len"),
    (["--preset", "tiny", "--kind", "grpo", "--prompt-len", "8"], "train.max_new_tokens"),
    (["--preset", "tiny", "--kind", "grpo", "--prompt-len", "0", "--max-new-tokens", "8"],
     "train.prompt_len"),
    (["--preset", "tiny", "--kind", "grpo", "--prompt-len", "8", "--max-new-tokens", "-8"],
     "train.max_new_tokens"),
    (["--preset", "tiny", "--kind", "grpo", "--prompt-len", "8", "--max-new-tokens", "8",
      "--logprob-chunk", "5"], "train.logprob_chunk"),
    (["--preset", "tiny", "--kind", "grpo", "--prompt-len", "8", "--max-new-tokens", "8",
      "--logprob-chunk", "-4"], "train.logprob_chunk"),
    (["--preset", "tiny", "--kind", "grpo", "--prompt-len", "8", "--max-new-tokens", "8",
      "--seq-len", "32"], "train.seq_len"),
    (["--preset", "tiny", "--kind", "grpo", "--prompt-len", "8", "--max-new-tokens", "8",
      "--loss-chunk", "8"], "train.loss_chunk"),
    (["--preset", "tiny", "--kind", "grpo", "--prompt-len", "8", "--max-new-tokens", "8",
      "--mesh", "fsdp=4", "--micro-batch", "6"], "train.micro_batch"),
])
def test_cli_refuses_bad_settings_naming_the_field(tmp_path, capsys, argv, field):
    out = tmp_path / "bundle"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and field in err, err
    assert not out.exists()


def test_a_program_that_drops_an_input_is_refused():
    mesh = AbstractMesh((1, 1), ("fsdp", "tp"))
    replicated = NamedSharding(mesh, P())
    jitted = jax.jit(lambda used, unused: used * 2, in_shardings=(replicated, replicated))
    arg = jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated)
    exported = jax_export.export(jitted, platforms=["cpu"])(arg, arg)
    inputs = (TensorSpec("kept", (), "float32", ()), TensorSpec("ignored", (), "float32", ()))
    with pytest.raises(ConfigError, match=r"program toy: JAX dropped unused inputs \['ignored'\]"):
        check_kept_args("toy", exported, inputs)


def test_qwen3_1_7b_tpu_export_runs_on_this_machine():
    model = preset("qwen3-1.7b")
    assert qwen3.num_params(model) == 1_720_574_976
    # Counted by hand: embedding (tied) + 28 x (attention + MLP + norms) + final norm.
    per_layer = (2048 * 16 * 128 * 2 + 2048 * 8 * 128 * 2 + 3 * 2048 * 6144 + 2 * 2048 + 2 * 128)
    assert qwen3.num_params(model) == 151_936 * 2048 + 28 * per_layer + 2048
    cfg = BundleConfig(model, TrainConfig(micro_batch=8, seq_len=2048, param_dtype="float32",
                                          compute_dtype="bfloat16", remat="dots"),
                       mesh=MeshConfig((("fsdp", 4), ("tp", 2))), platform="tpu")
    programs = export_programs(cfg)
    grad_step = programs["grad_step"].exported
    assert grad_step.platforms == ("tpu",) and grad_step.nr_devices == 8
    params = sum(math.prod(a.shape) for a in programs["init"].exported.out_avals[:13])
    assert params == 1_720_574_976
    tokens = grad_step.in_avals[26]
    assert tokens.shape == (8, 2048) and tokens.dtype == jnp.int32
    assert "bf16" in grad_step.mlir_module()


def test_cli_process_never_initializes_libtpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run(
        [sys.executable, "-m", "podctl_models.export", "--preset", "tiny", "--platform", "tpu",
         "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "TPU" not in done.stderr and "libtpu" not in done.stderr, done.stderr
    assert json.loads((tmp_path / "manifest.json").read_text())["platform"] == "tpu"
    done = subprocess.run([sys.executable, "-m", "podctl_models.export", "--preset", "tiny-ish",
                           "--out", str(tmp_path / "no")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: preset = 'tiny-ish' is unknown; choose one of tiny, small, qwen3-0.6b, qwen3-1.7b"]
