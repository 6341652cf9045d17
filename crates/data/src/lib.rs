//! Deterministic training data: a synthetic arithmetic task, JSONL and token files, tokenizers
