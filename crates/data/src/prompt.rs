//! From examples to token ids and from completions back to text: one place that decides what a
//! prompt looks like, used alike by SFT rows, GRPO rollouts and held-out evaluation.
//!
//! A text prompt is either the example's text with the tokenizer's BOS before it (when it adds
//! one), or, with `data.chat`, the example as a user turn (after an optional system turn)
//! rendered by the tokenizer's chat template with the generation prompt, then encoded with no BOS
//! added (the template writes whatever the model expects, as transformers' `apply_chat_template`
//! does). An answer is its text followed by the tokenizer's EOS (for a chat model, the end of its
//! turn). A conversation (`kind: chat`) prompts with its turns through the last user turn, and
//! trains on the whole of it, the loss on what the template's `{% generation %}` blocks mark
//! (TRL's `assistant_only_loss`: transformers' `return_assistant_tokens_mask`).

use crate::chat::{ChatTemplate, Message, RenderOptions};
use crate::config::ChatConfig;
use crate::source::{Conversation, Prompt};
use crate::tokenizer::Tokenizer;
use crate::{DataError, Result};
use std::ops::Range;
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

    /// Whether prompts are chat-templated (conversations, as TRL's reward functions see them).
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

    /// The messages a prompt is (for a reward function in TRL's conversational form): a
    /// conversation's prompt turns, or a text prompt's system and user turns.
    pub fn prompt_messages(&self, prompt: &Prompt) -> Vec<Message> {
        match prompt {
            Prompt::Text(text) => self.messages(text),
            Prompt::Chat(conversation) => conversation.prompt().to_vec(),
        }
    }

    /// The text the model is conditioned on: the rendered chat prompt, or the prompt itself.
    pub fn prompt_text(&self, prompt: &Prompt) -> Result<String> {
        match (prompt, &self.chat) {
            (Prompt::Text(text), None) => Ok(text.clone()),
            (prompt, chat) => {
                let (template, options) = self.template(chat.as_ref(), true)?;
                let messages = self.prompt_messages(prompt);
                check_roles(template, &messages, &options)?;
                template.render(&messages, &options)
            }
        }
    }

    /// The ids of a prompt: the tokenizer's BOS (plain prompts only, when it adds one), then the
    /// prompt text's.
    pub fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        let text = self.prompt_text(prompt)?;
        let plain = matches!(prompt, Prompt::Text(_)) && self.chat.is_none();
        let bos = if plain { self.tokenizer.bos_id() } else { None };
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        ids.extend(bos);
        ids.extend(self.tokenizer.encode(&text)?);
        Ok(ids)
    }

    /// A whole conversation's ids and, per id, whether it is assistant output (what SFT learns):
    /// the template's rendering, with the tokens that overlap its `{% generation %}` blocks
    /// marked, exactly as transformers' `return_assistant_tokens_mask` marks them.
    pub fn conversation_ids(&self, conversation: &Conversation) -> Result<(Vec<u32>, Vec<bool>)> {
        let (template, options) = self.template(self.chat.as_ref(), false)?;
        if !template.marks_generation() {
            return Err(DataError::InvalidConfig {
                field: "data.chat.template",
                message: format!(
                    "the chat template of {} marks no assistant output with {{% generation %}} blocks, so the \
                     loss cannot be kept to the assistant's turns; name a template that marks it in \
                     data.chat.template (TRL's *_training.jinja templates do; docs/DATA.md shows one for Qwen3)",
                    template.path().display()
                ),
            });
        }
        check_roles(template, &conversation.messages, &options)?;
        let (text, spans) = template.render_spans(&conversation.messages, &options)?;
        let (ids, offsets) = self.tokenizer.encode_with_offsets(&text)?;
        let spans = char_spans(&text, &spans);
        Ok((ids, assistant_mask(&offsets, &spans)))
    }

    /// The chat template and the options it renders with.
    fn template(
        &self,
        chat: Option<&ChatConfig>,
        add_generation_prompt: bool,
    ) -> Result<(&ChatTemplate, RenderOptions)> {
        let template = self.tokenizer.chat_template().ok_or_else(|| DataError::InvalidConfig {
            field: "data.tokenizer",
            message: "conversations need a chat template, and the tokenizer has none (no `chat_template` in \
                      tokenizer_config.json, no chat_template.jinja); use the model's own tokenizer directory"
                .into(),
        })?;
        let kwargs =
            chat.map(ChatConfig::template_kwargs).unwrap_or_else(|| ChatConfig::default().template_kwargs());
        Ok((template, RenderOptions { add_generation_prompt, kwargs }))
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

/// An error naming the first message the template does not render.
fn check_roles(template: &ChatTemplate, messages: &[Message], options: &RenderOptions) -> Result<()> {
    match template.unrendered_message(messages, options) {
        None => Ok(()),
        Some(index) => Err(DataError::Field {
            field: format!("messages[{index}].role"),
            message: format!(
                "{:?} is a role the chat template of {} does not render (the turn would vanish from the \
                 prompt); use one it knows, such as system, user or assistant",
                messages[index].role(),
                template.path().display()
            ),
        }),
    }
}

/// Byte ranges of `text` as character ranges (transformers counts characters).
fn char_spans(text: &str, spans: &[Range<usize>]) -> Vec<Range<usize>> {
    let chars_before = |byte: usize| text[..byte].chars().count();
    spans.iter().map(|span| chars_before(span.start)..chars_before(span.end)).collect()
}

/// transformers' assistant mask: every token whose characters overlap a span (spans and
/// offsets both in order, one pass), so a token that straddles a span's edge counts.
fn assistant_mask(offsets: &[(usize, usize)], spans: &[Range<usize>]) -> Vec<bool> {
    let mut mask = vec![false; offsets.len()];
    let mut span = 0;
    for (token, &(start, end)) in offsets.iter().enumerate() {
        while span < spans.len() && start >= spans[span].end {
            span += 1;
        }
        if span == spans.len() {
            break;
        }
        mask[token] = end > spans[span].start;
    }
    mask
}

#[cfg(test)]
// Spans are ranges: one span is a list of one range, not a range to expand.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;
    use crate::tokenizer::CharTokenizer;
    use std::sync::Arc;

    #[test]
    fn plain_prompts_start_with_the_tokenizers_bos() {
        let prompter = Prompter::plain(Arc::new(CharTokenizer));
        let prompt = Prompt::Text("ab".into());
        assert_eq!(prompter.prompt_ids(&prompt).expect("ids"), [CharTokenizer::BOS, 97, 98]);
        assert_eq!(prompter.answer_ids("c").expect("ids"), [99, CharTokenizer::EOS]);
        assert_eq!(prompter.prompt_text(&prompt).expect("text"), "ab");
    }

    #[test]
    fn the_mask_covers_every_token_that_overlaps_a_span() {
        // Tokens of 2 characters over "abcdefgh"; spans "bcd" and "g".
        let offsets = [(0, 2), (2, 4), (4, 6), (6, 8)];
        assert_eq!(assistant_mask(&offsets, &[1..4, 6..7]), [true, true, false, true]);
        assert_eq!(assistant_mask(&offsets, &[]), [false; 4]);
        assert_eq!(char_spans("\u{e9}ab", &[2..4]), [1..3]);
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
