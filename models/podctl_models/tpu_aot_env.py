"""Importing this module prepares the environment for compiling against TPU topologies with
libtpu on a machine without TPUs. Import it before JAX."""

import os

# What JAX sets on a machine without TPUs, plus values that silence libtpu's warnings; before
# JAX is imported. Lowering and everything else stay on the CPU backend.
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-8")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("TPU_WORKER_ID", "0")
# Compiling needs no chip: let other processes on this machine load libtpu at the same time.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ["JAX_PLATFORMS"] = "cpu"
