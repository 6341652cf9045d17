//! A simulated worker: registers, keeps a session (heartbeats, reconnects to a new leader),
//! obeys quiesces and assignments, runs "steps" (a sleep) in lockstep with its generation by
//! reporting each one and waiting for its commit, and saves real checkpoints with the
//! checkpoint crate.

use bytes::Bytes;
use checkpoint::{ArraySpec, DataPosition, SaveOptions, SaveSpec, ShardBuffer, Storage, Topology};
use client::{Client, ClientError};
use mesh::{DType, IciMesh, Sharding};
use proto::v1::{
    self, Assignment, CheckpointReport, Directive, Heartbeat, StepReport, WorkerEvent, directive, resume,
    worker_event,
};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How a simulated worker behaves.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub step_time: Duration,
    pub heartbeat: Duration,
    pub total_steps: u64,
    pub checkpoint_every: u64,
    /// Saves of these steps whose part this worker writes at once but reports only once two
    /// later checkpoints are committed, as reports sent to a leader that died reach the next one
    /// after later saves'; whether the report committed the save goes into the cell.
    pub late_saves: Vec<(u64, LateSave)>,
}

/// Whether a late save's report committed it (`None` until it was answered).
pub type LateSave = Arc<Mutex<Option<Result<bool, String>>>>;

impl SimOptions {
    /// Steps of 30 ms, heartbeats every 200 ms.
    pub fn quick(total_steps: u64, checkpoint_every: u64) -> Self {
        Self {
            step_time: Duration::from_millis(30),
            heartbeat: Duration::from_millis(200),
            total_steps,
            checkpoint_every,
            late_saves: Vec::new(),
        }
    }
}

/// What a simulated worker saw.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    /// (step reported, committed step in the ack), in order.
    pub acks: Vec<(u64, u64)>,
    /// Generations it was assigned, in order.
    pub generations: Vec<u64>,
    /// Resume sources it was given, as text.
    pub resumes: Vec<String>,
    /// Checkpoints it saw committed (step).
    pub checkpoints: Vec<u64>,
    /// Refusals it got (status messages).
    pub refusals: Vec<String>,
    pub stop_reason: String,
}

/// The deterministic "loss" of a step, so tests can check what was committed.
pub fn loss_of(step: u64) -> f64 {
    10.0 / step as f64
}

fn heartbeat(worker_id: &str, generation: u64, steps_done: u64, seq: u64, phase: &str) -> WorkerEvent {
    WorkerEvent {
        event: Some(worker_event::Event::Heartbeat(Heartbeat {
            worker_id: worker_id.into(),
            generation,
            steps_done,
            phase: phase.into(),
            rss_bytes: 0,
            seq,
        })),
    }
}

enum Work {
    /// A step reported and committed (or refused).
    Step(u64, Result<v1::StepAck, ClientError>, Option<Result<v1::CheckpointAck, ClientError>>),
}

type WorkFuture = Pin<Box<dyn Future<Output = Work> + Send>>;

/// The save of one host: `w`, shape [2 * members], split over the dcn axis.
pub fn save_spec(a: &Assignment, step: u64) -> SaveSpec {
    let members = a.peers.len();
    let topology = Topology::new(members, IciMesh::new([("fsdp", 1)]).unwrap(), 1).unwrap();
    SaveSpec {
        step,
        // As a real worker names its saves: one id for the generation's every step.
        save_id: a.save_id.clone(),
        topology,
        arrays: vec![ArraySpec::new(
            "w",
            vec![2 * members as u64],
            DType::Float32,
            Sharding::new(vec![vec!["dcn".into()]]),
        )],
        bundle: a.bundle_id.clone(),
        data_position: DataPosition { seed: 0, step },
        rng_state: vec![],
        metadata: Default::default(),
    }
}

async fn save(
    client: &Client,
    a: &Assignment,
    worker_id: &str,
    step: u64,
) -> Result<v1::CheckpointAck, ClientError> {
    let report = write_part(a, step).await;
    report_part(client, a, worker_id, step, report).await
}

/// Writes this host's part of the save of `step`.
async fn write_part(a: &Assignment, step: u64) -> (SaveSpec, checkpoint::HostReport) {
    let spec = save_spec(a, step);
    let host = a.slice as usize;
    let storage = Storage::open(&a.checkpoint_uri, &Default::default()).unwrap();
    let mesh = spec.topology.mesh().clone();
    let array = &spec.arrays[0];
    let buffers = spec
        .topology
        .devices_of_host(host)
        .map(|d| {
            let region = array.sharding.shard_region(&array.shape, &mesh, d);
            let data: Vec<u8> = (0..region.num_elements() * 4).map(|i| (i + step) as u8).collect();
            ShardBuffer { array: "w".into(), device: d, data: Bytes::from(data) }
        })
        .collect();
    let report =
        checkpoint::save_host(&storage, &spec, host, buffers, &SaveOptions::default()).await.unwrap();
    (spec, report)
}

/// Reports a written part of the save of `step`.
async fn report_part(
    client: &Client,
    a: &Assignment,
    worker_id: &str,
    step: u64,
    (spec, report): (SaveSpec, checkpoint::HostReport),
) -> Result<v1::CheckpointAck, ClientError> {
    client
        .report_checkpoint(CheckpointReport {
            job_id: a.job_id.clone(),
            worker_id: worker_id.into(),
            generation: a.generation,
            step,
            save_id: spec.save_id.clone(),
            host_report: Some(client::checkpoint::host_report_to_wire(&report)),
            save_spec: Some(client::checkpoint::save_spec_to_wire(&spec)),
        })
        .await
}

