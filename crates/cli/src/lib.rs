//! podctl: launch, plan, status, logs, stop and ckpt from a laptop or on one machine
