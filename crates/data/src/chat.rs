//! Chat templates: a tokenizer's Jinja template rendered as transformers'
//! `apply_chat_template` renders it.
//!
//! transformers compiles a template in a sandboxed Jinja2 environment with `trim_blocks` and
//! `lstrip_blocks`, loop controls (`{% break %}`, `{% continue %}`), its own `tojson` filter
//! (Python's `json.dumps`, not HTML-escaped, with `ensure_ascii`, `indent`, `separators` and
//! `sort_keys`), and the globals `raise_exception`, `strftime_now`, `dict` and `namespace`; it
//! renders with `messages`, `tools`, `documents`, `add_generation_prompt`, the tokenizer's
//! special tokens (`bos_token`, `eos_token`, ...) and the caller's keyword arguments (Qwen3's
//! `enable_thinking`). Messages lose their null-valued keys, and a message's reasoning given
//! under `reasoning_content`, `thinking` or `reasoning` reaches the template under
//! `reasoning_content` and `thinking` both.
//!
//! Here the engine is minijinja with the same settings, Python's string and dict methods
//! (`minijinja-contrib`'s pycompat), values printed as Python's `str()` prints them (`None`,
//! `True`, `1.0`, `['a']`), and `{% generation %}` blocks (transformers' assistant-mask marker:
//! the body renders unchanged, and [`ChatTemplate::render_spans`] says where its output lies, as
//! `apply_chat_template(..., return_assistant_tokens_mask=True)` records it). `strftime_now`
//! formats the date the job fixes (`data.chat.date`), not the clock, so prompts stay a pure
//! function of the job.
//! Rendering is bounded by a fuel limit: a template from the hub that loops forever is an error,
//! not a hang.

use crate::{DataError, Result};
use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Work one rendering may do: minijinja charges one unit per instruction and per 64 bytes of
/// data it makes, so this bounds a rendering's time and its strings (64 MiB); a chat prompt takes
/// a few thousand.
const FUEL: u64 = 1_000_000;
/// The longest text `tojson` or a printed container may make (Python has no limit; a template
/// from the hub must not make podctl allocate without one).
const MAX_FORMATTED_BYTES: usize = 16 << 20;
/// The widest `tojson` indent.
const MAX_INDENT: i64 = 64;
/// The template's name inside the environment (it shows in minijinja's messages).
const NAME: &str = "chat_template";
/// Names a message's reasoning is passed under, the first the one templates read.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];
/// What a `{% generation %}` block writes where it opens and closes: Unicode noncharacters,
/// which the standard keeps for a program's internal use, removed from the text before anyone
/// sees it (messages that contain them are refused).
const GENERATION_OPEN: char = '\u{FDD0}';
/// See [`GENERATION_OPEN`].
const GENERATION_CLOSE: char = '\u{FDD1}';
/// Marks the content of each message while the roles a template renders are probed.
const PROBE: char = '\u{FDD2}';
/// Distinct role sequences whose check is remembered (a data set repeats a few).
const MAX_CHECKED_ROLE_SEQUENCES: usize = 1024;

/// One chat message: `{"role": ..., "content": ...}` and any other fields (`reasoning_content`,
/// `tool_calls`, ...), which reach the template as they are, in their order.
#[derive(Debug, Clone, PartialEq)]
pub struct Message(Value);

impl Message {
    /// A message with a role and a text content.
    pub fn new(role: &str, content: &str) -> Self {
        Self(Value::from_pairs([("role", Value::from(role)), ("content", Value::from(content))]))
    }

    /// A message from a JSON object with a string `role` (the form of OpenAI's and transformers'
    /// chat messages).
    pub fn from_json(text: &str) -> std::result::Result<Self, String> {
        let value: Value = serde_json::from_str(text).map_err(|error| format!("not valid JSON ({error})"))?;
        if value.kind() != ValueKind::Map {
            return Err(format!("a message must be a JSON object, found {}", value.kind()));
        }
        match value.get_attr("role") {
            Ok(role) if role.kind() == ValueKind::String => Ok(Self(value)),
            _ => Err("a message needs a string `role`".into()),
        }
    }

    /// The role (`system`, `user`, `assistant`, `tool`, ...).
    pub fn role(&self) -> String {
        self.0.get_attr("role").ok().and_then(|role| role.as_str().map(str::to_owned)).unwrap_or_default()
    }

    /// The content when it is text (`None` for structured content or none).
    pub fn content(&self) -> Option<String> {
        self.0.get_attr("content").ok().and_then(|content| content.as_str().map(str::to_owned))
    }

