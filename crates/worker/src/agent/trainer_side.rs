//! The trainer side: the calling thread, which owns the PJRT slice and the train state. It
//! compiles the job's bundle, registers, and runs each generation's assignment through the
//! training driver.

use super::decide::{self, Failure, Next, Unassignable};
use super::report::{AgentSink, CoordinatorCommit, GenerationControl};
use super::session::SessionSide;
use super::{AgentConfig, AgentError, AgentExit, AssignmentError, Control, Leave, Shared, Status};
use crate::ckpt::{Checkpoints, SaveLayout, StateSaver};
use crate::compile_cache::CompileCache;
use crate::driver::{self, Ended, OnInterrupt, Plan, TrainerSteps};
use crate::error::WorkerError;
use crate::metrics::WorkerMetrics;
use crate::peer::StateServer;
use crate::slice::Slice;
use crate::start;
use crate::trainer::Trainer;
use checkpoint::{SaveOptions, Storage, StoreOptions};
use client::{Client, LogLine};
use collective::{AbortHandle, Endpoint};
use fault::Classify;
use job::JobSpec;
use proto::v1::{self, Assignment, StepReport, WorkerEvent, worker_event};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch};

/// Steps the trainer may run ahead of the last acknowledged report. Training needs the leader
/// only to change the generation, not for each step: the ring's all-reduce is between the
/// workers. So while the Raft cluster elects a new leader (0.6-1 s of silence, then the workers'
/// calls and sessions find it: ~2-2.5 s measured) the trainer goes on, and the queued reports
/// commit in a burst once a leader answers. Bounded, well under the coordinator's
/// `MAX_STEPS_AHEAD` (64), which the leader refuses beyond; a new generation started meanwhile
/// carries the steps finished and not committed (`decide::plan_generation`), so nothing is lost.
const REPORTS_IN_FLIGHT: usize = 32;
// An election of ~2.5 s at 0.1-0.4 s steps is 7-25 steps; the leader refuses beyond 64.
const _: () = assert!(REPORTS_IN_FLIGHT >= 8 && REPORTS_IN_FLIGHT < 64);
/// Forming the ring waits this long for every member: members catch up (or restore) first.
const FORM_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a worker tries again to fetch the job's bundle from a store that fails.
const BUNDLE_FETCH_WAIT: Duration = Duration::from_secs(300);

/// The rendezvous key under which a worker announces its state server.
pub(super) fn state_key(worker_id: &str) -> String {
    format!("state-addr/{worker_id}")
}

/// One registration's session: the trainer's end of it and the tasks to end with it.
pub(super) struct Registration {
    pub(super) control: std_mpsc::Receiver<Control>,
    pub(super) tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A compiled bundle and the state on device.
pub(super) struct Loaded {
    pub(super) bundle_id: String,
    pub(super) trainer: Trainer,
}

/// How an assignment ended.
enum AssignmentEnd {
    /// Every step of the job is done.
    Finished,
    /// A quiesce or stop interrupted it, or a step failed and the leader was told.
    Ready,
}

pub(super) struct TrainerSide {
    pub(super) config: AgentConfig,
    pub(super) worker_id: String,
    pub(super) client: Client,
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) shared: Arc<Shared>,
    endpoint: Endpoint,
    pub(super) state_server: StateServer,
    events: mpsc::Sender<WorkerEvent>,
    pub(super) reports: mpsc::Sender<StepReport>,
    pub(super) logs: mpsc::Sender<LogLine>,
    pub(super) loaded: Option<Loaded>,
    /// Whether the device holds the state after `steps_done` steps (not so after a compile, or
    /// after an upload that failed half-way).
    pub(super) holds_state: bool,
    pub(super) steps_done: u64,
    /// Steps done since the last registration: a rejoin that never gets to train is fruitless.
    pub(super) steps_this_registration: u64,
    /// Registrations so far (the first one uses the configured instance id as it is).
    registrations: u32,
    pub(super) generation: u64,
    pub(super) metrics: Arc<WorkerMetrics>,
    shutdown: watch::Receiver<bool>,
}

