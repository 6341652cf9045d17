//! The worker agent: one process per host, driven by the coordinator.
//!
//! Two sides meet in [`Shared`]. The trainer side (`trainer_side.rs`, the calling thread) owns
//! the PJRT slice and the train state and runs assignments through the one training driver. The
//! session side (`session.rs`, a small tokio runtime) keeps the session with the leader:
//! heartbeats carrying where the trainer is (generation, steps done, phase) go up, directives
//! come down; it reports steps in order and resends what was not acknowledged, and forwards log
//! lines. A quiesce or stop from the leader, or the shutdown future (SIGTERM for `podctl
//! worker`), raises a flag the trainer checks between steps and aborts the all-reduce in
//! flight, so the trainer stops at a step boundary: the state it holds is always that of a whole
//! number of steps. What to do with each directive, control message, resume source and failure
//! is decided by pure functions (`decide.rs`).
//!
//! The job's bundle compiles before the worker registers: a replacement joins a running job
//! ready to train, so the survivors never wait for its compile. A worker the job went on without
//! (lost, cut off, named by a peer) is told so when it reaches the leader again; it registers
//! anew, keeping its compiled bundle, and catches up from a live peer.

mod decide;
mod report;
mod resume;
mod session;
mod trainer_side;

use crate::metrics::WorkerMetrics;
use crate::peer::{self, StateServer};
use client::{Client, ClientConfig, ClientError};
use collective::{AbortHandle, Endpoint};
use proto::v1::Assignment;
use session::LAST_WORDS_WAIT;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, watch};
use trainer_side::TrainerSide;

pub use decide::Unassignable;

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
    /// From SIGTERM to SIGKILL (a worker pod's `terminationGracePeriodSeconds`): the deadline
    /// the preemption notice reports.
    pub preemption_deadline: std::time::Duration,
}

/// Why the agent returned.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentExit {
    /// The coordinator said stop (the job ended, or this worker was removed from it).
    Stopped(String),
    /// The shutdown future resolved (SIGTERM): the coordinator was told, the survivors carry on.
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
    /// The job's bundle could not be fetched, loaded or compiled before registering.
    #[error("the job's bundle: {0}")]
    Bundle(#[from] AssignmentError),
}

impl fault::Classify for AgentError {
    fn fault(&self) -> fault::Fault {
        match self {
            AgentError::Coordinator(e) => e.fault(),
            AgentError::Io { .. } => fault::Fault::Failed,
            AgentError::Collective(e) => e.fault(),
            AgentError::Bundle(e) => e.fault(),
        }
    }
}

/// A failure inside an assignment, as the leader and the logs see it.
#[derive(Debug, thiserror::Error)]
pub enum AssignmentError {
    /// The assigned job spec does not parse here (a coordinator of another version).
    #[error("the assigned job spec: {0}")]
    Spec(#[from] job::JobError),
    /// The assignment cannot be carried out as given.
    #[error("{0}")]
    Unassignable(#[from] decide::Unassignable),
    /// The job's bundle could not be copied from object storage.
    #[error("fetching the job's bundle from {uri}: {source}")]
    FetchBundle {
        /// Where it is.
        uri: String,
        /// Why (boxed: it is the largest of these).
        source: Box<checkpoint::CheckpointError>,
    },
    /// The bundle found is not the one the job was submitted with.
    #[error("the bundle at {uri} is {found}, but the job was submitted with {submitted}; resubmit the job")]
    WrongBundle {
        /// Where it is.
        uri: String,
        /// Its identity.
        found: String,
        /// The identity the job names.
        submitted: String,
    },
    /// A peer's state server could not be found through the coordinator.
    #[error("finding peer {worker_id}'s state server: {source}")]
    PeerLookup {
        /// The peer.
        worker_id: String,
        /// The coordinator's answer.
        source: ClientError,
    },
    /// Catching up from a live peer failed.
    #[error(transparent)]
    Peer(#[from] peer::PeerError),
    /// The all-reduce ring of the generation could not be formed.
    #[error("forming the all-reduce ring: {0}")]
    Ring(collective::Error),
    /// What the worker was doing failed.
    #[error("{doing}: {source}")]
    Worker {
        /// What it was doing.
        doing: &'static str,
        /// Why it failed (boxed: errors travel by value through every call of an assignment).
        source: Box<crate::error::WorkerError>,
    },
}

impl AssignmentError {
    /// What the worker was doing when `source` failed.
    pub(crate) fn doing(doing: &'static str) -> impl FnOnce(crate::error::WorkerError) -> AssignmentError {
        move |source| AssignmentError::Worker { doing, source: Box::new(source) }
    }
}

impl fault::Classify for AssignmentError {
    fn fault(&self) -> fault::Fault {
        use fault::Fault;
        match self {
            AssignmentError::Spec(_) | AssignmentError::Unassignable(_) => Fault::Failed,
            AssignmentError::FetchBundle { source, .. } => source.fault(),
            AssignmentError::WrongBundle { .. } => Fault::Input,
            AssignmentError::PeerLookup { source, .. } => source.fault(),
            AssignmentError::Peer(e) => e.fault(),
            AssignmentError::Ring(e) => e.fault(),
            AssignmentError::Worker { source, .. } => source.fault(),
        }
    }
}

/// Where the trainer is; every heartbeat carries it.
#[derive(Debug, Clone, Default)]
struct Status {
    generation: u64,
    steps_done: u64,
    phase: &'static str,
}

/// What the session side tells the trainer.
#[derive(Debug, PartialEq)]
enum Control {
    Assign(Box<Assignment>),
    Quiesce(u64),
    Stop(Leave),
}

/// Why one registration's work ended.
#[derive(Debug, Clone, PartialEq)]
enum Leave {
    /// The process is done.
    Exit(AgentExit),
    /// The job goes on without this worker id: register again.
    Rejoin(String),
}

/// A quiesce at a step boundary still ahead, and the trainer's last boundary.
#[derive(Debug, Default)]
struct Deferred {
    /// Steps done at the trainer's last step boundary, while it trains.
    training: Option<u64>,
    /// The generation to move to, once this many steps are done.
    quiesce: Option<(u64, u64)>,
}

/// What the two sides of one registration share.
struct Shared {
    status: watch::Sender<Status>,
    /// The newest generation the leader asked to move to.
    quiesce: AtomicU64,
    /// A quiesce that lets the steps up to a boundary finish, and where the trainer stands.
    deferred: Mutex<Deferred>,
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
            deferred: Mutex::new(Deferred::default()),
            stop: AtomicBool::new(false),
            abort: Mutex::new(None),
            fetch: Mutex::new(None),
        }
    }

    /// Stops the trainer at its next step boundary and aborts what it waits on.
    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.interrupt();
    }

