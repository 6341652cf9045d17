//! Examples and the sources that serve them by index.

use crate::Result;
use serde::{Deserialize, Serialize};

/// One supervised example: the model sees `prompt` and learns to continue with `answer`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Example {
    /// The text the model is conditioned on (not trained on).
    pub prompt: String,
    /// The continuation the loss is computed on; for verifiable tasks it ends in `#### <number>`.
    pub answer: String,
}

/// Examples addressed by a `u64` index. Implementations are pure: the same index always yields
/// the same example, and no call changes what another call returns.
pub trait ExampleSource: Send + Sync {
    /// How many examples there are, or `None` for an endless stream (served in index order, with
    /// no epochs).
    fn num_examples(&self) -> Option<u64>;

    /// The example at `index`.
    fn example(&self, index: u64) -> Result<Example>;
}