    /// The message as JSON (what a reward function in Python receives).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.0).unwrap_or(serde_json::Value::Null)
    }

    /// The message with its content replaced by `content` (the role probe).
    fn with_content(&self, content: &str) -> Self {
        let fields: Vec<(Value, Value)> = match self.0.try_iter() {
            Ok(keys) => keys
                .filter_map(|key| {
                    let value = if key.as_str() == Some("content") {
                        Value::from(content)
                    } else {
                        self.0.get_item(&key).ok()?
                    };
                    Some((key, value))
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        let has_content = fields.iter().any(|(key, _)| key.as_str() == Some("content"));
        let extra = (!has_content).then(|| (Value::from("content"), Value::from(content)));
        Self(Value::from_pairs(fields.into_iter().chain(extra)))
    }

    /// Whether any text in the message holds a character podctl reserves for its markers.
    fn holds_reserved_char(&self) -> bool {
        fn walk(value: &Value, depth: usize) -> bool {
            match value.kind() {
                ValueKind::String => value
                    .as_str()
                    .is_some_and(|text| text.contains([GENERATION_OPEN, GENERATION_CLOSE, PROBE])),
                ValueKind::Seq | ValueKind::Map if depth < 64 => value.try_iter().is_ok_and(|items| {
                    items.into_iter().any(|item| {
                        let inner = if value.kind() == ValueKind::Map {
                            value.get_item(&item).unwrap_or_default()
                        } else {
                            Value::from(())
                        };
                        walk(&item, depth + 1) || walk(&inner, depth + 1)
                    })
                }),
                _ => false,
            }
        }
        walk(&self.0, 0)
    }

    /// What transformers hands the template for this message: null-valued keys dropped, the
    /// reasoning aliased (see the module docs).
    fn for_template(&self) -> Value {
        let Ok(keys) = self.0.try_iter() else { return self.0.clone() };
        let fields: Vec<(Value, Value)> = keys
            .filter_map(|key| {
                let value = self.0.get_item(&key).ok()?;
                (!value.is_none()).then_some((key, value))
            })
            .collect();
        let reasoning = REASONING_FIELDS.iter().find_map(|name| {
            fields.iter().find(|(key, _)| key.as_str() == Some(name)).map(|(_, value)| value.clone())
        });
        match reasoning {
            // `{"thinking": r, **message, "reasoning_content": r}`: `thinking` first unless the
            // message has it, `reasoning_content` set (last if new) either way.
            Some(reasoning) => {
                let mut out: Vec<(Value, Value)> = Vec::with_capacity(fields.len() + 2);
                if !fields.iter().any(|(key, _)| key.as_str() == Some("thinking")) {
                    out.push((Value::from("thinking"), reasoning.clone()));
                }
                out.extend(fields.iter().cloned());
                match out.iter_mut().find(|(key, _)| key.as_str() == Some("reasoning_content")) {
                    Some((_, value)) => *value = reasoning,
                    None => out.push((Value::from("reasoning_content"), reasoning)),
                }
                Value::from_pairs(out)
            }
            None => Value::from_pairs(fields),
        }
    }
}

/// What a rendering is asked for besides the messages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderOptions {
    /// End with the header of an assistant turn, for the model to continue.
    pub add_generation_prompt: bool,
    /// Keyword arguments the template reads (`enable_thinking`, `date_string`, ...), in order;
    /// they override the special tokens' names, as in transformers.
    pub kwargs: Vec<(String, serde_json::Value)>,
}

/// A compiled chat template. See the module docs.
#[derive(Debug)]
pub struct ChatTemplate {
    path: PathBuf,
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, ... with their texts: the tokenizer's special tokens map.
    special_tokens: Vec<(String, String)>,
    /// Whether the source has `{% generation %}` blocks.
    marks_generation: bool,
    /// Role sequences already probed ([`ChatTemplate::unrendered_message`]) and the answer.
    checked_roles: Mutex<HashMap<Vec<String>, Option<usize>>>,
}

impl ChatTemplate {
    /// Compiles `source`, read from `path` (named in errors). `special_tokens` are the names and
    /// texts of the tokenizer's special tokens (`eos_token` -> `<|im_end|>`); `date` is what
    /// `strftime_now` formats (`None`: a template that calls it is an error).
    pub fn new(
        source: &str,
        path: &Path,
        special_tokens: Vec<(String, String)>,
        date: Option<chrono::NaiveDate>,
    ) -> Result<Self> {
        let error = |message: String| DataError::ChatTemplate { path: path.to_path_buf(), message };
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| error(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, state, value| {
            let text = python_str(value)?;
            charge(state, text.len())?;
            out.write_str(&text).map_err(|_| Error::from(ErrorKind::WriteFailure))
        });
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", |message: String| -> std::result::Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, format!("raise_exception: {message}")))
        });
        let path_for_date = path.to_path_buf();
        env.add_function("strftime_now", move |format: String| strftime(date, &format, &path_for_date));
        let (source, marks_generation) = generation_blocks_marked(source);
        env.add_template_owned(NAME, source)
            .map_err(|e| error(format!("does not compile: {}", describe(&e))))?;
        Ok(Self {
            path: path.to_path_buf(),
            env,
            special_tokens,
            marks_generation,
            checked_roles: Mutex::new(HashMap::new()),
        })
    }

    /// Whether the template marks what the assistant writes with `{% generation %}` blocks
    /// (what an assistant-only loss needs).
    pub fn marks_generation(&self) -> bool {
        self.marks_generation
    }

    /// The file the template came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renders `messages`; an error (a template that raises, reads what is not there, or runs out
    /// of fuel) names the template's file and line.
    pub fn render(&self, messages: &[Message], options: &RenderOptions) -> Result<String> {
        Ok(self.render_spans(messages, options)?.0)
    }

    /// Renders `messages` and says which bytes of the text `{% generation %}` blocks wrote, in
    /// order (none when the template has no such blocks).
    pub fn render_spans(
        &self,
        messages: &[Message],
        options: &RenderOptions,
    ) -> Result<(String, Vec<Range<usize>>)> {
        if let Some(index) = messages.iter().position(Message::holds_reserved_char) {
            return Err(DataError::ChatTemplate {
                path: self.path.clone(),
                message: format!(
                    "message {index} holds one of the Unicode noncharacters U+FDD0..U+FDD2, which podctl \
                     reserves for its own marks; remove them from the data"
                ),
            });
        }
        let marked = self.render_marked(messages, options)?;
        let mut text = String::with_capacity(marked.len());
        let (mut open, mut spans) = (Vec::new(), Vec::new());
        for ch in marked.chars() {
            match ch {
                GENERATION_OPEN => open.push(text.len()),
                GENERATION_CLOSE => match open.pop() {
                    Some(start) => spans.push(start..text.len()),
                    None => return Err(self.unbalanced()),
                },
                _ => text.push(ch),
            }
        }
        if !open.is_empty() {
            return Err(self.unbalanced());
        }
        spans.sort_by_key(|span| span.start);
        Ok((text, spans))
    }

    /// The first message of `messages` whose content the template does not render (a role it
    /// does not know: Qwen3's renders nothing for a `bot` turn, silently dropping it), found by
    /// rendering the conversation with each content replaced by a probe. `None` when every
    /// message shows, or when the probe itself does not render (the real rendering reports why).
    pub fn unrendered_message(&self, messages: &[Message], options: &RenderOptions) -> Option<usize> {
        let roles: Vec<String> = messages.iter().map(Message::role).collect();
        if let Some(known) = self.checked_roles.lock().ok().and_then(|checked| checked.get(&roles).copied()) {
            return known;
        }
        let probe = |i: usize| format!("{PROBE}{i}{PROBE}");
        let probes: Vec<Message> =
            messages.iter().enumerate().map(|(i, message)| message.with_content(&probe(i))).collect();
        let missing = match self.render_marked(&probes, options) {
            Ok(text) => (0..messages.len()).find(|&i| !text.contains(&probe(i))),
            Err(_) => None,
        };
        if let Ok(mut checked) = self.checked_roles.lock()
            && checked.len() < MAX_CHECKED_ROLE_SEQUENCES
        {
            checked.insert(roles, missing);
        }
        missing
    }

    fn unbalanced(&self) -> DataError {
        DataError::ChatTemplate {
            path: self.path.clone(),
            message: "its {% generation %} and {% endgeneration %} tags do not pair up in the output".into(),
        }
    }

    /// The rendering with the generation blocks' marks still in it.
    fn render_marked(&self, messages: &[Message], options: &RenderOptions) -> Result<String> {
        let mut context: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from_iter(messages.iter().map(Message::for_template))),
            ("tools".into(), Value::from(())),
            ("documents".into(), Value::from(())),
            ("add_generation_prompt".into(), Value::from(options.add_generation_prompt)),
        ];
        let mut set = |name: &str, value: Value| match context.iter_mut().find(|(key, _)| key == name) {
            Some((_, slot)) => *slot = value,
            None => context.push((name.to_owned(), value)),
        };
        for (name, text) in &self.special_tokens {
            set(name, Value::from(text.as_str()));
        }
        for (name, value) in &options.kwargs {
            set(name, Value::from(minijinja::value::Serde(value)));
        }
        let template = self.env.get_template(NAME).map_err(|e| self.error(&e))?;
        template.render(Value::from_pairs(context)).map_err(|e| self.error(&e))
    }

    fn error(&self, error: &Error) -> DataError {
        DataError::ChatTemplate {
            path: self.path.clone(),
            message: format!("cannot render: {}", describe(error)),
        }
    }
}

