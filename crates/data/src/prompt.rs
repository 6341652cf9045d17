//! From examples to token ids and from completions back to text: one place that decides what a
//! prompt looks like, used alike by SFT rows, GRPO rollouts and held-out evaluation.
//!
//! A prompt is either the example's text with the tokenizer's BOS before it (when it adds one),
//! or, with `data.chat`, the example as a user turn (after an optional system turn) rendered by
//! the tokenizer's chat template with the generation prompt, then encoded with no BOS added (the
//! template writes whatever the model expects, as transformers' `apply_chat_template` does). An
//! answer is its text followed by the tokenizer's EOS (for a chat model, the end of its turn).

use crate::chat::{Message, RenderOptions};
use crate::config::ChatConfig;
use crate::tokenizer::Tokenizer;
use crate::{DataError, Result};
use std::sync::Arc;

/// Turns prompts and answers into ids and completions into text. See the module docs.
///
/// The tokenizer is shared: the training loader, the held-out evaluation and a chat and a plain
/// view of the same tokenizer hold one copy (Qwen3's takes seconds to load).
#[derive(Clone)]
pub struct Prompter {
    tokenizer: Arc<dyn Tokenizer>,
    chat: Option<ChatConfig>,
}

impl std::fmt::Debug for Prompter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prompter").field("chat", &self.chat).finish_non_exhaustive()
    }
}

impl Prompter {
    /// Prompts as plain text (with the tokenizer's BOS, if it adds one).
    pub fn plain(tokenizer: Arc<dyn Tokenizer>) -> Self {
        Self { tokenizer, chat: None }
    }

    /// Prompts rendered by the tokenizer's chat template, which it must have.
    pub fn chat(tokenizer: Arc<dyn Tokenizer>, chat: ChatConfig) -> Result<Self> {
        if tokenizer.chat_template().is_none() {
            return Err(DataError::InvalidConfig {
                field: "data.chat",
                message: "the tokenizer has no chat template (no `chat_template` in tokenizer_config.json \
                          and no chat_template.jinja); drop data.chat to use plain prompts"
                    .into(),
            });
        }
        Ok(Self { tokenizer, chat: Some(chat) })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &dyn Tokenizer {
        self.tokenizer.as_ref()
    }

    /// The shared tokenizer, for another prompter over it.
    pub fn shared_tokenizer(&self) -> Arc<dyn Tokenizer> {
        Arc::clone(&self.tokenizer)
    }

    /// Whether prompts are chat-templated.
    pub fn is_chat(&self) -> bool {
        self.chat.is_some()
    }

    /// The conversation a prompt becomes: the system turn, if any, and the user's.
    pub fn messages(&self, prompt: &str) -> Vec<Message> {
        let system = self.chat.as_ref().and_then(|chat| chat.system.as_deref());
        system
            .map(|system| Message::new("system", system))
            .into_iter()
            .chain([Message::new("user", prompt)])
            .collect()
    }

    /// The text the model is conditioned on: the rendered chat prompt, or the prompt itself.
    pub fn prompt_text(&self, prompt: &str) -> Result<String> {
        match (&self.chat, self.tokenizer.chat_template()) {
            (Some(chat), Some(template)) => {
                let options = RenderOptions { add_generation_prompt: true, kwargs: chat.template_kwargs() };
                template.render(&self.messages(prompt), &options)
            }
            _ => Ok(prompt.to_owned()),
        }
    }

    /// The ids of a prompt: the tokenizer's BOS (plain prompts only, when it adds one), then the
    /// prompt text's.
    pub fn prompt_ids(&self, prompt: &str) -> Result<Vec<u32>> {
        let text = self.prompt_text(prompt)?;
        let bos = if self.chat.is_some() { None } else { self.tokenizer.bos_id() };
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        ids.extend(bos);
        ids.extend(self.tokenizer.encode(&text)?);
        Ok(ids)
    }

    /// The ids of an answer: its text's, then EOS.
    pub fn answer_ids(&self, answer: &str) -> Result<Vec<u32>> {
        let mut ids = self.tokenizer.encode(answer)?;
        ids.push(self.tokenizer.eos_id());
        Ok(ids)
    }

    /// The ids generation stops at.
    pub fn stop_ids(&self) -> &[u32] {
        self.tokenizer.stop_ids()
    }

    /// A completion's ids up to (not including) its first stop id.
    pub fn until_stop<'a>(&self, completion: &'a [u32]) -> &'a [u32] {
        let stops = self.stop_ids();
        let end = completion.iter().position(|id| stops.contains(id)).unwrap_or(completion.len());
        &completion[..end]
    }

    /// The text of a completion before its first stop id. Ids the tokenizer cannot show become
    /// U+FFFD: a young policy samples anything, and that must score 0, not stop the run.
    pub fn completion_text(&self, completion: &[u32]) -> String {
        let ids = self.until_stop(completion);
        self.tokenizer.decode(ids).unwrap_or_else(|_| {
            ids.iter().map(|&id| self.tokenizer.decode(&[id]).unwrap_or_else(|_| "\u{FFFD}".into())).collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::CharTokenizer;
    use std::sync::Arc;

    #[test]
    fn plain_prompts_start_with_the_tokenizers_bos() {
        let prompter = Prompter::plain(Arc::new(CharTokenizer));
        assert_eq!(prompter.prompt_ids("ab").expect("ids"), [CharTokenizer::BOS, 97, 98]);
        assert_eq!(prompter.answer_ids("c").expect("ids"), [99, CharTokenizer::EOS]);
        assert_eq!(prompter.prompt_text("ab").expect("text"), "ab");
    }

    #[test]
    fn completions_end_at_the_first_stop_id() {
        let prompter = Prompter::plain(Arc::new(CharTokenizer));
        assert_eq!(prompter.completion_text(&[72, 105, CharTokenizer::EOS, 72]), "Hi");
        assert_eq!(prompter.completion_text(&[72, 105]), "Hi");
        // An id with no text becomes U+FFFD rather than an error.
        assert_eq!(prompter.completion_text(&[72, 300, 105]), "H\u{FFFD}i");
    }

    #[test]
    fn chat_needs_a_template() {
        let error = Prompter::chat(Arc::new(CharTokenizer), ChatConfig::default()).expect_err("no template");
        assert!(error.to_string().starts_with("data.chat:"), "{error}");
    }
}
