//! Kubernetes for podctl: the coordinator's worker pods, and reaching a coordinator from a laptop.
//!
//! On GKE the coordinator is its own controller (no JobSet, no operator): the Raft leader creates
//! the worker pods of each job, watches them, and when a pod is deleted, evicted, fails or its
//! worker hangs it replaces the pod's slice and tells the coordinator's recovery path at once,
//! while the other slices keep training; a slice that crashes the same way again and again fails
//! the job. Every job's pods and token Secret are owned by its job object, which the release
//! owns: deleting either leaves nothing running. `docs/KUBERNETES.md` tells the whole story.
//!
//! # Layout
//! - [`slice`]: a TPU slice type and the worker pod template: names, labels, GKE selectors,
//!   tolerations, TPU environment, resources and security context, the job object and the job
//!   token Secret.
//! - [`decide`]: **the decision**, a pure function of (desired jobs, observed job objects and
//!   pods, now) to actions (make a job object, create a pod, delete one, report a slice lost,
//!   fail a job that cannot fit or keeps crashing, stop one whose job object was deleted).
//! - [`declare`]: jobs declared as ConfigMaps (`podctl launch --render`, for GitOps): submitted
//!   once, stopped when their declaration is deleted.
//! - [`reconcile`]: the loop that lists and watches the API server, calls [`decide::decide`]
//!   and carries the actions out; it asks a [`reconcile::ControlPlane`] (the coordinator) what
//!   is desired and tells it what was lost.
//! - [`remote`]: from a kubeconfig context, the coordinator's client Service and addresses a
//!   laptop can dial (port-forwards through the API server), with TLS settings and the token.
//!
//! **Architecture Invariant:** this crate knows nothing of the coordinator (no openraft, no
//! gRPC): the coordinator implements [`reconcile::ControlPlane`]. Only this crate names kube.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod decide;
pub mod declare;
mod error;
pub mod reconcile;
pub mod remote;
pub mod slice;

pub use decide::{
    Action, Crash, DesiredJob, Observed, ObservedJobObject, ObservedPod, PodState, Policy, Registration,
    decide,
};
pub use declare::{Declaration, DeclaredJob};
pub use error::Error;
pub use reconcile::{ControlPlane, Controller, ControllerConfig};
pub use slice::{ObjectRef, Resources, TpuSlice, WorkerTemplate};
