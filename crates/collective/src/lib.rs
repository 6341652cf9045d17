//! Ring all-reduce of gradients between slices over TCP
