//! The worker agent: one process per host, driven by the coordinator.
//!
//! Two sides meet in [`Shared`]. The trainer side (the calling thread) owns the PJRT slice and the
//! train state and runs assignments step by step. The session side (a small tokio runtime) keeps
//! the session with the leader: heartbeats carrying where the trainer is (generation, steps
//! done, phase) go up, directives come down; it reports steps in order and resends what was not
//! acknowledged, and forwards log lines. A quiesce or stop from the leader, or SIGTERM, raises a
//! flag the trainer checks between steps and aborts the all-reduce in flight, so the trainer
//! stops at a step boundary: the state it holds is always that of a whole number of steps.
//!
//! The job's bundle compiles before the worker registers: a replacement joins a running job
//! ready to train, so the survivors never wait for its compile. A worker the job went on without
//! (lost, cut off, named by a peer) is told so when it reaches the leader again; it registers
//! anew, keeping its compiled bundle, and catches up from a live peer.

use crate::WorkerError;
use crate::ckpt::{self, PendingSave, SaveLayout, SavePoll, SaveStart, StateSaver};
use crate::compile_cache::CompileCache;
use crate::dp::Reduce;
use crate::grpo::{self, JobSteps};
use crate::metrics::WorkerMetrics;
use crate::peer::{self, StateServer};
use crate::slice::Slice;
use crate::trainer::Trainer;
use checkpoint::{SaveOptions, Storage, StoreOptions};
use client::{Client, ClientConfig, ClientError, LogLine, Session};
use collective::{AbortHandle, Endpoint, GroupSpec};
use job::JobSpec;
use proto::v1::{
    self, Assignment, CheckpointReport, Directive, Heartbeat, StepReport, WorkerEvent, directive, resume,
    worker_event,
};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc as std_mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch};

/// Steps the trainer may run ahead of the last acknowledged report.
const REPORTS_IN_FLIGHT: usize = 2;
/// Log lines queued for the coordinator before new ones are dropped.
const LOG_QUEUE: usize = 1024;
/// How long a replacement waits for its peer to offer the state.
const PEER_STATE_WAIT: Duration = Duration::from_secs(120);
/// How long a preempted worker holds its session for the leader to take the notice.
const PREEMPTION_NOTICE_WAIT: Duration = Duration::from_secs(3);
/// Forming the ring waits this long for every member: members catch up (or restore) first.
const FORM_TIMEOUT: Duration = Duration::from_secs(300);
/// Removals in a row, with no step done in between, after which the worker stops rejoining: a
/// worker that cannot take part must not churn the job's generations for ever.
const MAX_FRUITLESS_REJOINS: u32 = 3;
/// The rendezvous key under which a worker announces its state server.
fn state_key(worker_id: &str) -> String {
    format!("state-addr/{worker_id}")
}

/// How a worker process runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// How to reach the coordinator cluster, with the job's token.
    pub coordinator: ClientConfig,
    /// The job to work for.
    pub job_id: String,
    /// The PJRT plugin.
    pub plugin: PathBuf,
    /// This host's name, for people.
    pub host: String,
    /// The instance id to register under (a worker pod's name); default: host, pid and time.
    pub instance_id: Option<String>,
    /// Where the data plane (all-reduce, state transfer) listens; peers must reach it.
    pub bind: IpAddr,
    /// The slice this worker was started for, when it knows (pods do).
    pub slice: Option<u32>,
    /// Where to serve Prometheus metrics (`/metrics`); port 0 picks one.
    pub metrics_listen: Option<SocketAddr>,
    /// A file to write the metrics address into once bound (for launchers that chose port 0).
    pub metrics_addr_file: Option<PathBuf>,
    /// Where compiled programs are kept, so a worker started again loads instead of compiling.
    pub compile_cache: Option<PathBuf>,
}

/// Why the agent returned.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentExit {
    /// The coordinator said stop (the job ended, or this worker was removed from it).
    Stopped(String),
    /// SIGTERM: the coordinator was told, the survivors carry on.
    Preempted,
}

/// Why the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The coordinator could not be reached or refused this worker.
    #[error("coordinator: {0}")]
    Coordinator(#[from] ClientError),
    /// A listener or the runtime could not start.
    #[error("{context}: {source}")]
    Io {
        /// What the agent was starting.
        context: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The collective data plane could not start.
    #[error("data plane: {0}")]
    Collective(#[from] collective::Error),
    /// The job's bundle could not be loaded or compiled.
    #[error("{0}")]
    Bundle(String),
}

/// Where the trainer is; every heartbeat carries it.
#[derive(Debug, Clone, Default)]
struct Status {
    generation: u64,
    steps_done: u64,
    phase: &'static str,
}

/// What the session side tells the trainer.
enum Control {
    Assign(Box<Assignment>),
    Quiesce(u64),
    Stop(Leave),
}

/// Why one registration's work ended.
enum Leave {
    /// The process is done.
    Exit(AgentExit),
    /// The job goes on without this worker id: register again.
    Rejoin(String),
}

/// What the two sides of one registration share.
struct Shared {
    status: watch::Sender<Status>,
    /// The newest generation the leader asked to move to.
    quiesce: AtomicU64,
    stop: AtomicBool,
    /// Aborts the collective of the generation in flight.
    abort: Mutex<Option<AbortHandle>>,
    /// Cancels the peer catch-up in flight.
    fetch: Mutex<Option<peer::Cancel>>,
}

impl Shared {
    fn new(status: Status) -> Shared {
        Shared {
            status: watch::channel(status).0,
            quiesce: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            abort: Mutex::new(None),
            fetch: Mutex::new(None),
        }
    }

    fn interrupt(&self) {
        if let Some(abort) = self.abort.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            abort.abort();
        }
        if let Some(fetch) = self.fetch.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            fetch.cancel();
        }
    }

    fn interrupted(&self, generation: u64) -> bool {
        self.stop.load(Ordering::SeqCst) || self.quiesce.load(Ordering::SeqCst) > generation
    }

    fn publish(&self, update: impl FnOnce(&mut Status)) {
        self.status.send_modify(update);
    }
}

