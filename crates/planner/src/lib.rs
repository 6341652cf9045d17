//! Analytic per-chip memory model and the search for a mesh and batch that fit
