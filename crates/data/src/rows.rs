//! From a row (a JSONL line's object, a Parquet row) to an [`Example`], the same for either file
//! format: the kind's columns become the prompt and the answer, the rest stay with the example
//! for reward functions.
//!
//! A row is its columns' JSON texts ([`Row`]), parsed only here: a conversation's turns straight
//! into chat messages, whose keys keep the order they were written in (a template's `tojson` of
//! a tool call's arguments prints them in that order, as Python's dicts do).

use crate::chat::Message;
use crate::jsonl::kind_of;
use crate::source::{Columns, Conversation, Example, Prompt};
use serde_json::Value;
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// A row: each column's value as JSON text.
pub type Row = BTreeMap<String, Box<RawValue>>;

/// What a row holds, with the file's column names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RowFormat {
    /// A prompt and an answer (`kind: jsonl`; `kind: gsm8k` with `gsm8k`, whose answers must end
    /// in a `#### <number>` final answer).
    PromptAnswer {
        /// The prompt's column.
        prompt: String,
        /// The answer's column.
        answer: String,
        /// GSM8K's answers.
        gsm8k: bool,
    },
    /// A conversation (`kind: chat`).
    Chat {
        /// The turns' column.
        messages: String,
        /// The reference answer's column, for rows whose conversation ends at a user turn.
        answer: String,
    },
}

impl RowFormat {
    /// `{"prompt": ..., "answer": ...}` rows.
    pub fn prompt_answer() -> Self {
        RowFormat::PromptAnswer { prompt: "prompt".into(), answer: "answer".into(), gsm8k: false }
    }

    /// GSM8K's `{"question": ..., "answer": "... #### 72"}` rows.
    pub fn gsm8k() -> Self {
        RowFormat::PromptAnswer { prompt: "question".into(), answer: "answer".into(), gsm8k: true }
    }

    /// `{"messages": [...]}` rows.
    pub fn chat() -> Self {
        RowFormat::Chat { messages: "messages".into(), answer: "answer".into() }
    }

    /// The columns every row must have.
    pub fn required_columns(&self) -> Vec<&str> {
        match self {
            RowFormat::PromptAnswer { prompt, answer, .. } => vec![prompt, answer],
            RowFormat::Chat { messages, .. } => vec![messages],
        }
    }

    /// What a row looks like, for messages.
    pub fn example_row(&self) -> String {
        match self {
            RowFormat::PromptAnswer { prompt, answer, gsm8k: true } => {
                format!("{{\"{prompt}\": ..., \"{answer}\": \"... #### 72\"}}")
            }
            RowFormat::PromptAnswer { prompt, answer, .. } => {
                format!("{{\"{prompt}\": ..., \"{answer}\": ...}}")
            }
            RowFormat::Chat { messages, .. } => {
                format!("{{\"{messages}\": [{{\"role\": \"user\", \"content\": ...}}, ...]}}")
            }
        }
    }