/// Writes this host's part of the save of `step` now and reports it once the job has committed
/// two later checkpoints: the retention run after the first has ended by then.
async fn save_late(client: Client, a: Assignment, worker_id: String, step: u64, every: u64, cell: LateSave) {
    let part = write_part(&a, step).await;
    loop {
        let later =
            client.checkpoints(&a.job_id).await.is_ok_and(|c| c.iter().any(|c| c.step > step + every));
        if later {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let answer = report_part(&client, &a, &worker_id, step, part).await;
    *cell.lock().unwrap() = Some(answer.map(|ack| ack.committed).map_err(|e| e.to_string()));
}

fn step_work(client: Client, a: Assignment, worker_id: String, step: u64, opts: SimOptions) -> WorkFuture {
    Box::pin(async move {
        tokio::time::sleep(opts.step_time).await;
        let ranks = a.virtual_ranks.len() as f64;
        let report = StepReport {
            job_id: a.job_id.clone(),
            worker_id: worker_id.clone(),
            generation: a.generation,
            step,
            loss_sum: loss_of(step) * 100.0 * ranks,
            token_count: 100.0 * ranks,
            grad_norm: 1.0,
            step_seconds: opts.step_time.as_secs_f64(),
            tokens: 100 * ranks as u64,
            metrics: [("reward".to_string(), 0.5)].into(),
        };
        // Lockstep: the step counts once committed; an ack before the commit (the leader's wait
        // ended) means a peer is slow or gone, so report again until the generation changes.
        loop {
            let ack = client.report_step(report.clone()).await;
            match &ack {
                Ok(a2) if a2.committed_step < step && a2.generation == a.generation => continue,
                Ok(a2)
                    if a2.committed_step >= step
                        && opts.checkpoint_every > 0
                        && step.is_multiple_of(opts.checkpoint_every) =>
                {
                    if let Some((_, cell)) = opts.late_saves.iter().find(|(late, _)| *late == step) {
                        tokio::spawn(save_late(
                            client.clone(),
                            a.clone(),
                            worker_id.clone(),
                            step,
                            opts.checkpoint_every,
                            cell.clone(),
                        ));
                        return Work::Step(step, ack, None);
                    }
                    let ckpt = save(&client, &a, &worker_id, step).await;
                    return Work::Step(step, ack, Some(ckpt));
                }
                _ => return Work::Step(step, ack, None),
            }
        }
    })
}

/// Runs a simulated worker of `job_id` until it is told to stop.
pub async fn run(client: Client, job_id: String, name: String, opts: SimOptions) -> SimReport {
    let register = v1::RegisterRequest {
        job_id: job_id.clone(),
        host: name.clone(),
        data_addr: format!("127.0.0.1:{}", 20000 + name.len()),
        devices: 1,
        platform: "cpu".into(),
        slice: None,
        // Unique in a job, as a pod name is (the controller recognizes its pods' workers so).
        instance_id: name.clone(),
    };
    let worker_id = client.register(register).await.expect("registers").worker_id;
    let mut report = SimReport::default();
    let mut generation = 0u64;
    let mut steps_done = 0u64;
    let mut assignment: Option<Assignment> = None;
    let mut work: Option<WorkFuture> = None;
    let mut seq = 0u64;
    loop {
        let session = client
            .session(heartbeat(&worker_id, generation, steps_done, seq, "ready"), Duration::from_secs(10))
            .await;
        let Ok(mut session) = session else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut beat = tokio::time::interval(opts.heartbeat);
        loop {
            let mut send_now = false;
            tokio::select! {
                directive = session.directives.message() => {
                    let Ok(Some(Directive { directive: Some(d) })) = directive else { break };
                    match d {
                        directive::Directive::Quiesce(q) if q.generation > generation => {
                            generation = q.generation;
                            work = None;
                            send_now = true;
                        }
                        directive::Directive::Assignment(a) if a.generation > generation
                            || (a.generation == generation && work.is_none()) =>
                        {
                            if a.generation > generation || assignment.as_ref().is_none_or(|old| old.generation != a.generation) {
                                report.generations.push(a.generation);
                                let source = a.resume.as_ref().and_then(|r| r.source.as_ref());
                                report.resumes.push(format!("{source:?}"));
                                steps_done = match source {
                                    Some(resume::Source::Keep(_)) => steps_done,
                                    _ => a.start_step,
                                };
                            }
                            generation = a.generation;
                            if steps_done < opts.total_steps {
                                work = Some(step_work(client.clone(), a.clone(), worker_id.clone(), steps_done + 1, opts.clone()));
                            }
                            assignment = Some(a);
                        }
                        directive::Directive::Stop(s) => {
                            report.stop_reason = s.reason;
                            return report;
                        }
                        _ => {}
                    }
                }
                _ = beat.tick() => send_now = true,
                outcome = async { work.as_mut().expect("guarded").await }, if work.is_some() => {
                    work = None;
                    let Work::Step(step, ack, ckpt) = outcome;
                    if let Some(Ok(c)) = &ckpt && c.committed {
                        report.checkpoints.push(step);
                    }
                    match ack {
                        Ok(ack) => {
                            report.acks.push((step, ack.committed_step));
                            if ack.committed_step >= step && ack.generation == generation {
                                steps_done = step;
                                if let Some(a) = &assignment && step < opts.total_steps {
                                    work = Some(step_work(client.clone(), a.clone(), worker_id.clone(), step + 1, opts.clone()));
                                }
                            }
                        }
                        Err(e) => report.refusals.push(e.to_string()),
                    }
                }
            }
            if send_now {
                seq += 1;
                if session
                    .events
                    .send(heartbeat(&worker_id, generation, steps_done, seq, "training"))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        }
    }
}
