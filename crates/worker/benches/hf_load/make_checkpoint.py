"""Writes a Qwen3-1.7B-shaped random bf16 checkpoint with transformers' `save_pretrained`, in 2
shards with an index (about 3.4 GB; never committed), for the loading benchmark:

    .venv-hf/bin/python crates/worker/benches/hf_load/make_checkpoint.py DIR

The published Qwen3-1.7B config.json's dimensions (vocab 151,936, hidden 2,048, 28 layers,
16 query and 8 key/value heads of 128, intermediate 6,144, tied embeddings); weights drawn by
transformers' own initialization, directly in bfloat16.
"""

import sys
from pathlib import Path

import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM


def main() -> int:
    out = Path(sys.argv[1])
    transformers.utils.logging.disable_progress_bar()
    config = Qwen3Config(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                         num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
                         rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=151643,
                         eos_token_id=151645)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM._from_config(config, dtype=torch.bfloat16)
    # Two shards, as the published checkpoint has.
    model.save_pretrained(out, max_shard_size="2GB")
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {out}: {size / 1e9:.2f} GB ({', '.join(sorted(p.name for p in out.iterdir()))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