/// minijinja's message with the line it points at, and what raised it.
fn describe(error: &Error) -> String {
    let mut text = match error.kind() {
        ErrorKind::OutOfFuel => "it ran past the fuel limit (an endless loop?)".to_string(),
        _ => error.detail().map(str::to_owned).unwrap_or_else(|| error.kind().to_string()),
    };
    if let Some(line) = error.line() {
        let _ = write!(text, " (line {line} of the template)");
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

/// `{% generation %}` ... `{% endgeneration %}` as plain blocks that write a mark where they open
/// and close, whitespace control kept on the outer tags (`{%- generation %}` becomes
/// `{%- if true %}{{ OPEN }}{% if true %}`, so both the whitespace before the tag and the
/// newline after it are trimmed as Jinja2 trims them around the one tag). Returns the source and
/// whether it had such blocks.
fn generation_blocks_marked(source: &str) -> (String, bool) {
    let mut out = String::with_capacity(source.len());
    let mut marked = false;
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // The closing `%}` after the opening `{%` (in `{%}` they overlap).
        let Some(end) = tag[2..].find("%}").map(|at| at + 2) else { break };
        let inner = &tag[2..end];
        let (open, body, close) = split_marks(inner);
        match body.trim() {
            "generation" => {
                write_tag(&mut out, open, "if true", "");
                let _ = write!(out, "{{{{ \"{GENERATION_OPEN}\" }}}}");
                write_tag(&mut out, "", "if true", close);
                marked = true;
            }
            "endgeneration" => {
                write_tag(&mut out, open, "endif", "");
                let _ = write!(out, "{{{{ \"{GENERATION_CLOSE}\" }}}}");
                write_tag(&mut out, "", "endif", close);
            }
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    (out, marked)
}

/// A tag's inside split into its leading mark (`-` or `+`), its body and its trailing mark.
fn split_marks(inner: &str) -> (&str, &str, &str) {
    let open = if inner.starts_with(['-', '+']) { &inner[..1] } else { "" };
    let inner = &inner[open.len()..];
    let close = if inner.ends_with(['-', '+']) { &inner[inner.len() - 1..] } else { "" };
    (open, &inner[..inner.len() - close.len()], close)
}

fn write_tag(out: &mut String, open: &str, body: &str, close: &str) {
    let _ = write!(out, "{{%{open} {body} {close}%}}");
}

fn strftime(date: Option<chrono::NaiveDate>, format: &str, path: &Path) -> std::result::Result<Value, Error> {
    let Some(date) = date else {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "the template in {} calls strftime_now (today's date in the prompt); set data.chat.date \
                 (YYYY-MM-DD) to the date it should show, so prompts do not change from day to day",
                path.display()
            ),
        ));
    };
    let items: Vec<chrono::format::Item<'_>> = chrono::format::StrftimeItems::new(format).collect();
    if items.iter().any(|item| matches!(item, chrono::format::Item::Error)) {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("strftime_now: bad format {format:?}")));
    }
    let midnight = date.and_time(chrono::NaiveTime::MIN);
    let mut text = String::new();
    write!(text, "{}", midnight.format_with_items(items.into_iter())).map_err(|_| {
        Error::new(ErrorKind::InvalidOperation, format!("strftime_now: bad format {format:?}"))
    })?;
    Ok(Value::from(text))
}

