//! A small pool of Python processes that run a job's Python reward functions (the runner is
//! `models/podctl_models/reward_runner.py`, built into this crate and started with the job's
//! Python). Each process imports every function once; a call sends each process a contiguous
//! share of the step's rows and waits for all of them, so the processes work side by side. The
//! conversation is one JSON object per line on the processes' stdin and stdout; their stderr (the
//! functions' prints, tracebacks) goes to the log.
//!
//! A call that takes longer than the timeout kills the process that is late, and the next call
//! starts it again; a process that dies is started again the same way. Every failure is a
//! [`RewardError`] that names the function: it fails the step, and never becomes a reward.

use serde::Deserialize;
use serde_json::Value;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The runner's source, run with `python -c`.
const RUNNER: &str = include_str!("../../../models/podctl_models/reward_runner.py");
/// The longest line a runner may send (a step's rewards are numbers: a few KiB).
const MAX_LINE_BYTES: u64 = 64 << 20;
/// Lines of a runner's stderr kept for error messages.
const STDERR_LINES: usize = 40;
/// How long loading the modules may take (imports can be slow: numpy, a sandbox).
const LOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// What went wrong with a Python reward function. Every variant names it.
#[derive(Debug, thiserror::Error)]
pub enum RewardError {
    /// The Python interpreter could not be started.
    #[error(
        "cannot start the reward functions' Python {python}: {source}; set PODCTL_PYTHON to the project's Python"
    )]
    Start {
        /// The interpreter.
        python: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The module did not import, or has no such function.
    #[error("reward function {function}: cannot load it: {message}")]
    Load {
        /// `module.py:function`.
        function: String,
        /// Python's traceback.
        message: String,
    },
    /// The function raised.
    #[error("reward function {function} raised at step {step}:\n{traceback}")]
    Raised {
        /// `module.py:function`.
        function: String,
        /// The 1-based step.
        step: u64,
        /// Python's traceback.
        traceback: String,
    },
    /// It returned a list of the wrong length.
    #[error("reward function {function} at step {step}: {message}; it must return one reward per completion")]
    WrongLength {
        /// `module.py:function`.
        function: String,
        /// The 1-based step.
        step: u64,
        /// What it returned.
        message: String,
    },
    /// It returned something that is not a finite number or None.
    #[error("reward function {function} at step {step}: {message}")]
    BadValue {
        /// `module.py:function`.
        function: String,
        /// The 1-based step.
        step: u64,
        /// The value and the row.
        message: String,
    },
    /// A call took longer than `grpo.reward_timeout_seconds`; the process was killed.
    #[error(
        "reward function {function} took more than {seconds} s at step {step} (grpo.reward_timeout_seconds); \
         its process was stopped"
    )]
    Timeout {
        /// `module.py:function`.
        function: String,
        /// The 1-based step.
        step: u64,
        /// The timeout.
        seconds: f64,
    },
    /// The process died or broke the conversation.
    #[error("reward function {function}: its Python process {what}{}", tail(stderr))]
    Died {
        /// `module.py:function`.
        function: String,
        /// What happened.
        what: String,
        /// The end of its stderr.
        stderr: String,
    },
}

impl fault::Classify for RewardError {
    /// A function that does not load, raises, returns what is not a reward or takes too long is
    /// the job's to fix; an interpreter that does not start or a process that dies is this host's.
    fn fault(&self) -> fault::Fault {
        match self {
            RewardError::Load { .. }
            | RewardError::Raised { .. }
            | RewardError::WrongLength { .. }
            | RewardError::BadValue { .. }
            | RewardError::Timeout { .. } => fault::Fault::Input,
            RewardError::Start { .. } | RewardError::Died { .. } => fault::Fault::Failed,
        }
    }
}

fn tail(stderr: &str) -> String {
    if stderr.is_empty() { String::new() } else { format!("; its last output:\n{stderr}") }
}

/// A Python reward function: its module file (local) and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonFunction {
    /// The module file, on this host.
    pub module: PathBuf,
    /// The function's name.
    pub function: String,
}

impl PythonFunction {
    fn label(&self) -> String {
        format!("{}:{}", self.module.display(), self.function)
    }
}

/// One process's share of a call: its rows' arguments.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Call {
    /// The prompts (text, or message lists).
    pub prompts: Vec<Value>,
    /// The completions (text, or `[{"role": "assistant", "content": ...}]`).
    pub completions: Vec<Value>,
    /// The other keyword arguments: the data's columns and `completion_ids`, one list each.
    pub kwargs: serde_json::Map<String, Value>,
}