/// Runs the worker until the coordinator stops it or SIGTERM arrives.
pub fn run(mut config: AgentConfig) -> Result<AgentExit, AgentError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("agent")
        .build()
        .map_err(|source| AgentError::Io { context: "starting the agent runtime", source })?;
    // The client's channels spawn their connection tasks on the runtime they are made in.
    let client = {
        let _inside = runtime.enter();
        Client::new(config.coordinator.clone())?
    };
    let endpoint = Endpoint::bind(SocketAddr::new(config.bind, 0))?;
    let state_server = StateServer::bind(SocketAddr::new(config.bind, 0))
        .map_err(|source| AgentError::Io { context: "binding the state server", source })?;
    let job = runtime.block_on(client.get_job(&config.job_id))?;
    // Registration names the job by id; people may have given its name.
    config.job_id = job.job_id.clone();

    let metrics = Arc::new(WorkerMetrics::default());
    let worker_label = Arc::new(Mutex::new(String::new()));
    if let Some(listen) = config.metrics_listen {
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(listen))
            .map_err(|source| AgentError::Io { context: "binding the metrics listener", source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| AgentError::Io { context: "the metrics listener", source })?;
        if let Some(file) = &config.metrics_addr_file {
            std::fs::write(file, addr.to_string())
                .map_err(|source| AgentError::Io { context: "writing the metrics address file", source })?;
        }
        tracing::info!(%addr, "serving Prometheus metrics at /metrics");
        let (metrics, job, worker) = (metrics.clone(), config.job_id.clone(), worker_label.clone());
        runtime.spawn(crate::metrics::serve(listener, move || {
            metrics.render(&job, &worker.lock().unwrap_or_else(|e| e.into_inner()))
        }));
    }
    let (logs_tx, logs_rx) = mpsc::channel(LOG_QUEUE);
    runtime.spawn(forward_logs(client.clone(), logs_rx));

    let mut trainer = TrainerSide {
        config,
        worker_id: String::new(),
        client,
        runtime: runtime.handle().clone(),
        shared: Arc::new(Shared::new(Status::default())),
        endpoint,
        state_server,
        events: mpsc::channel(1).0,
        reports: mpsc::channel(1).0,
        logs: logs_tx,
        loaded: None,
        holds_state: false,
        steps_done: 0,
        steps_this_registration: 0,
        registrations: 0,
        generation: 0,
        metrics,
    };
    trainer.prepare(&job.bundle_uri, &job.bundle_id).map_err(|e| AgentError::Bundle(e.to_string()))?;
    let mut fruitless = 0;
    let exit = loop {
        let registration = trainer.register(&runtime)?;
        *worker_label.lock().unwrap_or_else(|e| e.into_inner()) = trainer.worker_id.clone();
        let leave = trainer.run(registration.control);
        for task in registration.tasks {
            task.abort();
        }
        match leave {
            Leave::Exit(exit) => break exit,
            Leave::Rejoin(reason) => {
                fruitless = if trainer.steps_this_registration == 0 { fruitless + 1 } else { 0 };
                if fruitless >= MAX_FRUITLESS_REJOINS {
                    break AgentExit::Stopped(format!(
                        "{reason}; not rejoining: removed {fruitless} times in a row without a step done"
                    ));
                }
                trainer.log("warn", format!("{reason}; registering again"));
            }
        }
    };
    // Let the last reports and log lines go out before the runtime is dropped.
    std::thread::sleep(Duration::from_millis(300));
    runtime.shutdown_timeout(Duration::from_secs(2));
    Ok(exit)
}