/// Charges the fuel of `bytes` of text made outside the engine (as minijinja charges its own
/// serializations: 16 units a byte).
fn charge(state: &State, bytes: usize) -> std::result::Result<(), Error> {
    state.consume_fuel((bytes as u64).saturating_mul(16) / 64)
}

/// An error once formatted text would pass [`MAX_FORMATTED_BYTES`].
fn check_size(len: usize) -> std::result::Result<(), Error> {
    if len > MAX_FORMATTED_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("the text a value formats to passes {MAX_FORMATTED_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, options by keyword or in that order.
fn tojson(
    state: &State,
    value: Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, Error> {
    let mut options = JsonOptions {
        ensure_ascii: false,
        indent: None,
        item: ", ".into(),
        key: ": ".into(),
        sort_keys: false,
    };
    let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > names.len() {
        return Err(Error::new(ErrorKind::TooManyArguments, "tojson takes at most 4 options"));
    }
    let mut given: Vec<(&str, Value)> = names.iter().copied().zip(args.iter().cloned()).collect();
    for name in names {
        if let Some(value) = kwargs.get::<Option<Value>>(name)? {
            given.push((name, value));
        }
    }
    kwargs.assert_all_used()?;
    let mut separators = None;
    for (name, value) in given {
        match name {
            "ensure_ascii" => options.ensure_ascii = value.is_true(),
            "sort_keys" => options.sort_keys = value.is_true(),
            "indent" => {
                options.indent = match value.kind() {
                    ValueKind::None | ValueKind::Undefined => None,
                    ValueKind::String => Some(value.as_str().unwrap_or_default().to_owned()),
                    ValueKind::Number => {
                        let width = i64::try_from(value.clone())?;
                        if width > MAX_INDENT {
                            return Err(Error::new(
                                ErrorKind::InvalidOperation,
                                format!("tojson: indent {width} is wider than {MAX_INDENT}"),
                            ));
                        }
                        Some(" ".repeat(width.max(0) as usize))
                    }
                    other => {
                        return Err(Error::new(
                            ErrorKind::InvalidOperation,
                            format!("tojson: indent must be a number or a string, not {other}"),
                        ));
                    }
                }
            }
            _ if value.is_none() || value.is_undefined() => {}
            _ => {
                let pair: Vec<Value> = value.try_iter()?.collect();
                match pair.as_slice() {
                    [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                        separators = Some((item.to_string(), key.to_string()));
                    }
                    _ => {
                        return Err(Error::new(
                            ErrorKind::InvalidOperation,
                            "tojson: separators must be two strings",
                        ));
                    }
                }
            }
        }
    }
    // Python's defaults: (', ', ': '), or (',', ': ') with an indent.
    (options.item, options.key) =
        separators.unwrap_or_else(|| (if options.indent.is_some() { "," } else { ", " }.into(), ": ".into()));
    let mut out = String::new();
    write_json(&mut out, &value, &options, 0)?;
    charge(state, out.len())?;
    Ok(Value::from(out))
}

struct JsonOptions {
    ensure_ascii: bool,
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
}

/// Nesting deeper than this is refused (Python's limit is about 1000 frames).
const MAX_JSON_DEPTH: usize = 512;

fn write_json(
    out: &mut String,
    value: &Value,
    options: &JsonOptions,
    depth: usize,
) -> std::result::Result<(), Error> {
    if depth > MAX_JSON_DEPTH {
        return Err(Error::new(ErrorKind::InvalidOperation, "tojson: the value is nested too deeply"));
    }
    check_size(out.len())?;
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &options.indent {
            check_size(out.len().saturating_add(indent.len().saturating_mul(level)))?;
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
        Ok::<(), Error>(())
    };
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => {
            let _ = write!(out, "{value}");
        }
        ValueKind::Number => out.push_str(&json_float(f64::try_from(value.clone())?)),
        ValueKind::String => write_json_string(out, value.as_str().unwrap_or_default(), options.ensure_ascii),
        ValueKind::Seq => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item);
                }
                newline(out, depth + 1)?;
                write_json(out, item, options, depth + 1)?;
            }
            newline(out, depth)?;
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if options.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item);
                }
                newline(out, depth + 1)?;
                write_json_string(out, key, options.ensure_ascii);
                out.push_str(&options.key);
                write_json(out, item, options, depth + 1)?;
            }
            newline(out, depth)?;
            out.push('}');
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a value of kind {other} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