impl Call {
    /// Rows in the call.
    pub fn rows(&self) -> usize {
        self.completions.len()
    }
}

/// The processes. See the module docs.
pub struct RewardPool {
    python: PathBuf,
    functions: Vec<PythonFunction>,
    timeout: Duration,
    members: Vec<Option<Member>>,
}

impl std::fmt::Debug for RewardPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardPool")
            .field("python", &self.python)
            .field("functions", &self.functions)
            .field("processes", &self.members.len())
            .finish()
    }
}

struct Member {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Result<String, String>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Reply {
    Loaded { loaded: usize },
    Rewards { rewards: Vec<Option<f64>> },
    Error { error: ReplyError },
}

#[derive(Deserialize)]
struct ReplyError {
    kind: String,
    message: String,
    /// Which function a load error is about.
    #[serde(default)]
    function: Option<usize>,
}

/// Why no reply came.
enum NoReply {
    /// Not before the deadline.
    TimedOut,
    /// The process broke the conversation: what happened.
    Broken(String),
}

impl RewardPool {
    /// Starts `processes` runners of `python` (in `dir`, where relative module paths resolve)
    /// and loads `functions` in each; a module that does not load is an error now.
    pub fn start(
        python: &Path,
        dir: &Path,
        functions: Vec<PythonFunction>,
        processes: usize,
        timeout: Duration,
    ) -> Result<Self, RewardError> {
        let functions =
            functions.into_iter().map(|f| PythonFunction { module: dir.join(&f.module), ..f }).collect();
        let mut pool = Self {
            python: python.to_path_buf(),
            functions,
            timeout,
            members: (0..processes.max(1)).map(|_| None).collect(),
        };
        for index in 0..pool.members.len() {
            pool.member(index)?;
        }
        Ok(pool)
    }

    /// Processes in the pool.
    pub fn processes(&self) -> usize {
        self.members.len()
    }

    /// Process `index`, started (and its functions loaded) if it is not running.
    fn member(&mut self, index: usize) -> Result<&mut Member, RewardError> {
        if self.members[index].is_none() {
            let member = self.spawn()?;
            self.members[index] = Some(member);
        }
        Ok(self.members[index].as_mut().expect("started above"))
    }

