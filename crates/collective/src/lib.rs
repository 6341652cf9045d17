//! Ring all-reduce of gradients between slices over TCP.
//!
//! Inside a slice XLA runs the collectives; across slices each worker all-reduces its gradient
//! shards with the workers holding the same shard position in every other slice. This crate is
//! that data plane: it moves and sums little-endian float32/bfloat16 byte buffers between
//! processes.
//!
//! # Bitwise reproducible, whatever the placement
//! A group has D logical ranks (the data-parallel size) placed on P <= D processes; when a slice
//! is preempted the survivors host several logical ranks each and D stays the same. The ring runs
//! over logical ranks: rank `r` sends to `r + 1`, over TCP when the two live in different
//! processes and through an in-memory pipe when they share one, with the same frames and the same
//! arithmetic. Segment `j` of a buffer (the `j`-th of D balanced segments) is summed as
//! `((x_j + x_{j+1}) + x_{j+2}) + ... + x_{j-1}` (ranks mod D; each add is `incoming + local`),
//! then copied to every rank. So every element's summation order is a function of D and the
//! buffer length only, never of placement, chunk size or timing, and all ranks end with identical
//! bits. A float32 add is one IEEE-754 add. A bfloat16 add widens both operands to float32
//! (exact), adds in float32 and rounds the sum back to bfloat16 to nearest, ties to even (NaN
//! stays a quiet NaN); the partial sum travels as bfloat16, so it is rounded after every add.
//!
//! # Layout
//! - `spec`: [`GroupSpec`] (who is in the group) and [`Config`] (timeouts, chunk size).
//! - `endpoint`: [`Endpoint`], the listener, and forming a [`Group`] with a handshake that carries
//!   job, generation and link, refusing mismatches (a stale generation cannot join).
//! - `group`: [`Group`] and [`Round`], the bucketed streaming API the worker drives.
//! - `engine`: the sender and receiver threads of each local rank.
//! - `plan`: the ring schedule and chunking as pure arithmetic.
//! - `reduce`: the sums and the bfloat16 rounding rule.
//! - `transport`: TCP and in-memory links, and the [`Filter`] hook for partitions in tests.
//! - `wire`: byte layouts of the handshake and frames.
//! - `abort`: [`AbortHandle`].
//!
//! # Failure
//! Every network wait while a bucket is in flight is bounded by `Config::io_timeout`; forming is
//! bounded by `Config::connect_timeout`. The first error ends the group: the member tells the
//! next member why (so a dead peer is reported as [`Error::PeerLost`] around the ring, not as a
//! hang), shuts its sockets, and every later call returns the same error. Recovery is forming the
//! next generation's group.
//!
//! **Architecture Invariant:** this crate knows nothing of the coordinator, PJRT or bundles; it
//! depends only on `mesh` for the [`DType`](mesh::DType) vocabulary.
//!
//! **API Boundary:** [`Endpoint`], [`Group`], [`Round`], [`Buffer`], [`AbortHandle`],
//! [`Filter`].
//!
//! # Example
//! ```
//! use podctl_collective::{AbortHandle, Buffer, Config, Endpoint, GroupSpec};
//! # fn main() -> Result<(), podctl_collective::Error> {
//! // Two logical ranks hosted by this one process (a group degraded to one member).
//! let endpoint = Endpoint::bind("127.0.0.1:0".parse().unwrap())?;
//! let spec = GroupSpec {
//!     job: "demo".into(),
//!     generation: 1,
//!     members: vec![endpoint.local_addr()],
//!     placement: vec![0, 0],
//!     me: 0,
//! };
//! let group = endpoint.form(&spec, &Config::default(), &AbortHandle::new())?;
//! let mut round = group.round(1)?;
//! round.submit(0, 0, Buffer::from_f32(&[1.0, 2.0]))?;
//! round.submit(0, 1, Buffer::from_f32(&[10.0, 20.0]))?;
//! let sums = round.finish()?;
//! assert_eq!(sums[0][1].to_f32()?, vec![11.0, 22.0]);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod abort;
mod buffer;
mod endpoint;
mod engine;
mod error;
mod group;
mod plan;
mod queue;
mod reduce;
mod spec;
mod transport;
mod wire;

pub use abort::AbortHandle;
pub use buffer::Buffer;
pub use endpoint::Endpoint;
pub use error::{Error, Result};
pub use group::{Group, MAX_BUCKETS, Round};
pub use spec::{Config, DEFAULT_CHUNK_BYTES, GroupSpec, MAX_JOB_LEN, MAX_RANKS};
pub use transport::{FaultFilter, Filter, Link, Verdict};