/// A mapping key as `json.dumps` writes it: strings as they are, numbers, booleans and None
/// spelled out.
fn json_key(key: &Value) -> std::result::Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).into(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => python_float(f64::try_from(key.clone())?),
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be strings, not {other}"),
            ));
        }
    })
}

/// A string as `json.dumps` writes it.
fn write_json_string(out: &mut String, text: &str, ensure_ascii: bool) {
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ch if (ch as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", ch as u32);
            }
            // ensure_ascii escapes everything outside ' '..='~', DEL included.
            ch if ensure_ascii && !(' '..='~').contains(&ch) => {
                let mut units = [0u16; 2];
                for unit in ch.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            ch => out.push(ch),
        }
    }
    out.push('"');
}

/// A float as `json.dumps` writes it.
fn json_float(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        (if x > 0.0 { "Infinity" } else { "-Infinity" }).into()
    } else {
        python_float(x)
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional for exponents
/// -4..16, else `d.ddde+XX`.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return (if x > 0.0 { "inf" } else { "-inf" }).into();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits: "-1.5e-7", "1e20", "0e0".
    let scientific = format!("{x:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let body = if (-4..16).contains(&exponent) {
        let point = exponent + 1;
        if point <= 0 {
            format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        }
    } else {
        let mantissa =
            if digits.len() == 1 { digits.clone() } else { format!("{}.{}", &digits[..1], &digits[1..]) };
        format!("{mantissa}e{}{:02}", if exponent < 0 { '-' } else { '+' }, exponent.unsigned_abs())
    };
    format!("{sign}{body}")
}

