//! The exported train step: StableHLO programs plus a manifest, loaded and validated
