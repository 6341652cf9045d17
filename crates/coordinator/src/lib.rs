//! The Raft-replicated control plane: jobs, hosts, leases, generations, checkpoints
