"""transformers' side of the loading benchmark: `from_pretrained` of a directory in one process,
timed from the call to the loaded model (imports excluded), with the process's peak RSS; then
every weight read once (`p.sum()`), timed apart: a checkpoint in the dtype asked for is mapped,
not read, by `from_pretrained`, so its weights are first read by the first forward pass.

    .venv-hf/bin/python crates/worker/benches/hf_load/transformers_load.py DIR [bfloat16|float32]

Prints one JSON line: {"seconds", "read_seconds", "peak_rss", "rss_before", "param_bytes"}.
"""

import json
import resource
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


def rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(2)
    dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "bfloat16")
    before = rss()
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=dtype)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    with torch.no_grad():
        for p in model.parameters():
            p.sum()
    read_seconds = time.perf_counter() - start
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps({"seconds": seconds, "read_seconds": read_seconds, "peak_rss": peak,
                      "rss_before": before, "param_bytes": param_bytes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
