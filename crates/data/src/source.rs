//! Examples and the sources that serve them by index.

use crate::Result;
use crate::chat::Message;
use std::collections::BTreeMap;

/// A row's columns beyond those that make its prompt and answer (ids, metadata, a reference
/// solution), by name: what a reward function receives as keyword arguments.
pub type Columns = BTreeMap<String, serde_json::Value>;

/// One example.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    /// What the model is conditioned on.
    pub prompt: Prompt,
    /// The reference answer: the continuation SFT learns for a text prompt, what the numeric
    /// reward and evaluation's exact match compare with (for verifiable tasks it ends in
    /// `#### <number>`). For a conversation: its last assistant turn after the prompt, else the
    /// row's `answer` column, else empty.
    pub answer: String,
    /// The row's other columns.
    pub columns: Columns,
}

impl Example {
    /// A text prompt and its answer, no other columns.
    pub fn text(prompt: impl Into<String>, answer: impl Into<String>) -> Self {
        Self { prompt: Prompt::Text(prompt.into()), answer: answer.into(), columns: Columns::new() }
    }
}

/// What an example prompts with.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text (GSM8K's question), rendered as a user turn when the job has `data.chat`.
    Text(String),
    /// A conversation (`kind: chat`).
    Chat(Conversation),
}

impl Prompt {
    /// The prompt for people (samples, logs): the text, or a conversation's last user turn.
    pub fn display(&self) -> String {
        match self {
            Prompt::Text(text) => text.clone(),
            Prompt::Chat(conversation) => conversation
                .prompt()
                .iter()
                .rev()
                .find(|message| message.role() == "user")
                .and_then(Message::content)
                .unwrap_or_default(),
        }
    }
}

/// A conversation: its turns, and how many of them prompt a model (through the last user turn;
/// what follows is what the model is to answer).
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    /// Every turn.
    pub messages: Vec<Message>,
    /// The turns through the last user turn.
    pub prompt_turns: usize,
}

impl Conversation {
    /// `messages`, prompting through the last user turn (all of them when there is none).
    pub fn new(messages: Vec<Message>) -> Self {
        let prompt_turns =
            messages.iter().rposition(|message| message.role() == "user").map_or(messages.len(), |i| i + 1);
        Self { messages, prompt_turns }
    }

    /// The turns a model is prompted with (GRPO's prompt-only form, evaluation).
    pub fn prompt(&self) -> &[Message] {
        &self.messages[..self.prompt_turns]
    }

    /// The text of the last assistant turn after the prompt, if any.
    pub fn reply(&self) -> Option<String> {
        self.messages[self.prompt_turns..]
            .iter()
            .rev()
            .find(|m| m.role() == "assistant")
            .and_then(Message::content)
    }
}

/// Examples addressed by a `u64` index. Implementations are pure: the same index always yields
/// the same example, and no call changes what another call returns.
pub trait ExampleSource: Send + Sync {
    /// How many examples there are, or `None` for an endless stream (served in index order, with
    /// no epochs).
    fn num_examples(&self) -> Option<u64>;

    /// The example at `index`.
    fn example(&self, index: u64) -> Result<Example>;

    /// Where example `index` comes from, for messages (`train.parquet row 12`).
    fn locate(&self, index: u64) -> String {
        format!("example {index}")
    }

    /// Reads ahead what examples `indices` need (sorted, distinct), all at once; returns what
    /// that took. Sources with nothing to read ahead do nothing.
    fn prefetch(&self, _indices: &[u64]) -> Result<Prefetched> {
        Ok(Prefetched::default())
    }
}

/// What a [`ExampleSource::prefetch`] read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prefetched {
    /// Examples asked for.
    pub examples: u64,
    /// Units of the source they fall in (Parquet row groups), of how many.
    pub parts: u64,
    /// See `parts`.
    pub parts_total: u64,
    /// Bytes of the files those parts span, of the files' total.
    pub bytes: u64,
    /// See `bytes`.
    pub bytes_total: u64,
}