    /// The column names a spec can set, for messages (`data.columns.prompt`).
    fn spec_field(&self, column: &str) -> &'static str {
        match self {
            RowFormat::PromptAnswer { prompt, .. } if prompt == column => "data.columns.prompt",
            RowFormat::Chat { messages, .. } if messages == column => "data.columns.messages",
            _ => "data.columns.answer",
        }
    }

    /// The example in a row's fields; the error names the field at fault and the fix.
    pub fn example(&self, mut row: Row) -> Result<Example, String> {
        match self {
            RowFormat::PromptAnswer { prompt, answer, gsm8k } => {
                let text = |row: &Row, name: &str| match row.get(name).map(|raw| parse(raw)) {
                    Some(Value::String(text)) => Ok(text),
                    Some(other) => Err(format!("field `{name}` must be a string, found {}", kind_of(&other))),
                    None => Err(self.missing(name, row)),
                };
                let prompt_text = text(&row, prompt)?;
                let answer_text = text(&row, answer)?;
                if *gsm8k {
                    check_final_answer(answer, &answer_text)?;
                }
                row.remove(prompt);
                Ok(Example { prompt: Prompt::Text(prompt_text), answer: answer_text, columns: columns(row) })
            }
            RowFormat::Chat { messages, answer } => {
                let Some(raw) = row.remove(messages) else { return Err(self.missing(messages, &row)) };
                let Ok(turns) = serde_json::from_str::<Vec<Box<RawValue>>>(raw.get()) else {
                    return Err(format!(
                        "field `{messages}` must be a list of {{\"role\", \"content\"}} turns, found {}",
                        kind_of(&parse(&raw))
                    ));
                };
                if turns.is_empty() {
                    return Err(format!(
                        "field `{messages}` is an empty conversation; every row needs turns"
                    ));
                }
                let turns = turns
                    .iter()
                    .enumerate()
                    .map(|(i, turn)| {
                        Message::from_json(turn.get()).map_err(|e| format!("field `{messages}[{i}]`: {e}"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let conversation = Conversation::new(turns);
                let reference = match (conversation.reply(), row.get(answer).map(|raw| parse(raw))) {
                    (Some(reply), _) => reply,
                    (None, Some(Value::String(text))) => text,
                    (None, Some(Value::Null) | None) => String::new(),
                    (None, Some(other)) => {
                        return Err(format!("field `{answer}` must be a string, found {}", kind_of(&other)));
                    }
                };
                Ok(Example { prompt: Prompt::Chat(conversation), answer: reference, columns: columns(row) })
            }
        }
    }

    fn missing(&self, name: &str, row: &Row) -> String {
        let mut present: Vec<&str> = row.keys().map(String::as_str).collect();
        present.truncate(8);
        format!(
            "missing field `{name}` (the row has {}); every row is {} (set {} if the file names it otherwise)",
            if present.is_empty() { "no fields".to_string() } else { present.join(", ") },
            self.example_row(),
            self.spec_field(name)
        )
    }
}

/// A cell's value (the texts come from a JSON parser or are written by one, so they parse).
fn parse(raw: &RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

/// The remaining fields, for reward functions.
fn columns(row: Row) -> Columns {
    row.into_iter().map(|(name, raw)| (name, parse(&raw))).collect()
}

/// A GSM8K answer must end in `#### <number>`: the reward compares against that number.
fn check_final_answer(field: &str, answer: &str) -> Result<(), String> {
    let shown = || {
        let tail: String = answer.chars().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect();
        if tail.len() < answer.len() { format!("...{tail:?}") } else { format!("{tail:?}") }
    };
    match crate::reward::extract_final_answer(answer) {
        None => Err(format!(
            "field `{field}` has no `#### <number>` final answer (it ends {}); GSM8K answers end in a line like \
             `#### 72`",
            shown()
        )),
        Some(final_answer) if crate::reward::leading_number(&final_answer).is_none() => Err(format!(
            "field `{field}`'s final answer {final_answer:?} is not a number; GSM8K answers end in a line like `#### 72`"
        )),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(value: Value) -> Row {
        serde_json::from_value::<BTreeMap<String, Value>>(value)
            .expect("an object")
            .into_iter()
            .map(|(name, value)| (name, RawValue::from_string(value.to_string()).expect("json")))
            .collect()
    }

    #[test]
    fn prompt_answer_rows_keep_their_other_columns() {
        let example = RowFormat::gsm8k()
            .example(row(json!({"question": "q?", "answer": "1 + 1 = 2\n#### 2", "id": 7})))
            .expect("valid");
        assert_eq!(example.prompt, Prompt::Text("q?".into()));
        assert_eq!(example.answer, "1 + 1 = 2\n#### 2");
        assert_eq!(
            example.columns,
            Columns::from([("answer".into(), json!("1 + 1 = 2\n#### 2")), ("id".into(), json!(7))])
        );
        let renamed =
            RowFormat::PromptAnswer { prompt: "problem".into(), answer: "solution".into(), gsm8k: false };
        let example = renamed.example(row(json!({"problem": "p", "solution": "s"}))).expect("valid");
        assert_eq!((example.prompt.display(), example.answer.as_str()), ("p".to_string(), "s"));
    }

    #[test]
    fn conversations_prompt_through_the_last_user_turn() {
        let example = RowFormat::chat()
            .example(row(json!({"messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "And 3+3?"},
                {"role": "assistant", "content": "#### 6"}
            ], "source": "x"})))
            .expect("valid");
        let Prompt::Chat(conversation) = &example.prompt else { panic!("a conversation") };
        assert_eq!((conversation.messages.len(), conversation.prompt().len()), (5, 4));
        assert_eq!((example.prompt.display(), example.answer.as_str()), ("And 3+3?".to_string(), "#### 6"));
        assert_eq!(example.columns.keys().collect::<Vec<_>>(), ["source"]);
        // Prompt-only rows take their reference from the answer column.
        let example = RowFormat::chat()
            .example(row(json!({"messages": [{"role": "user", "content": "2+2?"}], "answer": "4"})))
            .expect("valid");
        assert_eq!(example.answer, "4");
    }

    #[test]
    fn bad_rows_name_the_field_and_the_fix() {
        let cases = [
            (RowFormat::gsm8k(), json!({"question": "q"}), "missing field `answer` (the row has question)"),
            (
                RowFormat::gsm8k(),
                json!({"question": 3, "answer": "#### 1"}),
                "`question` must be a string, found a number",
            ),
            (
                RowFormat::gsm8k(),
                json!({"question": "q", "answer": "no marker"}),
                "no `#### <number>` final answer",
            ),
            (RowFormat::prompt_answer(), json!({"text": "x"}), "set data.columns.prompt"),
            (RowFormat::chat(), json!({"prompt": []}), "missing field `messages`"),
            (RowFormat::chat(), json!({"messages": "hi"}), "must be a list of"),
            (RowFormat::chat(), json!({"messages": []}), "empty conversation"),
            (
                RowFormat::chat(),
                json!({"messages": [{"content": "x"}]}),
                "field `messages[0]`: a message needs a string `role`",
            ),
            (
                RowFormat::chat(),
                json!({"messages": [{"role": 1}]}),
                "field `messages[0]`: a message needs a string `role`",
            ),
            (RowFormat::chat(), json!({"messages": [3]}), "a message must be a JSON object, found number"),
        ];
        for (format, value, expected) in cases {
            let message = format.example(row(value.clone())).expect_err(expected);
            assert!(message.contains(expected), "{value}: {message}");
        }
    }
}
