//! One per host: compiles the bundle, runs the step on the host's devices, syncs and saves