    /// Moves the trainer to `generation` at its next step boundary.
    fn quiesce(&self, generation: u64) {
        self.quiesce.fetch_max(generation, Ordering::SeqCst);
        self.interrupt();
    }

    /// Moves the trainer to `generation` once `after_step` steps are done (0: at once). Every
    /// member stops at that boundary, so the step in flight finishes instead of being thrown
    /// away. When the trainer is not training, or its step in flight goes past the boundary
    /// (the news came late), it stops at once: the others stop there too, or they are past it
    /// as well and stop at once alike.
    fn quiesce_after(&self, generation: u64, after_step: u64) {
        let mut deferred = self.deferred();
        let now = match deferred.training {
            Some(done) => after_step == 0 || done >= after_step,
            None => true,
        };
        if now {
            drop(deferred);
            return self.quiesce(generation);
        }
        if deferred.quiesce.is_none_or(|(g, _)| g < generation) {
            deferred.quiesce = Some((generation, after_step));
        }
    }

    /// The trainer stands at a step boundary of `generation` with `done` steps done: whether it
    /// must stop there. Under the same lock as [`Shared::quiesce_after`], so a deferred quiesce
    /// is either seen here or sees this boundary.
    fn at_boundary(&self, generation: u64, done: u64) -> bool {
        let mut deferred = self.deferred();
        deferred.training = Some(done);
        if let Some((g, after_step)) = deferred.quiesce
            && g > generation
            && done >= after_step
        {
            deferred.quiesce = None;
            self.quiesce.fetch_max(g, Ordering::SeqCst);
        }
        drop(deferred);
        self.interrupted(generation)
    }

    /// The trainer left its steps (interrupted, finished or failed): a deferred quiesce not
    /// reached holds from now on.
    fn left_training(&self) {
        let mut deferred = self.deferred();
        deferred.training = None;
        if let Some((generation, _)) = deferred.quiesce.take() {
            self.quiesce.fetch_max(generation, Ordering::SeqCst);
        }
    }

    fn deferred(&self) -> std::sync::MutexGuard<'_, Deferred> {
        self.deferred.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn interrupt(&self) {
        if let Some(abort) = self.abort.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            abort.abort();
        }
        if let Some(fetch) = self.fetch.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            fetch.cancel();
        }
    }

    /// Whether work of `generation` must stop: the worker is stopping, or a newer generation
    /// was asked for.
    fn interrupted(&self, generation: u64) -> bool {
        self.stop.load(Ordering::SeqCst) || self.quiesce.load(Ordering::SeqCst) > generation
    }

    fn publish(&self, update: impl FnOnce(&mut Status)) {
        self.status.send_modify(update);
    }
}