/// What Python's `str()` prints for a value (Jinja2 prints through it): `None`, `True`, `1.0`,
/// `['a', 1]`, `{'k': None}`; an undefined value prints nothing.
fn python_str(value: &Value) -> std::result::Result<String, Error> {
    match value.kind() {
        ValueKind::Undefined => Ok(String::new()),
        ValueKind::String => Ok(value.as_str().unwrap_or_default().to_owned()),
        _ => {
            let mut out = String::new();
            write_python_repr(&mut out, value, 0)?;
            Ok(out)
        }
    }
}

/// Python's `repr()` of a value (strings quoted), what `str()` prints inside containers.
fn write_python_repr(out: &mut String, value: &Value, depth: usize) -> std::result::Result<(), Error> {
    check_size(out.len())?;
    if depth > MAX_JSON_DEPTH {
        return Err(Error::new(ErrorKind::InvalidOperation, "the value is nested too deeply to print"));
    }
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if value.is_integer() => {
            let _ = write!(out, "{value}");
        }
        ValueKind::Number => match f64::try_from(value.clone()) {
            Ok(x) => out.push_str(&python_float(x)),
            Err(_) => {
                let _ = write!(out, "{value}");
            }
        },
        ValueKind::String => write_python_string_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            let (open, close) = if value.is_tuple() { ('(', ")") } else { ('[', "]") };
            out.push(open);
            let mut count = 0;
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_repr(out, &item, depth + 1)?;
                count += 1;
            }
            // A one-tuple keeps its comma: `(1,)`.
            out.push_str(if value.is_tuple() && count == 1 { ",)" } else { close });
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_repr(out, &key, depth + 1)?;
                out.push_str(": ");
                write_python_repr(out, &value.get_item(&key).unwrap_or_default(), depth + 1)?;
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

/// Python's `repr(str)`: single quotes unless the text has one and no double quote; backslash,
/// the quote, `\t`, `\n`, `\r` and other control characters (C0, DEL, C1) escaped.
fn write_python_string_repr(out: &mut String, text: &str) {
    let quote = if text.contains('\'') && !text.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for ch in text.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            ch if ch == quote => {
                out.push('\\');
                out.push(ch);
            }
            ch if (ch as u32) < 0x20 || (0x7f..=0xa0).contains(&(ch as u32)) => {
                let _ = write!(out, "\\x{:02x}", ch as u32);
            }
            ch => out.push(ch),
        }
    }
    out.push(quote);
}