    fn spawn(&self) -> Result<Member, RewardError> {
        let mut child = Command::new(&self.python)
            .args(["-u", "-c", RUNNER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| RewardError::Start { python: self.python.clone(), source })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let stderr_pipe = child.stderr.take().expect("piped");
        let (send, lines) = channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut line = Vec::new();
                match (&mut reader).take(MAX_LINE_BYTES).read_until(b'\n', &mut line) {
                    Ok(0) => return,
                    Ok(_) if !line.ends_with(b"\n") => {
                        let _ = send.send(Err(format!("sent a line longer than {MAX_LINE_BYTES} bytes")));
                        return;
                    }
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&line).into_owned();
                        if send.send(Ok(line)).is_err() {
                            return;
                        }
                    }
                    Err(error) => {
                        let _ = send.send(Err(error.to_string()));
                        return;
                    }
                }
            }
        });
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let kept = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr_pipe).lines() {
                let Ok(line) = line else { return };
                tracing::info!(target: "podctl::rewards", "{line}");
                if let Ok(mut kept) = kept.lock() {
                    if kept.len() == STDERR_LINES {
                        kept.pop_front();
                    }
                    kept.push_back(line);
                }
            }
        });
        let mut member = Member { child, stdin, lines, stderr };
        let load: Vec<Value> = self
            .functions
            .iter()
            .map(|f| serde_json::json!({"module": f.module, "function": f.function}))
            .collect();
        let everything = self.functions.iter().map(PythonFunction::label).collect::<Vec<_>>().join(", ");
        member.send(&serde_json::json!({"load": load})).map_err(|what| member.died(&everything, what))?;
        match member.receive(Instant::now() + LOAD_TIMEOUT) {
            Ok(Reply::Loaded { loaded }) if loaded == self.functions.len() => Ok(member),
            Ok(Reply::Error { error }) => {
                let function = error
                    .function
                    .and_then(|i| self.functions.get(i))
                    .map_or(everything, PythonFunction::label);
                Err(RewardError::Load { function, message: error.message })
            }
            Ok(_) => Err(member.died(&everything, "answered the load with something else".into())),
            Err(NoReply::TimedOut) => {
                Err(member.died(&everything, format!("did not load within {} s", LOAD_TIMEOUT.as_secs())))
            }
            Err(NoReply::Broken(what)) => Err(member.died(&everything, what)),
        }
    }

    /// Calls function `index` with each process's share of the rows (`calls`, at most one per
    /// process), at 0-based `step` of `steps`; returns each share's rewards, in order.
    pub fn call(
        &mut self,
        index: usize,
        calls: &[Call],
        step: u64,
        steps: u64,
    ) -> Result<Vec<Vec<Option<f64>>>, RewardError> {
        let function = self.functions[index].label();
        let state = serde_json::json!({"global_step": step, "max_steps": steps});
        let deadline = Instant::now() + self.timeout;
        let mut sent = Vec::with_capacity(calls.len());
        for (member, call) in calls.iter().enumerate() {
            let request = serde_json::json!({
                "call": index,
                "prompts": call.prompts,
                "completions": call.completions,
                "kwargs": call.kwargs,
                "trainer_state": state,
            });
            let process = self.member(member)?;
            if let Err(what) = process.send(&request) {
                let error = process.died(&function, what);
                self.members[member] = None;
                return Err(error);
            }
            sent.push(member);
        }
        let mut out = Vec::with_capacity(calls.len());
        let mut failure = None;
        for member in sent {
            let reply = self.members[member].as_mut().expect("sent to it").receive(deadline);
            let result = match reply {
                Ok(Reply::Rewards { rewards }) if rewards.len() == calls[member].rows() => Ok(rewards),
                Ok(Reply::Rewards { rewards }) => Err(RewardError::WrongLength {
                    function: function.clone(),
                    step: step + 1,
                    message: format!(
                        "returned {} rewards for {} completions",
                        rewards.len(),
                        calls[member].rows()
                    ),
                }),
                Ok(Reply::Error { error }) => Err(match error.kind.as_str() {
                    "length" => RewardError::WrongLength {
                        function: function.clone(),
                        step: step + 1,
                        message: error.message,
                    },
                    "value" => RewardError::BadValue {
                        function: function.clone(),
                        step: step + 1,
                        message: error.message,
                    },
                    _ => RewardError::Raised {
                        function: function.clone(),
                        step: step + 1,
                        traceback: error.message,
                    },
                }),
                Ok(Reply::Loaded { .. }) => {
                    let process = self.members[member].as_ref().expect("sent to it");
                    Err(process.died(&function, "answered a call with a load".into()))
                }
                Err(NoReply::TimedOut) => {
                    // It may still be running the function: stop it, start a fresh one next time.
                    self.members[member] = None;
                    Err(RewardError::Timeout {
                        function: function.clone(),
                        step: step + 1,
                        seconds: self.timeout.as_secs_f64(),
                    })
                }
                Err(NoReply::Broken(what)) => {
                    let error = self.members[member].as_ref().expect("sent to it").died(&function, what);
                    self.members[member] = None;
                    Err(error)
                }
            };
            match result {
                Ok(rewards) => out.push(rewards),
                // The other processes' replies are still read, so none is left in a pipe.
                Err(error) => failure = failure.or(Some(error)),
            }
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(out),
        }
    }
}

impl Member {
    fn send(&mut self, message: &Value) -> Result<(), String> {
        let mut line = serde_json::to_vec(message).map_err(|e| e.to_string())?;
        line.push(b'\n');
        self.stdin
            .write_all(&line)
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("stopped reading ({e})"))
    }

    fn receive(&mut self, deadline: Instant) -> Result<Reply, NoReply> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(wait) {
            Ok(Ok(line)) => serde_json::from_str(&line)
                .map_err(|e| NoReply::Broken(format!("sent what is not a reply ({e}): {line:.200}"))),
            Ok(Err(what)) => Err(NoReply::Broken(what)),
            Err(RecvTimeoutError::Timeout) => Err(NoReply::TimedOut),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                Err(NoReply::Broken(format!("exited ({status})")))
            }
        }
    }

    fn died(&self, function: &str, what: String) -> RewardError {
        // Give the stderr reader a moment to take the process's last words.
        std::thread::sleep(Duration::from_millis(50));
        let stderr = self
            .stderr
            .lock()
            .map(|lines| lines.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default();
        RewardError::Died { function: function.to_owned(), what, stderr }
    }
}
