//! Sharded checkpoints streamed to object storage, committed atomically, resharded on restore
