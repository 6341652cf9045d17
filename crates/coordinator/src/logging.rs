//! How podctl's processes log: text (colour only on a terminal, never with `NO_COLOR`) or JSON
//! lines on stderr, through an `EnvFilter`, with openraft's own warnings and errors
//! rate-limited ([`RateLimit`]): while a peer is down, openraft reports every failed heartbeat
//! and election round, several lines a second for as long as it lasts, which would bury
//! everything else. [`crate::peers`] says once that a peer went and once that it came back.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tracing::callsite::Identifier;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// How often one of openraft's warning or error call sites may log.
pub const OPENRAFT_EVERY: Duration = Duration::from_secs(60);

/// Lets a library's warnings and errors through at most once per call site every `every`; its
/// other events and everyone else's pass untouched.
pub struct RateLimit {
    target: &'static str,
    every: Duration,
    last: Mutex<HashMap<Identifier, Instant>>,
}

impl RateLimit {
    /// Rate-limits the events whose target starts with `target` (a crate name).
    pub fn new(target: &'static str, every: Duration) -> Self {
        Self { target, every, last: Mutex::new(HashMap::new()) }
    }
}

impl<S: Subscriber> Layer<S> for RateLimit {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() > Level::WARN || !meta.target().starts_with(self.target) {
            return true;
        }
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match last.get(&meta.callsite()) {
            Some(at) if now.duration_since(*at) < self.every => false,
            _ => {
                last.insert(meta.callsite(), now);
                true
            }
        }
    }
}

/// Whether stderr gets colour: a terminal, and `NO_COLOR` unset or empty (no-color.org).
pub fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Installs the process's logger: `RUST_LOG` if set, else `filter`; JSON lines with `json`.
pub fn init(filter: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let registry =
        tracing_subscriber::registry().with(filter).with(RateLimit::new("openraft", OPENRAFT_EVERY));
    let text = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    if json {
        registry.with(text.json()).init();
    } else {
        registry.with(text.with_ansi(colour())).init();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;

    /// Collects the messages of warnings that reach the output.
    struct Collect(Arc<Mutex<Vec<String>>>);

    impl<S: Subscriber> Layer<S> for Collect {
        fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
            struct Message(String);
            impl tracing::field::Visit for Message {
                fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                    if field.name() == "message" {
                        self.0 = format!("{value:?}");
                    }
                }
            }
            if *event.metadata().level() <= Level::WARN {
                let mut message = Message(String::new());
                event.record(&mut message);
                self.0.lock().unwrap().push(message.0);
            }
        }
    }

    /// The messages of the warnings and errors `f` logs that get through the rate limit.
    pub(crate) fn warnings(f: impl FnOnce()) -> Vec<String> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry()
            .with(RateLimit::new("openraft", OPENRAFT_EVERY))
            .with(Collect(seen.clone()));
        tracing::subscriber::with_default(subscriber, f);
        seen.lock().unwrap().clone()
    }

    #[test]
    fn openraft_s_warnings_pass_once_a_minute_per_call_site_and_others_always() {
        let seen = warnings(|| {
            for _ in 0..100 {
                tracing::error!(target: "openraft::replication", "RPCError: unreachable");
                tracing::warn!(target: "openraft::core", "timeout while requesting vote");
                tracing::warn!(target: "podctl_coordinator::leader", "a worker's lease expired");
                tracing::info!(target: "openraft::core", "vote granted");
            }
        });
        let count = |m: &str| seen.iter().filter(|s| s.starts_with(m)).count();
        assert_eq!(count("RPCError"), 1);
        assert_eq!(count("timeout while requesting vote"), 1);
        assert_eq!(count("a worker's lease expired"), 100);
        assert_eq!(seen.len(), 102, "{seen:?}");
    }
}