#[cfg(test)]
// Spans are ranges: one span is a list of one range, not a range to expand.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    fn template(source: &str) -> ChatTemplate {
        let special = vec![("eos_token".to_string(), "<|im_end|>".to_string())];
        ChatTemplate::new(source, Path::new("/models/m/tokenizer_config.json"), special, None)
            .expect("compiles")
    }

    fn render(source: &str, messages: &[Message], options: &RenderOptions) -> String {
        template(source).render(messages, options).expect("renders")
    }

    #[test]
    fn trims_blocks_and_reads_special_tokens_and_kwargs() {
        let source = "{% for m in messages %}\n  {{ m.role }}: {{ m.content }}{{ eos_token }}\n{% endfor %}\
                      {% if add_generation_prompt %}assistant{% if enable_thinking is false %}!{% endif %}{% endif %}";
        let messages = [Message::new("user", "hi"), Message::new("assistant", "hello")];
        let options = RenderOptions {
            add_generation_prompt: true,
            kwargs: vec![("enable_thinking".into(), serde_json::Value::Bool(false))],
        };
        // What Jinja2 renders with transformers' settings (checked with jinja2 3.1.6).
        assert_eq!(
            render(source, &messages, &options),
            "  user: hi<|im_end|>\n  assistant: hello<|im_end|>\nassistant!"
        );
        // A keyword argument overrides a special token of the same name.
        let options =
            RenderOptions { kwargs: vec![("eos_token".into(), "<e>".into())], ..Default::default() };
        assert_eq!(render("{{ eos_token }}", &[], &options), "<e>");
    }

    #[test]
    fn python_methods_loop_controls_and_namespaces() {
        let source = "{%- set ns = namespace(n=0) %}{%- for m in messages[::-1] %}{% if loop.index0 == 2 %}{% break %}{% endif %}\
                      {%- set ns.n = ns.n + 1 %}[{{ m.content.split('</think>')[-1].lstrip('\\n').upper() }}]{% endfor %}{{ ns.n }}";
        let messages = [
            Message::new("user", "a"),
            Message::new("user", "<think>x</think>\nb"),
            Message::new("user", "c"),
        ];
        assert_eq!(render(source, &messages, &RenderOptions::default()), "[C][B]2");
    }

    #[test]
    fn values_print_as_python_prints_them() {
        let source = "{{ none }} {{ true }} {{ 1.0 }} {{ 1e20 }} {{ 1.5e-7 }} {{ [1, 'a', none] }} {{ {'k': false} }} {{ missing }}|";
        assert_eq!(
            render(source, &[], &RenderOptions::default()),
            "None True 1.0 1e+20 1.5e-07 [1, 'a', None] {'k': False} |"
        );
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        let message = Message::from_json(
            r#"{"role": "tool", "content": "x", "args": {"b": [1, 2.5, "é<>"], "a": null}}"#,
        )
        .expect("message");
        let render_json = |options: &str| {
            render(
                &format!("{{{{ messages[0].args | tojson{options} }}}}"),
                std::slice::from_ref(&message),
                &RenderOptions::default(),
            )
        };
        assert_eq!(render_json(""), r#"{"b": [1, 2.5, "é<>"], "a": null}"#);
        assert_eq!(render_json("(ensure_ascii=true)"), r#"{"b": [1, 2.5, "\u00e9<>"], "a": null}"#);
        assert_eq!(render_json("(sort_keys=true)"), r#"{"a": null, "b": [1, 2.5, "é<>"]}"#);
        assert_eq!(
            render_json("(indent=2)"),
            "{\n  \"b\": [\n    1,\n    2.5,\n    \"é<>\"\n  ],\n  \"a\": null\n}"
        );
        assert_eq!(render_json("(separators=(',', ':'))"), r#"{"b":[1,2.5,"é<>"],"a":null}"#);
        assert_eq!(
            render("{{ '\"\\\\\\n\\u0001' | tojson }}", &[], &RenderOptions::default()),
            r#""\"\\\n\u0001""#
        );
    }

    #[test]
    fn python_float_repr() {
        for (x, text) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-0.0, "-0.0"),
            (123.456, "123.456"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456789012345680.0, "1.2345678901234568e+17"),
            (1e15, "1000000000000000.0"),
        ] {
            assert_eq!(python_float(x), text, "{x}");
        }
    }

    #[test]
    fn messages_drop_nulls_and_alias_reasoning() {
        let message = Message::from_json(
            r#"{"role": "assistant", "content": "4", "reasoning": "2+2", "tool_calls": null}"#,
        )
        .expect("message");
        let source = "{{ messages[0].thinking }}|{{ messages[0].reasoning_content }}|{{ messages[0].tool_calls is defined }}";
        assert_eq!(render(source, &[message], &RenderOptions::default()), "2+2|2+2|False");
        assert!(Message::from_json(r#"{"content": "x"}"#).expect_err("no role").contains("role"));
        assert!(Message::from_json("[1]").expect_err("not an object").contains("object"));
    }

    #[test]
    fn generation_blocks_render_their_body_and_say_where_it_is() {
        let (source, marked) =
            generation_blocks_marked("a{%- generation -%} b {% endgeneration +%}c{% if x %}");
        assert!(marked);
        assert_eq!(
            source,
            "a{%- if true %}{{ \"\u{FDD0}\" }}{% if true -%} b {% endif %}{{ \"\u{FDD1}\" }}{% endif +%}c{% if x %}"
        );
        // Tags that are not well formed are left for the parser to refuse (found by fuzzing).
        for broken in ["{%}", "{%}%}", "{%", "a {%- %}", "{%-%}{%+-%}"] {
            assert_eq!(generation_blocks_marked(broken), (broken.to_string(), false));
        }
        // Whitespace control around the tags trims as Jinja2 trims it (checked with jinja2 3.1.6
        // and transformers' generation extension: the same text, the span over "ok!\n").
        let source = "{% for m in messages %}\n  {%- if m.role == 'assistant' %}\n    {% generation %}\n{{ m.content }}!\n{% endgeneration %}\n  {%- else %}[{{ m.content }}]{% endif %}\n{% endfor %}";
        let messages = [Message::new("user", "hi"), Message::new("assistant", "ok")];
        let (text, spans) =
            template(source).render_spans(&messages, &RenderOptions::default()).expect("renders");
        assert_eq!(text, "[hi]ok!\n");
        assert_eq!(spans, [4..8]);
        assert!(template(source).marks_generation());
        let message = template(source)
            .render(&[Message::new("user", "a\u{FDD1}")], &RenderOptions::default())
            .expect_err("a reserved character")
            .to_string();
        assert!(message.contains("U+FDD0") && message.contains("message 0"), "{message}");
    }

    #[test]
    fn a_role_the_template_does_not_render_is_found() {
        let source = "{% for m in messages %}{% if m.role == 'user' %}U:{{ m.content }}{% elif m.role == 'assistant' %}A:{{ m.content }}{% endif %}{% endfor %}";
        let chat = template(source);
        let options = RenderOptions::default();
        let good = [Message::new("user", "hi"), Message::new("assistant", "ok")];
        assert_eq!(chat.unrendered_message(&good, &options), None);
        let bad = [Message::new("user", "hi"), Message::new("bot", "ok"), Message::new("assistant", "x")];
        assert_eq!(chat.unrendered_message(&bad, &options), Some(1));
        // Remembered per role sequence, whatever the contents.
        let again = [Message::new("user", "?"), Message::new("bot", "!"), Message::new("assistant", "")];
        assert_eq!(chat.unrendered_message(&again, &options), Some(1));
        assert_eq!(
            Message::from_json(r#"{"role": "tool", "content": "x"}"#).expect("message").role(),
            "tool"
        );
        assert_eq!(good[1].content().as_deref(), Some("ok"));
        assert_eq!(good[1].to_json(), serde_json::json!({"role": "assistant", "content": "ok"}));
    }

    #[test]
    fn errors_name_the_file_line_and_cause() {
        let path = "/models/m/tokenizer_config.json";
        let error = ChatTemplate::new("{% if %}", Path::new(path), vec![], None).expect_err("syntax");
        let message = error.to_string();
        assert!(message.contains(path) && message.contains("does not compile"), "{message}");

        let raising = template(
            "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user turn') }}{% endif %}",
        );
        let message = raising
            .render(&[Message::new("assistant", "x")], &RenderOptions::default())
            .expect_err("raises")
            .to_string();
        assert!(
            message.contains(path)
                && message.contains("must start with a user turn")
                && message.contains("line 1"),
            "{message}"
        );

        let message = template("{{ messages[0].content.nope() }}")
            .render(&[Message::new("user", "x")], &RenderOptions::default())
            .expect_err("unknown method")
            .to_string();
        assert!(message.contains(path), "{message}");

        let endless =
            template("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
        let message = endless.render(&[], &RenderOptions::default()).expect_err("fuel").to_string();
        assert!(message.contains("fuel"), "{message}");
    }

    #[test]
    fn strftime_now_formats_the_configured_date_only() {
        let date = chrono::NaiveDate::from_ymd_opt(2024, 7, 26);
        let fixed = ChatTemplate::new("{{ strftime_now('%d %b %Y') }}", Path::new("t.jinja"), vec![], date)
            .expect("compiles");
        assert_eq!(fixed.render(&[], &RenderOptions::default()).expect("renders"), "26 Jul 2024");
        let message = template("{{ strftime_now('%d %b %Y') }}")
            .render(&[], &RenderOptions::default())
            .expect_err("no date")
            .to_string();
        assert!(message.contains("data.chat.date"), "{message}");
    }
}