/// Runs the worker until the coordinator stops it or `shutdown` resolves (for `podctl worker`,
/// SIGTERM: the leader is told at once, so it re-forms the job without waiting for the lease).
/// The session, reports and uploads run on `runtime`, the process's; PJRT stays on this thread.
pub fn run(
    mut config: AgentConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    runtime: &tokio::runtime::Handle,
) -> Result<AgentExit, AgentError> {
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    runtime.spawn(async move {
        shutdown.await;
        let _ = shutdown_tx.send(true);
    });
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
        serve_metrics(runtime, listen, &config, metrics.clone(), worker_label.clone())?;
    }
    let (logs_tx, logs_rx) = mpsc::channel(session::LOG_QUEUE);
    let log_forwarder = runtime.spawn(session::forward_logs(client.clone(), logs_rx));

    let mut trainer = TrainerSide::new(
        config,
        client,
        runtime.clone(),
        endpoint,
        state_server,
        logs_tx,
        metrics,
        shutdown_rx,
    );
    trainer.prepare(&job.bundle_uri, &job.bundle_id)?;
    let mut fruitless = 0;
    let exit = loop {
        let registration = trainer.register(runtime)?;
        *worker_label.lock().unwrap_or_else(|e| e.into_inner()) = trainer.worker_id().to_string();
        let leave = trainer.run(registration.control);
        for task in registration.tasks {
            task.abort();
        }
        match leave {
            Leave::Exit(exit) => break exit,
            Leave::Rejoin(reason) => {
                let give_up;
                (fruitless, give_up) = decide::rejoin(fruitless, trainer.steps_this_registration());
                if give_up {
                    break AgentExit::Stopped(format!(
                        "{reason}; not rejoining: removed {fruitless} times in a row without a step done"
                    ));
                }
                trainer.log("warn", format!("{reason}; registering again"));
            }
        }
    };
    // The last log lines go out before the runtime stops: the forwarder ends once every sender
    // is dropped and its last batch is sent.
    drop(trainer);
    // The timer is made inside the runtime: `timeout` needs its time driver when built.
    let _ = runtime.block_on(async { tokio::time::timeout(LAST_WORDS_WAIT, log_forwarder).await });
    Ok(exit)
}

/// Serves Prometheus metrics at `listen`, writing the bound address where the config asks.
fn serve_metrics(
    runtime: &tokio::runtime::Handle,
    listen: SocketAddr,
    config: &AgentConfig,
    metrics: Arc<WorkerMetrics>,
    worker: Arc<Mutex<String>>,
) -> Result<(), AgentError> {
    // A bind does not wait: bound with std, then served by the runtime.
    let listener = std::net::TcpListener::bind(listen)
        .and_then(|listener| {
            listener.set_nonblocking(true)?;
            let _inside = runtime.enter();
            tokio::net::TcpListener::from_std(listener)
        })
        .map_err(|source| AgentError::Io { context: "binding the metrics listener", source })?;
    let addr =
        listener.local_addr().map_err(|source| AgentError::Io { context: "the metrics listener", source })?;
    if let Some(file) = &config.metrics_addr_file {
        std::fs::write(file, addr.to_string())
            .map_err(|source| AgentError::Io { context: "writing the metrics address file", source })?;
    }
    tracing::info!(%addr, "serving Prometheus metrics at /metrics");
    let registry = crate::metrics::registry(metrics, config.job_id.clone(), worker);
    runtime.spawn(crate::metrics::serve(listener, registry));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiesce_at_a_boundary_ahead_lets_the_steps_up_to_it_finish() {
        let shared = Shared::new(Status::default());
        assert!(!shared.at_boundary(1, 5), "training generation 1 with 5 steps done");
        shared.quiesce_after(2, 7);
        assert!(!shared.interrupted(1), "the 6th step finishes");
        assert!(!shared.at_boundary(1, 6), "and the 7th");
        assert!(shared.at_boundary(1, 7), "stops with 7 done");
        assert!(shared.interrupted(1), "and stays moved to generation 2");
    }

    #[test]
    fn a_quiesce_that_comes_late_or_to_a_trainer_not_training_stops_at_once() {
        // In flight: the 8th step, past the boundary the others stop at.
        let late = Shared::new(Status::default());
        assert!(!late.at_boundary(1, 7));
        late.quiesce_after(2, 7);
        assert!(late.interrupted(1), "aborts the step in flight");
        let idle = Shared::new(Status::default());
        idle.quiesce_after(2, 7);
        assert!(idle.interrupted(1), "nothing to finish");
        let now = Shared::new(Status::default());
        assert!(!now.at_boundary(1, 3));
        now.quiesce_after(2, 0);
        assert!(now.interrupted(1), "0: at once");
        // A run that ends before the boundary (a failed step) leaves the quiesce in force.
        let ended = Shared::new(Status::default());
        assert!(!ended.at_boundary(1, 3));
        ended.quiesce_after(2, 7);
        ended.left_training();
        assert!(ended.interrupted(1));
    }
}