/// One registration's session: the trainer's end of it and the tasks to end with it.
struct Registration {
    control: std_mpsc::Receiver<Control>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn heartbeat(worker_id: &str, status: &Status, seq: u64) -> WorkerEvent {
    WorkerEvent {
        event: Some(worker_event::Event::Heartbeat(Heartbeat {
            worker_id: worker_id.into(),
            generation: status.generation,
            steps_done: status.steps_done,
            phase: status.phase.into(),
            rss_bytes: rss_bytes(),
            seq,
        })),
    }
}

/// This process's resident memory, from procfs (0 where there is none).
pub(crate) fn rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else { return 0 };
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

#[derive(Clone)]
struct SessionSide {
    client: Client,
    worker_id: String,
    shared: Arc<Shared>,
}

impl SessionSide {
    /// Keeps a session with whichever node leads, reconnecting when it ends.
    /// A session on which the leader says nothing (not even a heartbeat's ack) for `silence`
    /// is taken for dead and replaced: after a partition heals, the worker is back at once
    /// instead of when its transport's keepalive gives up.
    async fn run(
        self,
        heartbeat_every: Duration,
        silence: Duration,
        control: std_mpsc::Sender<Control>,
        mut events: mpsc::Receiver<WorkerEvent>,
    ) {
        let mut status = self.shared.status.subscribe();
        let mut sigterm = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("cannot watch for SIGTERM: {e}");
                None
            }
        };
        let mut seq = 0u64;
        let mut assigned = 0u64;
        // An event the last session could not take is sent on the next one.
        let mut unsent: Option<WorkerEvent> = None;
        loop {
            seq += 1;
            let first = heartbeat(&self.worker_id, &status.borrow(), seq);
            let connected = tokio::select! {
                connected = self.client.session(first) => connected,
                // Preempted while no leader can be reached: there is nobody to tell.
                _ = async { sigterm.as_mut().expect("guarded").recv().await }, if sigterm.is_some() => {
                    tracing::warn!("SIGTERM with no session to the coordinator: leaving the job");
                    self.shared.stop.store(true, Ordering::SeqCst);
                    self.shared.interrupt();
                    let _ = control.send(Control::Stop(Leave::Exit(AgentExit::Preempted)));
                    return;
                }
            };
            let mut session = match connected {
                Ok(session) => session,
                Err(e) => {
                    tracing::warn!("session with the coordinator: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            if let Some(event) = unsent.take()
                && let Err(e) = session.events.send(event).await
            {
                unsent = Some(e.0);
                continue;
            }
            let mut beat = tokio::time::interval(heartbeat_every);
            let mut heard = tokio::time::Instant::now();
            loop {
                let mut send_heartbeat = false;
                tokio::select! {
                    message = session.directives.message() => {
                        let Ok(Some(Directive { directive: Some(d) })) = message else { break };
                        heard = tokio::time::Instant::now();
                        if let Some(exit) = self.obey(d, &control, &mut assigned) {
                            let _ = control.send(Control::Stop(exit));
                            return;
                        }
                    }
                    _ = beat.tick() => {
                        if heard.elapsed() > silence {
                            tracing::warn!("no word from the coordinator for {:?}", heard.elapsed());
                            break;
                        }
                        send_heartbeat = true;
                    }
                    changed = status.changed() => {
                        if changed.is_err() { return; }
                        send_heartbeat = true;
                    }
                    Some(event) = events.recv() => {
                        if let Err(e) = session.events.send(event).await {
                            unsent = Some(e.0);
                            break;
                        }
                    }
                    _ = async { sigterm.as_mut().expect("guarded").recv().await }, if sigterm.is_some() => {
                        self.preempted(&mut session, &control).await;
                        return;
                    }
                }
                if send_heartbeat {
                    seq += 1;
                    let event = heartbeat(&self.worker_id, &status.borrow_and_update(), seq);
                    if session.events.send(event).await.is_err() {
                        break;
                    }
                }
            }
            tracing::info!("the session with the coordinator ended; reconnecting");
        }
    }

    /// Acts on a directive; `Some` when the worker must stop.
    fn obey(
        &self,
        d: directive::Directive,
        control: &std_mpsc::Sender<Control>,
        assigned: &mut u64,
    ) -> Option<Leave> {
        let acting = self.shared.status.borrow().generation;
        match d {
            directive::Directive::Quiesce(q) if q.generation > acting => {
                tracing::info!(generation = q.generation, "quiesce: {}", q.reason);
                self.shared.quiesce.fetch_max(q.generation, Ordering::SeqCst);
                self.shared.interrupt();
                let _ = control.send(Control::Quiesce(q.generation));
            }
            // The leader repeats the assignment in force on every new session: forward it once.
            directive::Directive::Assignment(a) if a.generation > *assigned => {
                *assigned = a.generation;
                if a.generation > acting {
                    self.shared.quiesce.fetch_max(a.generation, Ordering::SeqCst);
                    self.shared.interrupt();
                }
                let _ = control.send(Control::Assign(Box::new(a)));
            }
            directive::Directive::Stop(stop) => {
                tracing::info!("stop: {}", stop.reason);
                self.shared.stop.store(true, Ordering::SeqCst);
                self.shared.interrupt();
                return Some(if stop.removed {
                    Leave::Rejoin(stop.reason)
                } else {
                    Leave::Exit(AgentExit::Stopped(stop.reason))
                });
            }
            _ => {}
        }
        None
    }

    /// SIGTERM: tell the leader at once, so it re-forms the job without waiting for the lease.
    async fn preempted(&self, session: &mut Session, control: &std_mpsc::Sender<Control>) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.interrupt();
        let status = self.shared.status.borrow().clone();
        tracing::warn!(step = status.steps_done, "SIGTERM: leaving the job");
        let notice = WorkerEvent {
            event: Some(worker_event::Event::Preempted(v1::Preempted {
                worker_id: self.worker_id.clone(),
                generation: status.generation,
                reason: "SIGTERM".into(),
                deadline_ms: 30_000,
            })),
        };
        if session.events.send(notice).await.is_ok() {
            // Dropping the session resets its stream, possibly before the notice is on the
            // wire: hold it until the leader answers with a stop or ends the session.
            let answered = tokio::time::timeout(PREEMPTION_NOTICE_WAIT, async {
                while let Ok(Some(d)) = session.directives.message().await {
                    if matches!(
                        d.directive,
                        Some(directive::Directive::Stop(_) | directive::Directive::Quiesce(_))
                    ) {
                        return;
                    }
                }
            });
            if answered.await.is_err() {
                tracing::warn!(
                    "the leader did not answer the preemption notice within {PREEMPTION_NOTICE_WAIT:?}"
                );
            }
        }
        let _ = control.send(Control::Stop(Leave::Exit(AgentExit::Preempted)));
    }

    /// Reports steps in order; a report is repeated until the step is committed or the job has
    /// moved to another generation (which commits or drops it).
    async fn report_steps(self, mut reports: mpsc::Receiver<StepReport>) {
        while let Some(report) = reports.recv().await {
            loop {
                if self.shared.stop.load(Ordering::SeqCst)
                    || self.shared.status.borrow().generation > report.generation
                {
                    break;
                }
                match self.client.report_step(report.clone()).await {
                    Ok(ack) if ack.committed_step >= report.step || ack.generation != report.generation => {
                        break;
                    }
                    Ok(_) => continue,
                    Err(e) if e.code() == tonic::Code::Unavailable => {
                        tracing::warn!(step = report.step, "step report: {e}; repeating it");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => {
                        tracing::warn!(step = report.step, "step report refused: {e}");
                        break;
                    }
                }
            }
        }
    }
}

/// Sends log lines in batches, at most every half second.
async fn forward_logs(client: Client, mut lines: mpsc::Receiver<LogLine>) {
    let mut batch = Vec::new();
    while let Some(line) = lines.recv().await {
        batch.push(line);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        while batch.len() < 256 {
            match tokio::time::timeout_at(deadline, lines.recv()).await {
                Ok(Some(line)) => batch.push(line),
                _ => break,
            }
        }
        if let Err(e) = client.push_logs(std::mem::take(&mut batch)).await {
            tracing::debug!("log lines to the coordinator: {e}");
        }
    }
}

/// A compiled bundle and the state on device.
struct Loaded {
    bundle_id: String,
    trainer: Trainer,
}

/// How an assignment ended.
enum Ended {
    /// Every step of the job is done.
    Finished,
    /// A quiesce or stop interrupted it at a step boundary.
    Interrupted,
    /// It failed; the leader was told.
    Failed,
}

struct TrainerSide {
    config: AgentConfig,
    worker_id: String,
    client: Client,
    runtime: tokio::runtime::Handle,
    shared: Arc<Shared>,
    endpoint: Endpoint,
    state_server: StateServer,
    events: mpsc::Sender<WorkerEvent>,
    reports: mpsc::Sender<StepReport>,
    logs: mpsc::Sender<LogLine>,
    loaded: Option<Loaded>,
    /// Whether the device holds the state after `steps_done` steps (not so after a compile, or
    /// after an upload that failed half-way).
    holds_state: bool,
    steps_done: u64,
    /// Steps done since the last registration: a rejoin that never gets to train is fruitless.
    steps_this_registration: u64,
    /// Registrations so far (the first one uses the configured instance id as it is).
    registrations: u32,
    generation: u64,
    metrics: Arc<WorkerMetrics>,
}

impl TrainerSide {
    /// Compiles the job's bundle before registering.
    fn prepare(&mut self, bundle_uri: &str, bundle_id: &str) -> Result<(), AssignmentError> {
        self.log("info", format!("compiling the job's bundle {} before registering", short(bundle_id)));
        self.load(bundle_uri, bundle_id)
    }

    /// Registers (again) with the job and starts this registration's session, step reports and
    /// state announcement. The worker id is new each time; the compiled bundle stays.
    fn register(&mut self, runtime: &tokio::runtime::Runtime) -> Result<Registration, AgentError> {
        let config = &self.config;
        // Registering again under the same instance id would return the removed worker id.
        self.registrations += 1;
        let instance_id = match (&config.instance_id, self.registrations) {
            (Some(id), 1) => id.clone(),
            (Some(id), n) => format!("{id}-r{n}"),
            (None, _) => format!(
                "{}-{}-{}",
                config.host,
                std::process::id(),
                SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos()
            ),
        };
        let registered = runtime.block_on(self.client.register(v1::RegisterRequest {
            job_id: config.job_id.clone(),
            host: config.host.clone(),
            data_addr: self.endpoint.local_addr().to_string(),
            devices: 0,
            platform: String::new(),
            slice: config.slice,
            instance_id,
        }))?;
        self.worker_id = registered.worker_id;
        runtime.block_on(self.client.kv_put(
            &config.job_id,
            &state_key(&self.worker_id),
            self.state_server.local_addr().to_string().into_bytes(),
            None,
        ))?;
        tracing::info!(worker = %self.worker_id, data = %self.endpoint.local_addr(), "registered with the coordinator");
        self.steps_this_registration = 0;
        self.shared = Arc::new(Shared::new(Status {
            generation: self.generation,
            steps_done: self.steps_done,
            phase: "ready",
        }));
        let (control_tx, control) = std_mpsc::channel();
        let (events_tx, events_rx) = mpsc::channel(64);
        let (reports_tx, reports_rx) = mpsc::channel(REPORTS_IN_FLIGHT - 1);
        self.events = events_tx;
        self.reports = reports_tx;
        let heartbeat = Duration::from_millis(registered.heartbeat_ms.max(50));
        let silence = Duration::from_millis(registered.lease_ms.max(registered.heartbeat_ms * 2).max(100));
        let session = SessionSide {
            client: self.client.clone(),
            worker_id: self.worker_id.clone(),
            shared: self.shared.clone(),
        };
        let tasks = vec![
            runtime.spawn(session.clone().run(heartbeat, silence, control_tx, events_rx)),
            runtime.spawn(session.report_steps(reports_rx)),
        ];
        Ok(Registration { control, tasks })
    }

    fn run(&mut self, control: std_mpsc::Receiver<Control>) -> Leave {
        while let Ok(command) = control.recv() {
            match command {
                Control::Stop(leave) => return leave,
                Control::Quiesce(generation) if generation > self.generation => {
                    self.generation = generation;
                    self.publish("ready");
                }
                Control::Quiesce(_) => {}
                Control::Assign(a) if a.generation >= self.generation => {
                    // A newer directive already waiting makes this one moot.
                    if self.shared.interrupted(a.generation) {
                        continue;
                    }
                    self.generation = a.generation;
                    match self.assignment(&a) {
                        Ok(Ended::Finished) => self.publish("done"),
                        Ok(Ended::Interrupted | Ended::Failed) => self.publish("ready"),
                        Err(e) => {
                            self.log("error", format!("generation {}: {e}", a.generation));
                            self.fail(e.to_string(), String::new());
                            self.publish("ready");
                        }
                    }
                }
                Control::Assign(_) => {}
            }
        }
        Leave::Exit(AgentExit::Stopped("the session with the coordinator ended".into()))
    }

    fn publish(&self, phase: &'static str) {
        let (generation, steps_done) = (self.generation, self.steps_done);
        self.metrics.step.set(steps_done as f64);
        self.metrics.generation.set(generation as f64);
        self.shared.publish(|s| *s = Status { generation, steps_done, phase });
    }

    fn log(&self, level: &str, message: String) {
        // Structured fields, so JSON logs (`--log-json`) can be filtered by job, slice and step.
        let (job, worker, slice) = (&self.config.job_id, &self.worker_id, self.config.slice);
        let (step, generation) = (self.steps_done, self.generation);
        match level {
            "error" => tracing::error!(job, worker, slice, step, generation, "{message}"),
            "warn" => tracing::warn!(job, worker, slice, step, generation, "{message}"),
            _ => tracing::info!(job, worker, slice, step, generation, "{message}"),
        }
        let line = LogLine { level: level.into(), message, ..self.line_template() };
        // A full queue drops the line: logs never hold up training.
        let _ = self.logs.try_send(line);
    }

    /// A log line of this worker, now, at its step and generation.
    fn line_template(&self) -> LogLine {
        LogLine {
            job_id: self.config.job_id.clone(),
            worker_id: self.worker_id.clone(),
            slice: self.config.slice.unwrap_or_default(),
            unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64,
            level: "info".into(),
            message: String::new(),
            step: self.steps_done,
            generation: self.generation,
        }
    }

    fn fail(&self, reason: String, suspect_worker_id: String) {
        let event = WorkerEvent {
            event: Some(worker_event::Event::Failed(v1::Failed {
                worker_id: self.worker_id.clone(),
                generation: self.generation,
                reason,
                suspect_worker_id,
            })),
        };
        let _ = self.events.blocking_send(event);
    }

    /// Runs one generation's assignment until the job's last step or an interruption.
    fn assignment(&mut self, a: &Assignment) -> Result<Ended, AssignmentError> {
        let spec = JobSpec::from_yaml(&a.spec_yaml, std::path::Path::new("<assigned spec>"))
            .map_err(|e| AssignmentError(format!("the assigned job spec: {e}")))?;
        self.log(
            "info",
            format!(
                "generation {}: ranks {:?} of {}, {} member(s), from step {} ({})",
                a.generation,
                a.virtual_ranks,
                a.dp_size,
                a.peers.len(),
                a.start_step,
                resume_name(a)
            ),
        );
        self.load(&a.bundle_uri, &a.bundle_id)?;
        if self.shared.interrupted(a.generation) {
            return Ok(Ended::Interrupted);
        }
        if let Err(e) = self.resume(a, &spec) {
            // A catch-up cancelled by a newer generation is no failure of this worker.
            return if self.shared.interrupted(a.generation) { Ok(Ended::Interrupted) } else { Err(e) };
        }
        if self.shared.interrupted(a.generation) {
            return Ok(Ended::Interrupted);
        }

        let abort = AbortHandle::new();
        *self.shared.abort.lock().unwrap_or_else(|e| e.into_inner()) = Some(abort.clone());
        if self.shared.interrupted(a.generation) {
            return Ok(Ended::Interrupted);
        }
        let group = if a.dp_size > 1 {
            let spec = group_spec(a, &self.worker_id)?;
            let config =
                collective::Config { connect_timeout: FORM_TIMEOUT, ..collective::Config::default() };
            match self.endpoint.form(&spec, &config, &abort) {
                Ok(group) => Some(group),
                Err(_) if self.shared.interrupted(a.generation) => return Ok(Ended::Interrupted),
                Err(e) => return Err(AssignmentError(format!("forming the all-reduce ring: {e}"))),
            }
        } else {
            None
        };
        self.publish("training");

        let mut loaded = self.loaded.take().expect("loaded above");
        let ended = self.train(&mut loaded.trainer, a, &spec, group.as_ref());
        self.loaded = Some(loaded);
        ended
    }

    /// Runs the job's steps from `steps_done` until the last one or an interruption.
    fn train(
        &mut self,
        trainer: &mut Trainer,
        a: &Assignment,
        spec: &JobSpec,
        group: Option<&collective::Group>,
    ) -> Result<Ended, AssignmentError> {
        let steps =
            JobSteps::new(trainer, spec, &self.runtime).map_err(|e| AssignmentError(e.to_string()))?;
        let mut eval = BTreeMap::new();
        if self.steps_done == 0 {
            self.evaluate(&steps, trainer, "eval_accuracy_initial", &mut eval)?;
        }
        let ranks: Vec<usize> = a.virtual_ranks.iter().map(|&r| r as usize).collect();
        let accum = spec.micro_batches_per_step() / u64::from(a.dp_size.max(1));
        let mut saves = self.saves(a, spec)?;
        while self.steps_done < spec.steps {
            if let Some(saves) = &mut saves {
                saves.poll(self);
            }
            if self.shared.interrupted(a.generation) {
                return Ok(Ended::Interrupted);
            }
            let step = self.steps_done;
            let started = Instant::now();
            let learning_rate = spec.optimizer.learning_rate(step, spec.steps);
            let reduce = group.map_or(Reduce::Alone, Reduce::Ring);
            let (applied, tokens, mut metrics) =
                match steps.run(trainer, step, &ranks, accum, learning_rate, reduce) {
                    Ok(outcome) => outcome,
                    Err(e) => {
                        // The state is still that of `step` steps: apply runs only after the reduce.
                        trainer.discard_step().map_err(|e| AssignmentError(e.to_string()))?;
                        if self.shared.interrupted(a.generation) {
                            return Ok(Ended::Interrupted);
                        }
                        return Ok(self.step_failed(a, step, e));
                    }
                };
            let seconds = started.elapsed().as_secs_f64();
            self.steps_done = step + 1;
            self.steps_this_registration += 1;
            self.metrics.steps_total.add(1.0);
            self.metrics.tokens_total.add(tokens as f64);
            self.metrics.step_seconds.set(seconds);
            self.metrics.tokens_per_second.set(tokens as f64 / seconds.max(1e-9));
            self.publish("training");
            if steps.eval_due(self.steps_done, spec.steps) {
                self.evaluate(&steps, trainer, "eval_accuracy", &mut eval)?;
            }
            metrics.append(&mut eval);
            metrics.insert("learning_rate".to_string(), learning_rate);
            let report = StepReport {
                job_id: self.config.job_id.clone(),
                worker_id: self.worker_id.clone(),
                generation: a.generation,
                step: step + 1,
                loss_sum: applied.loss_sum,
                token_count: applied.token_count,
                grad_norm: f64::from(applied.grad_norm),
                step_seconds: seconds,
                tokens,
                metrics: metrics.into_iter().collect(),
            };
            if self.reports.blocking_send(report).is_err() {
                return Ok(Ended::Interrupted);
            }
            let loss = applied.loss_sum / applied.token_count.max(1.0);
            self.log("info", format!("step {} loss {loss:.4} ({seconds:.2}s)", step + 1));
            if let Some(saves) = &mut saves
                && self.steps_done.is_multiple_of(saves.every)
                && self.steps_done < spec.steps
            {
                saves.start(self, trainer, self.steps_done)?;
            }
        }
        self.log("info", format!("finished the job's {} steps", spec.steps));
        if let Some(saves) = &mut saves {
            // The final checkpoint completes the job: wait for the one in flight, then save.
            saves.finish(self, trainer, spec.steps)?;
        }
        Ok(Ended::Finished)
    }

    /// A GRPO job's held-out evaluation: logged, and its accuracy put in `metrics` under `name`
    /// for the next step report (every member evaluates alike, so the average is the value).
    fn evaluate(
        &self,
        steps: &JobSteps,
        trainer: &Trainer,
        name: &str,
        metrics: &mut BTreeMap<String, f64>,
    ) -> Result<(), AssignmentError> {
        let Some(report) =
            steps.evaluate(trainer).map_err(|e| AssignmentError(format!("evaluation: {e}")))?
        else {
            return Ok(());
        };
        self.log(
            "info",
            format!(
                "held-out accuracy after step {}: {:.1}% ({} of {} problems, greedy), mean reward {:.3}",
                self.steps_done,
                100.0 * report.accuracy(),
                report.correct,
                report.problems,
                report.reward
            ),
        );
        metrics.insert(name.to_string(), report.accuracy());
        Ok(())
    }

    /// This generation's saver, when the job saves checkpoints: the members of the generation
    /// are the save's hosts, each writing its share of the replica they all hold.
    fn saves(&self, a: &Assignment, spec: &JobSpec) -> Result<Option<Saves>, AssignmentError> {
        let Some(every) = spec.checkpoint.as_ref().map(|c| c.every.max(1)) else { return Ok(None) };
        if a.checkpoint_uri.is_empty() {
            return Ok(None);
        }
        let slice = a.peers.iter().position(|p| p.worker_id == self.worker_id).ok_or_else(|| {
            AssignmentError(format!("this worker ({}) is not among the generation's peers", self.worker_id))
        })?;
        let layout = SaveLayout { dcn: a.peers.len(), slice, seed: spec.seed };
        let storage = Storage::open(&a.checkpoint_uri, &StoreOptions::default())
            .map_err(|e| AssignmentError(format!("checkpoint root {}: {e}", a.checkpoint_uri)))?;
        let saver = StateSaver::new(storage, SaveOptions::default(), layout, self.runtime.clone())
            .map_err(|e| AssignmentError(e.to_string()))?;
        Ok(Some(Saves { saver, every, generation: a.generation, pending: None }))
    }

    /// A step failed without a directive: tell the leader whom to suspect.
    fn step_failed(&mut self, a: &Assignment, step: u64, e: WorkerError) -> Ended {
        let suspect = match &e {
            WorkerError::Collective(
                collective::Error::PeerLost { member, .. } | collective::Error::Protocol { member, .. },
            ) => a.peers.get(*member).map(|p| p.worker_id.clone()),
            // A peer that aborted or relayed a failure was told by someone else, who reports it.
            WorkerError::Collective(_) => None,
            _ => Some(String::new()),
        };
        self.log("warn", format!("step {} failed: {e}", step + 1));
        self.metrics.failed_steps_total.add(1.0);
        if let Some(suspect) = suspect {
            self.fail(format!("step {}: {e}", step + 1), suspect);
        }
        Ended::Failed
    }

    /// Where the job's bundle is on this host: a `file://` bundle where it is, one in
    /// object storage (what `podctl launch` uploads for a cluster) copied once into
    /// `$PODCTL_CACHE/bundles/<id>` (default under the temporary directory).
    fn bundle_dir(&self, bundle_uri: &str, bundle_id: &str) -> Result<PathBuf, AssignmentError> {
        if let Some(path) = bundle_uri.strip_prefix("file://") {
            return Ok(PathBuf::from(path));
        }
        if !bundle_uri.contains("://") {
            return Ok(PathBuf::from(bundle_uri));
        }
        if !checkpoint::layout::is_safe_segment(bundle_id) {
            return Err(AssignmentError(format!("the job's bundle id '{}' is not a name", bundle_id)));
        }
        let cache = std::env::var_os("PODCTL_CACHE")
            .map_or_else(|| std::env::temp_dir().join("podctl"), PathBuf::from);
        let dir = cache.join("bundles").join(bundle_id);
        if dir.join(bundle::MANIFEST_FILE).exists() {
            return Ok(dir);
        }
        let fetch = async {
            let storage = Storage::open(bundle_uri, &StoreOptions::default())?;
            checkpoint::mirror::download_dir(&storage, "", &dir, bundle::MANIFEST_FILE).await
        };
        match self.runtime.block_on(fetch) {
            Ok(copied) => {
                self.log("info", format!("fetched the bundle from {} ({} bytes)", bundle_uri, copied.bytes));
                Ok(dir)
            }
            // Another worker of this host fetched it meanwhile.
            Err(_) if dir.join(bundle::MANIFEST_FILE).exists() => Ok(dir),
            Err(e) => Err(AssignmentError(format!("fetching the job's bundle from {}: {e}", bundle_uri))),
        }
    }

    /// Compiles the job's bundle unless it is the one already loaded.
    fn load(&mut self, bundle_uri: &str, bundle_id: &str) -> Result<(), AssignmentError> {
        if self.loaded.as_ref().is_some_and(|l| l.bundle_id == bundle_id) {
            return Ok(());
        }
        self.publish("loading");
        let path = self.bundle_dir(bundle_uri, bundle_id)?;
        let bundle =
            bundle::Bundle::load(&path).map_err(|e| AssignmentError(format!("the job's bundle: {e}")))?;
        if bundle.id() != bundle_id {
            return Err(AssignmentError(format!(
                "the bundle at {bundle_uri} is {}, but the job was submitted with {bundle_id}; resubmit the job",
                bundle.id(),
            )));
        }
        self.publish("compiling");
        let started = Instant::now();
        let plugin = pjrt::Plugin::load(&self.config.plugin)
            .map_err(|e| AssignmentError(format!("PJRT plugin {}: {e}", self.config.plugin.display())))?;
        let mut slice = Slice::open(plugin, &bundle.manifest().platform, bundle.mesh())
            .map_err(|e| AssignmentError(e.to_string()))?;
        if let Some(dir) = &self.config.compile_cache {
            slice = slice.with_compile_cache(CompileCache::new(dir));
        }
        let trainer = Trainer::new(slice, &bundle).map_err(|e| AssignmentError(e.to_string()))?;
        if let Ok(stats) = trainer.grad_step_memory() {
            self.metrics.device_bytes.set(stats.peak_bytes as f64);
        }
        self.log(
            "info",
            format!(
                "programs of {} ready for {} in {:.1}s{}",
                short(bundle_id),
                bundle.mesh(),
                started.elapsed().as_secs_f64(),
                if self.config.compile_cache.is_some() { " (compile cache on)" } else { "" }
            ),
        );
        self.loaded = Some(Loaded { bundle_id: bundle_id.to_string(), trainer });
        self.holds_state = false;
        self.steps_done = 0;
        Ok(())
    }

    /// Brings the state to the assignment's start step.
    fn resume(&mut self, a: &Assignment, spec: &JobSpec) -> Result<(), AssignmentError> {
        let source = a.resume.as_ref().and_then(|r| r.source.as_ref());
        let loaded = self.loaded.as_mut().expect("loaded before resume");
        match source {
            None | Some(resume::Source::Fresh(_)) => {
                self.holds_state = false;
                let from = grpo::start_policy(&mut loaded.trainer, spec, &self.runtime)
                    .map_err(|e| AssignmentError(format!("starting the policy: {e}")))?;
                self.holds_state = true;
                self.steps_done = 0;
                if let Some(from) = from {
                    self.log("info", format!("the policy starts from {from}"));
                }
            }
            // The state after no step is the initial one: a member told to keep it before it
            // ever initialized (the generation changed before it got to) makes it now.
            Some(resume::Source::Keep(_))
                if !self.holds_state && a.start_step == 0 && self.steps_done == 0 =>
            {
                grpo::start_policy(&mut loaded.trainer, spec, &self.runtime)
                    .map_err(|e| AssignmentError(format!("starting the policy: {e}")))?;
                self.holds_state = true;
                let state = loaded.trainer.download_state().map_err(|e| AssignmentError(e.to_string()))?;
                self.state_server.publish(&a.job_id, 0, state);
            }
            Some(resume::Source::Keep(_)) => {
                if !self.holds_state || self.steps_done != a.start_step {
                    return Err(AssignmentError(format!(
                        "told to keep the state at step {}, but this worker holds step {}",
                        a.start_step, self.steps_done
                    )));
                }
                // A member that is new to the job will ask a survivor for this state.
                let state = loaded.trainer.download_state().map_err(|e| AssignmentError(e.to_string()))?;
                self.state_server.publish(&a.job_id, self.steps_done, state);
            }
            Some(resume::Source::Peer(p)) => {
                self.shared.publish(|s| s.phase = "syncing");
                let started = Instant::now();
                let key = state_key(&p.worker_id);
                let addr = self
                    .runtime
                    .block_on(self.client.kv_get(&a.job_id, &key, Duration::from_secs(30)))
                    .map_err(|e| {
                        AssignmentError(format!("finding peer {}'s state server: {e}", p.worker_id))
                    })?;
                let addr: SocketAddr = String::from_utf8_lossy(&addr)
                    .parse()
                    .map_err(|e| AssignmentError(format!("peer {}'s state address: {e}", p.worker_id)))?;
                let layout = loaded.trainer.state_layout();
                let cancel = peer::Cancel::default();
                *self.shared.fetch.lock().unwrap_or_else(|e| e.into_inner()) = Some(cancel.clone());
                if self.shared.interrupted(a.generation) {
                    cancel.cancel();
                }
                let state = peer::fetch(addr, &a.job_id, p.step, &layout, PEER_STATE_WAIT, &cancel)
                    .map_err(|e| AssignmentError(e.to_string()))?;
                let bytes: usize = state.iter().map(|(_, b)| b.len()).sum();
                self.holds_state = false;
                loaded.trainer.upload_state(&state).map_err(|e| AssignmentError(e.to_string()))?;
                self.holds_state = true;
                self.steps_done = p.step;
                self.metrics.peer_catchups_total.add(1.0);
                self.metrics.peer_catchup_seconds.set(started.elapsed().as_secs_f64());
                self.log(
                    "info",
                    format!(
                        "caught up from peer {} at step {}: {:.1} MiB in {:.2}s",
                        p.worker_id,
                        p.step,
                        bytes as f64 / (1 << 20) as f64,
                        started.elapsed().as_secs_f64()
                    ),
                );
            }
            Some(resume::Source::Checkpoint(c)) => {
                self.shared.publish(|s| s.phase = "restoring");
                let started = Instant::now();
                self.holds_state = false;
                let restored = self
                    .runtime
                    .block_on(ckpt::restore(&mut loaded.trainer, &c.uri, c.step, &StoreOptions::default()))
                    .map_err(|e| AssignmentError(format!("restoring checkpoint {}: {e}", c.uri)))?;
                self.holds_state = true;
                self.steps_done = restored.step;
                self.metrics.restores_total.add(1.0);
                self.metrics.restore_seconds.set(started.elapsed().as_secs_f64());
                self.log(
                    "info",
                    format!(
                        "restored checkpoint {} (step {}) in {:.2}s",
                        restored.uri,
                        restored.step,
                        started.elapsed().as_secs_f64()
                    ),
                );
            }
        }
        if self.steps_done != a.start_step {
            return Err(AssignmentError(format!(
                "the state is at step {} but the generation starts at step {}",
                self.steps_done, a.start_step
            )));
        }
        Ok(())
    }
}

/// One generation's checkpoint saves: at most one uploading, its report sent when it ends.
struct Saves {
    saver: StateSaver,
    every: u64,
    generation: u64,
    pending: Option<PendingSave>,
}

impl Saves {
    /// Save attempts are named by the generation: every member of it names a save alike, and a
    /// later generation saving the same step writes a directory of its own.
    fn save_id(&self) -> String {
        format!("g{}", self.generation)
    }

    /// Starts a save after `step` steps, unless the previous one is still uploading (then the
    /// due save is skipped and said so: saves are never stacked).
    fn start(&mut self, side: &TrainerSide, trainer: &Trainer, step: u64) -> Result<(), AssignmentError> {
        let start = self.saver.start_or_skip(trainer, step, &self.save_id());
        match start.map_err(|e| AssignmentError(format!("checkpoint of step {step}: {e}")))? {
            SaveStart::Started(pending) => {
                side.metrics.checkpoint_stall_seconds_total.add(pending.copy_seconds());
                side.log(
                    "info",
                    format!(
                        "checkpoint of step {step}: {:.1} MiB copied off the devices in {:.3}s, uploading",
                        pending.bytes() as f64 / (1 << 20) as f64,
                        pending.copy_seconds()
                    ),
                );
                self.pending = Some(*pending);
            }
            SaveStart::Skipped { running_step, bytes_written, bytes_total } => {
                side.metrics.checkpoint_skipped_total.add(1.0);
                side.log(
                    "warn",
                    format!(
                        "checkpoint of step {step} skipped: the save of step {running_step} is still \
                         uploading ({bytes_written} of {bytes_total} bytes)"
                    ),
                );
            }
        }
        Ok(())
    }

    /// Reports a save that has finished uploading; a failed upload is logged, and the next due
    /// save tries again.
    fn poll(&mut self, side: &TrainerSide) {
        let Some(pending) = self.pending.take() else { return };
        match pending.poll() {
            SavePoll::Running(pending) => self.pending = Some(pending),
            SavePoll::Done(Ok(saved)) => self.report(side, saved, false),
            SavePoll::Done(Err(e)) => side.log("warn", format!("a checkpoint upload failed: {e}")),
        }
    }

    /// Waits for the save in flight, then saves the final state and reports it, waiting for the
    /// answer: the job completes once this checkpoint commits.
    fn finish(&mut self, side: &TrainerSide, trainer: &Trainer, step: u64) -> Result<(), AssignmentError> {
        if let Some(pending) = self.pending.take() {
            let running = pending.spec().step;
            match pending.wait() {
                Ok(saved) => self.report(side, saved, running == step),
                Err(e) => side.log("warn", format!("the checkpoint upload of step {running} failed: {e}")),
            }
            if running == step {
                return Ok(());
            }
        }
        self.start(side, trainer, step)?;
        let pending = self.pending.take().expect("no save was in flight");
        let saved = pending.wait().map_err(|e| AssignmentError(format!("final checkpoint: {e}")))?;
        self.report(side, saved, true);
        Ok(())
    }

    /// Sends this host's report; the coordinator commits once every member's is in.
    fn report(&self, side: &TrainerSide, saved: ckpt::HostSave, wait: bool) {
        side.metrics.checkpoint_bytes_total.add(saved.report.object.size as f64);
        side.metrics.checkpoint_upload_seconds.set(saved.upload_seconds);
        let (Ok(host_report_json), Ok(save_spec_json)) =
            (serde_json::to_vec(&saved.report), serde_json::to_vec(&saved.spec))
        else {
            side.log("error", "a checkpoint report could not be encoded".into());
            return;
        };
        let report = CheckpointReport {
            job_id: side.config.job_id.clone(),
            worker_id: side.worker_id.clone(),
            generation: self.generation,
            step: saved.spec.step,
            save_id: saved.spec.save_id.clone(),
            host_report_json,
            save_spec_json,
        };
        let (client, logs, step) = (side.client.clone(), side.logs.clone(), saved.spec.step);
        let line = side.line_template();
        let send = async move {
            let message = match client.report_checkpoint(report).await {
                Ok(ack) if ack.committed => format!("checkpoint of step {step} committed: {}", ack.uri),
                Ok(_) => format!("checkpoint of step {step} uploaded; waiting for the other members"),
                Err(e) => format!("checkpoint of step {step}: the report was refused: {e}"),
            };
            tracing::info!("{message}");
            let _ = logs.try_send(LogLine { message, ..line });
        };
        if wait {
            side.runtime.block_on(send);
        } else {
            side.runtime.spawn(send);
        }
    }
}

/// A failure inside an assignment, as the leader and the logs see it.
#[derive(Debug)]
struct AssignmentError(String);

impl std::fmt::Display for AssignmentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The first 12 hex digits of an identity, for logs.
fn short(id: &str) -> &str {
    &id[..12.min(id.len())]
}

fn resume_name(a: &Assignment) -> &'static str {
    match a.resume.as_ref().and_then(|r| r.source.as_ref()) {
        None | Some(resume::Source::Fresh(_)) => "fresh",
        Some(resume::Source::Keep(_)) => "keep",
        Some(resume::Source::Peer(_)) => "from a peer",
        Some(resume::Source::Checkpoint(_)) => "from a checkpoint",
    }
}

/// The ring of the generation: members in the assignment's order, ranks where it put them.
fn group_spec(a: &Assignment, worker_id: &str) -> Result<GroupSpec, AssignmentError> {
    let members = a
        .peers
        .iter()
        .map(|p| {
            p.data_addr.parse::<SocketAddr>().map_err(|e| {
                AssignmentError(format!("peer {} data address {:?}: {e}", p.worker_id, p.data_addr))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut placement = vec![usize::MAX; a.dp_size as usize];
    for (member, p) in a.peers.iter().enumerate() {
        for &rank in &p.virtual_ranks {
            let slot = placement.get_mut(rank as usize).ok_or_else(|| {
                AssignmentError(format!("rank {rank} is beyond the data-parallel size {}", a.dp_size))
            })?;
            *slot = member;
        }
    }
    if let Some(rank) = placement.iter().position(|&m| m == usize::MAX) {
        return Err(AssignmentError(format!("the assignment places no member on rank {rank}")));
    }
    let me =
        a.peers.iter().position(|p| p.worker_id == worker_id).ok_or_else(|| {
            AssignmentError(format!("the assignment does not list this worker ({worker_id})"))
        })?;
    Ok(GroupSpec { job: a.job_id.clone(), generation: a.generation, members, placement, me })
}
