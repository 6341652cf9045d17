//! Thin safe bindings to the PJRT C API: load a plugin, compile StableHLO, move buffers, execute
