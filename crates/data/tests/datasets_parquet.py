"""Writes the same rows twice with Hugging Face `datasets`, as Parquet (`Dataset.to_parquet`, what
the hub serves) and as JSON lines (`Dataset.to_json`): the reference of crates/data/tests/parquet.rs,
which runs this script (no golden files) and checks that podctl reads both to the same examples.

    python datasets_parquet.py OUT_DIR

writes into OUT_DIR:
    gsm8k.parquet, gsm8k.jsonl         tests/fixtures/gsm8k/train.jsonl (GSM8K's format), row groups
                                       of 16 rows, plus an `id` column
    gsm8k_shards/train-0000{0,1}-of-00002.parquet   the same rows as two shards, as the hub splits
    chat.parquet, chat.jsonl           conversations (`messages`: system, user, assistant turns, some
                                       with reasoning) and a `source` column, row groups of 8
    renamed.parquet                    the GSM8K rows with columns `problem` and `solution`
    no_answer.parquet                  the GSM8K rows without their `answer` column
    zstd.parquet                       the GSM8K rows compressed with zstd (by pyarrow)

Run with the test venv (scripts/setup.sh: `datasets` and `pyarrow` are pinned in
scripts/requirements/data.txt).
"""

import json
import os
import sys

import datasets
import pyarrow.parquet as pq

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def conversations():
    rows = []
    for i in range(40):
        a, b = 17 + i, 5 + 3 * i
        messages = [
            {"role": "system", "content": "Answer with the number after ####."},
            {"role": "user", "content": f"What is {a} + {b}?"},
            {"role": "assistant", "content": f"{a} + {b} = {a + b}\n#### {a + b}"},
        ]
        if i % 3 == 0:
            messages += [
                {"role": "user", "content": f"And {a} - {b}?"},
                {"role": "assistant", "content": f"{a} - {b} = {a - b}\n#### {a - b}"},
            ]
        rows.append({"messages": messages, "source": f"synthetic-{i % 4}"})
    return rows


def main():
    out = sys.argv[1]
    datasets.disable_progress_bars()
    with open(os.path.join(ROOT, "tests/fixtures/gsm8k/train.jsonl")) as f:
        gsm8k = [dict(json.loads(line), id=i) for i, line in enumerate(f)]
    rows = datasets.Dataset.from_list(gsm8k)
    rows.to_parquet(os.path.join(out, "gsm8k.parquet"), batch_size=16)
    rows.to_json(os.path.join(out, "gsm8k.jsonl"), lines=True, force_ascii=False)
    shards = os.path.join(out, "gsm8k_shards")
    os.makedirs(shards)
    for i in range(2):
        rows.shard(2, i, contiguous=True).to_parquet(
            os.path.join(shards, f"train-{i:05d}-of-00002.parquet"), batch_size=16
        )
    rows.rename_columns({"question": "problem", "answer": "solution"}).to_parquet(
        os.path.join(out, "renamed.parquet")
    )
    rows.remove_columns(["answer"]).to_parquet(os.path.join(out, "no_answer.parquet"))
    # `to_parquet` picks its own codec (snappy); zstd through its writer, pyarrow.
    pq.write_table(rows.data.table, os.path.join(out, "zstd.parquet"), compression="zstd")

    chat = datasets.Dataset.from_list(conversations())
    chat.to_parquet(os.path.join(out, "chat.parquet"), batch_size=8)
    chat.to_json(os.path.join(out, "chat.jsonl"), lines=True, force_ascii=False)

    groups = {
        name: pq.ParquetFile(os.path.join(out, name)).num_row_groups
        for name in ("gsm8k.parquet", "chat.parquet")
    }
    json.dump({"datasets": datasets.__version__, "row_groups": groups}, sys.stdout)


if __name__ == "__main__":
    main()