impl TrainerSide {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        config: AgentConfig,
        client: Client,
        runtime: tokio::runtime::Handle,
        endpoint: Endpoint,
        state_server: StateServer,
        logs: mpsc::Sender<LogLine>,
        metrics: Arc<WorkerMetrics>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            config,
            worker_id: String::new(),
            client,
            runtime,
            shared: Arc::new(Shared::new(Status::default())),
            endpoint,
            state_server,
            events: mpsc::channel(1).0,
            reports: mpsc::channel(1).0,
            logs,
            loaded: None,
            holds_state: false,
            steps_done: 0,
            steps_this_registration: 0,
            registrations: 0,
            generation: 0,
            metrics,
            shutdown,
        }
    }

    pub(super) fn worker_id(&self) -> &str {
        &self.worker_id
    }

    pub(super) fn steps_this_registration(&self) -> u64 {
        self.steps_this_registration
    }

    /// Compiles the job's bundle before registering.
    pub(super) fn prepare(&mut self, bundle_uri: &str, bundle_id: &str) -> Result<(), AssignmentError> {
        self.log("info", format!("compiling the job's bundle {} before registering", short(bundle_id)));
        self.load(bundle_uri, bundle_id)
    }

    /// Registers (again) with the job and starts this registration's session, step reports and
    /// state announcement. The worker id is new each time; the compiled bundle stays.
    pub(super) fn register(&mut self, runtime: &tokio::runtime::Handle) -> Result<Registration, AgentError> {
        self.registrations += 1;
        let config = &self.config;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
        let instance_id = decide::instance_id(
            config.instance_id.as_deref(),
            self.registrations,
            &config.host,
            std::process::id(),
            now,
        );
        let registered = runtime.block_on(async {
            let registered = self
                .client
                .register(v1::RegisterRequest {
                    job_id: config.job_id.clone(),
                    host: config.host.clone(),
                    data_addr: self.endpoint.local_addr().to_string(),
                    devices: 0,
                    platform: String::new(),
                    slice: config.slice,
                    instance_id,
                })
                .await?;
            // Where peers fetch this worker's state, under its new id.
            let state_addr = self.state_server.local_addr().to_string().into_bytes();
            self.client.kv_put(&config.job_id, &state_key(&registered.worker_id), state_addr, None).await?;
            Ok::<_, client::ClientError>(registered)
        })?;
        self.worker_id = registered.worker_id;
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
        let silence = decide::session_silence(Duration::from_millis(registered.lease_ms), heartbeat);
        let session = SessionSide {
            client: self.client.clone(),
            worker_id: self.worker_id.clone(),
            shared: self.shared.clone(),
            shutdown: self.shutdown.clone(),
            preemption_deadline: self.config.preemption_deadline,
        };
        let tasks = vec![
            runtime.spawn(session.clone().run(heartbeat, silence, control_tx, events_rx)),
            runtime.spawn(session.report_steps(reports_rx)),
        ];
        Ok(Registration { control, tasks })
    }

    /// Carries out the session's messages until this registration ends.
    pub(super) fn run(&mut self, control: std_mpsc::Receiver<Control>) -> Leave {
        while let Ok(message) = control.recv() {
            let shared = self.shared.clone();
            match decide::next(message, self.generation, |g| shared.interrupted(g)) {
                Next::Leave(leave) => return leave,
                Next::Idle(generation) => {
                    self.generation = generation;
                    self.publish("ready");
                }
                Next::Run(a) => {
                    self.generation = a.generation;
                    match self.assignment(&a) {
                        Ok(AssignmentEnd::Finished) => self.publish("done"),
                        Ok(AssignmentEnd::Ready) => self.publish("ready"),
                        Err(e) => {
                            self.log("error", format!("generation {}: {e}", a.generation));
                            self.fail(e.to_string(), decide::assignment_failure(&e));
                            self.publish("ready");
                        }
                    }
                }
                Next::Skip => {}
            }
        }
        Leave::Exit(AgentExit::Stopped("the session with the coordinator ended".into()))
    }

    pub(super) fn publish(&self, phase: &'static str) {
        let (generation, steps_done) = (self.generation, self.steps_done);
        self.metrics.step.set(steps_done as f64);
        self.metrics.generation.set(generation as f64);
        self.shared.publish(|s| *s = Status { generation, steps_done, phase });
    }

    pub(super) fn log(&self, level: &str, message: String) {
        log(&self.logs, self.line_template(), level, message);
    }

    /// A log line of this worker, now, at its step and generation.
    pub(super) fn line_template(&self) -> LogLine {
        LogLine {
            job_id: self.config.job_id.clone(),
            worker_id: self.worker_id.clone(),
            slice: self.config.slice.unwrap_or_default(),
            unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64,
            level: "info".into(),
            message: String::new(),
            step: self.steps_done,
            generation: self.generation,
            // Numbered as the forwarder sends it.
            seq: 0,
        }
    }

    /// Tells the leader this worker cannot go on in its generation, and what kind of failure it
    /// is: naming whom it suspects or the checkpoint that failed its integrity check.
    fn fail(&self, reason: String, failure: Failure) {
        let event = WorkerEvent {
            event: Some(worker_event::Event::Failed(v1::Failed {
                worker_id: self.worker_id.clone(),
                generation: self.generation,
                reason,
                suspect_worker_id: failure.suspect_worker_id,
                corrupt_checkpoint: failure.corrupt_checkpoint,
                kind: failure.kind.into(),
            })),
        };
        let _ = self.events.blocking_send(event);
    }

    /// Runs one generation's assignment until the job's last step or an interruption.
    fn assignment(&mut self, a: &Assignment) -> Result<AssignmentEnd, AssignmentError> {
        let spec = JobSpec::from_yaml(&a.spec_yaml, std::path::Path::new("<assigned spec>"))?;
        self.log(
            "info",
            format!(
                "generation {}: ranks {:?} of {}, {} member(s), from step {} ({})",
                a.generation,
                a.virtual_ranks,
                a.dp_size,
                a.peers.len(),
                a.start_step,
                decide::resume_name(a)
            ),
        );
        self.load(&a.bundle_uri, &a.bundle_id)?;
        let interrupted = |side: &Self| side.shared.interrupted(a.generation);
        if interrupted(self) {
            return Ok(AssignmentEnd::Ready);
        }
        if let Err(e) = self.resume(a, &spec) {
            // A catch-up cancelled by a newer generation is no failure of this worker.
            return if interrupted(self) { Ok(AssignmentEnd::Ready) } else { Err(e) };
        }
        let abort = AbortHandle::new();
        *self.shared.abort.lock().unwrap_or_else(|e| e.into_inner()) = Some(abort.clone());
        if interrupted(self) {
            return Ok(AssignmentEnd::Ready);
        }
        let group = if a.dp_size > 1 {
            let spec = decide::group_spec(a, &self.worker_id)?;
            let config =
                collective::Config { connect_timeout: FORM_TIMEOUT, ..collective::Config::default() };
            match self.endpoint.form(&spec, &config, &abort) {
                Ok(group) => Some(group),
                Err(_) if interrupted(self) => return Ok(AssignmentEnd::Ready),
                Err(e) => return Err(AssignmentError::Ring(e)),
            }
        } else {
            None
        };
        self.publish("training");
        let mut loaded = self.loaded.take().expect("loaded above");
        let ended = self.drive(&mut loaded.trainer, a, &spec, group.as_ref());
        self.loaded = Some(loaded);
        ended
    }

    /// Runs the job's steps from `steps_done` until the last one or an interruption, through
    /// the one driver.
    fn drive(
        &mut self,
        trainer: &mut Trainer,
        a: &Assignment,
        spec: &JobSpec,
        group: Option<&collective::Group>,
    ) -> Result<AssignmentEnd, AssignmentError> {
        let objective = start::objective(trainer, spec, &self.runtime)
            .map_err(AssignmentError::doing("preparing the objective"))?;
        let ranks: Vec<usize> = a.virtual_ranks.iter().map(|&r| r as usize).collect();
        let plan = Plan {
            steps: spec.steps,
            optimizer: &spec.optimizer,
            start: self.steps_done,
            evaluate_first: self.steps_done == 0,
            // A quiesce: the state stays on the devices for the next generation.
            on_interrupt: OnInterrupt::Leave,
        };
        let mut steps = TrainerSteps {
            trainer,
            objective: &*objective,
            ranks: &ranks,
            accum: spec.micro_batches_per_step() / u64::from(a.dp_size.max(1)),
            group,
        };
        let mut checkpoints = self.checkpoints(a, spec)?;
        let control = GenerationControl { shared: self.shared.clone(), generation: a.generation };
        let mut sink = AgentSink { side: self };
        let run = driver::train(&mut steps, &plan, checkpoints.as_mut(), &mut sink, &control);
        self.shared.left_training();
        let run = run.map_err(AssignmentError::doing("training"))?;
        match run.ended {
            Ended::Finished => {
                self.log("info", format!("finished the job's {} steps", spec.steps));
                Ok(AssignmentEnd::Finished)
            }
            Ended::Interrupted => Ok(AssignmentEnd::Ready),
            Ended::StepFailed { step, error } => {
                self.log("warn", format!("step {} failed: {error}", step + 1));
                self.metrics.failed_steps_total.add(1.0);
                if let Some(failure) = decide::step_failure(&error, &a.peers) {
                    self.fail(format!("step {}: {error}", step + 1), failure);
                }
                Ok(AssignmentEnd::Ready)
            }
        }
    }

    /// This generation's saves, when the job saves checkpoints: the members of the generation
    /// are the save's hosts, each writing its share of the replica they all hold, and the leader
    /// commits once every member's report is in. Saves are named as the assignment says
    /// (`<line>.s<nonce>g<generation>`): every member names a save alike, and neither a later
    /// generation nor a later submission saving the same step writes into its directory.
    fn checkpoints(&self, a: &Assignment, spec: &JobSpec) -> Result<Option<Checkpoints>, AssignmentError> {
        let Some(every) = spec.checkpoint.as_ref().map(|c| c.every) else { return Ok(None) };
        if a.checkpoint_uri.is_empty() {
            return Ok(None);
        }
        let slice = a
            .peers
            .iter()
            .position(|p| p.worker_id == self.worker_id)
            .ok_or_else(|| Unassignable::NotListed { worker_id: self.worker_id.clone() })?;
        let layout = SaveLayout::for_job(spec, a.peers.len(), slice);
        if a.save_id.is_empty() {
            return Err(Unassignable::NoSaveId.into());
        }
        let opening = AssignmentError::doing("opening the checkpoint root");
        let storage =
            Storage::open(&a.checkpoint_uri, &StoreOptions::default()).map_err(|e| opening(e.into()))?;
        let commit = Box::new(CoordinatorCommit::new(self, a.generation));
        let saver =
            StateSaver::new(storage, SaveOptions::default(), layout, a.save_id.clone(), self.runtime.clone())
                .map_err(AssignmentError::doing("preparing the checkpoints"))?;
        Ok(Some(Checkpoints::new(every, Box::new(saver), commit)))
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
            return Err(Unassignable::BundleId { id: bundle_id.to_string() }.into());
        }
        let cache = std::env::var_os("PODCTL_CACHE")
            .map_or_else(|| std::env::temp_dir().join("podctl"), PathBuf::from);
        let dir = cache.join("bundles").join(bundle_id);
        if dir.join(bundle::MANIFEST_FILE).exists() {
            return Ok(dir);
        }
        let fetch = || async {
            let storage = Storage::open(bundle_uri, &StoreOptions::default())?;
            checkpoint::mirror::download_dir(&storage, "", &dir, bundle::MANIFEST_FILE).await
        };
        let deadline = Instant::now() + BUNDLE_FETCH_WAIT;
        let mut backoff = Duration::from_millis(500);
        loop {
            match self.runtime.block_on(fetch()) {
                Ok(copied) => {
                    self.log(
                        "info",
                        format!("fetched the bundle from {} ({} bytes)", bundle_uri, copied.bytes),
                    );
                    return Ok(dir);
                }
                // Another worker of this host fetched it meanwhile.
                Err(_) if dir.join(bundle::MANIFEST_FILE).exists() => return Ok(dir),
                // The store's retries are over in about a second; an outage lasts longer, and a
                // worker that exits for it only comes back to the same store.
                Err(source)
                    if source.fault().retryable()
                        && Instant::now() + backoff < deadline
                        && !self.shared.stop.load(Ordering::SeqCst) =>
                {
                    self.log(
                        "warn",
                        format!("fetching the bundle from {bundle_uri} failed, trying again in {backoff:?}: {source}"),
                    );
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
                Err(source) => {
                    return Err(AssignmentError::FetchBundle {
                        uri: bundle_uri.to_string(),
                        source: Box::new(source),
                    });
                }
            }
        }
    }

    /// Compiles the job's bundle unless it is the one already loaded.
    fn load(&mut self, bundle_uri: &str, bundle_id: &str) -> Result<(), AssignmentError> {
        if self.loaded.as_ref().is_some_and(|l| l.bundle_id == bundle_id) {
            return Ok(());
        }
        self.publish("loading");
        let path = self.bundle_dir(bundle_uri, bundle_id)?;
        let bundle = bundle::Bundle::load(&path)
            .map_err(|e| AssignmentError::doing("loading the job's bundle")(e.into()))?;
        if bundle.id() != bundle_id {
            return Err(AssignmentError::WrongBundle {
                uri: bundle_uri.to_string(),
                found: bundle.id().to_string(),
                submitted: bundle_id.to_string(),
            });
        }
        self.publish("compiling");
        let started = Instant::now();
        let compiling = AssignmentError::doing;
        let plugin = pjrt::Plugin::load(&self.config.plugin).map_err(|source| {
            compiling("loading the PJRT plugin")(WorkerError::Pjrt {
                context: format!("PJRT plugin {}", self.config.plugin.display()),
                source,
            })
        })?;
        let mut slice = Slice::open(plugin, &bundle.manifest().platform, bundle.mesh())
            .map_err(compiling("opening the slice's devices"))?;
        if let Some(dir) = &self.config.compile_cache {
            slice = slice.with_compile_cache(CompileCache::new(dir));
        }
        let trainer = Trainer::new(slice, &bundle).map_err(compiling("compiling the bundle"))?;
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
}

/// Logs `message` here (structured, so JSON logs can be filtered by job, slice and step) and
/// queues it for the coordinator; a full queue drops the line: logs never hold up training.
pub(super) fn log(logs: &mpsc::Sender<LogLine>, line: LogLine, level: &str, message: String) {
    let (job, worker, slice, step, generation) =
        (&line.job_id, &line.worker_id, line.slice, line.step, line.generation);
    match level {
        "error" => tracing::error!(job, worker, slice, step, generation, "{message}"),
        "warn" => tracing::warn!(job, worker, slice, step, generation, "{message}"),
        _ => tracing::info!(job, worker, slice, step, generation, "{message}"),
    }
    let _ = logs.try_send(LogLine { level: level.into(), message, ..line });
}

/// The first 12 hex digits of an identity, for logs.
fn short(id: &str) -> &str {
    &id[..12.min(id.len())]
}
