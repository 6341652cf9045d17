//! The session side: one session with whichever coordinator node leads, heartbeats up,
//! directives down, step reports in order, log lines in batches.

use super::decide::{self, Departure, Obey};
use super::{AgentExit, Control, Leave, Shared, Status};
use client::{Client, LogLine, Session};
use proto::v1::{self, Directive, Heartbeat, StepReport, WorkerEvent, directive, worker_event};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Log lines queued for the coordinator before new ones are dropped.
pub(super) const LOG_QUEUE: usize = 1024;
/// How long a preempted worker holds its session for the leader to take the notice.
const PREEMPTION_NOTICE_WAIT: Duration = Duration::from_secs(3);
/// How long a leaving worker waits for its last log lines to go out.
pub(super) const LAST_WORDS_WAIT: Duration = Duration::from_secs(2);
/// How long to wait before reconnecting a session that could not start.
const RECONNECT_WAIT: Duration = Duration::from_millis(500);
/// How long to wait before repeating a step report no leader took.
const REPORT_RETRY_WAIT: Duration = Duration::from_millis(200);

fn heartbeat(worker_id: &str, status: &Status, seq: u64) -> WorkerEvent {
    WorkerEvent {
        event: Some(worker_event::Event::Heartbeat(Heartbeat {
            worker_id: worker_id.into(),
            generation: status.generation,
            steps_done: status.steps_done,
            phase: status.phase.into(),
            rss_bytes: crate::metrics::rss_bytes(),
            seq,
        })),
    }
}

/// The notice a worker sends on shutdown (SIGTERM): it leaves, and is killed `deadline` after;
/// `finishes_step` when it trains on until the leader names the boundary to stop at.
fn preemption_notice(
    worker_id: &str,
    status: &Status,
    deadline: Duration,
    finishes_step: bool,
) -> WorkerEvent {
    WorkerEvent {
        event: Some(worker_event::Event::Preempted(v1::Preempted {
            worker_id: worker_id.into(),
            generation: status.generation,
            reason: "SIGTERM".into(),
            deadline_ms: deadline.as_millis() as u64,
            finishes_step,
        })),
    }
}

#[derive(Clone)]
pub(super) struct SessionSide {
    pub(super) client: Client,
    pub(super) worker_id: String,
    pub(super) shared: Arc<Shared>,
    /// Turns true when the agent must leave (the shutdown future resolved).
    pub(super) shutdown: watch::Receiver<bool>,
    /// What the preemption notice says is left before the process is killed.
    pub(super) preemption_deadline: Duration,
}

impl SessionSide {
    /// Keeps a session with whichever node leads, reconnecting when it ends.
    /// A session on which the leader says nothing (not even a heartbeat's ack) for `silence`
    /// is taken for dead and replaced, asking another node first: after a partition heals, the
    /// worker is back at once instead of when its transport's keepalive gives up, and a leader
    /// that hangs with its connections open (stopped, or stuck in the kernel while it is killed)
    /// holds no attempt longer than `silence`.
    pub(super) async fn run(
        self,
        heartbeat_every: Duration,
        silence: Duration,
        control: std_mpsc::Sender<Control>,
        mut events: mpsc::Receiver<WorkerEvent>,
    ) {
        let mut status = self.shared.status.subscribe();
        let mut shutdown = self.shutdown.clone();
        let mut seq = 0u64;
        let mut assigned = 0u64;
        // An event the last session could not take is sent on the next one.
        let mut unsent: Option<WorkerEvent> = None;
        loop {
            seq += 1;
            let first = heartbeat(&self.worker_id, &status.borrow(), seq);
            let connected = tokio::select! {
                connected = self.client.session(first, silence) => connected,
                // Leaving while no leader can be reached: there is nobody to tell.
                true = shut_down(&mut shutdown) => {
                    tracing::warn!(
                        deadline = ?self.preemption_deadline,
                        "SIGTERM: leaving the job with no session to the coordinator to tell"
                    );
                    self.leave(&control, Leave::Exit(AgentExit::Preempted));
                    return;
                }
            };
            let mut session = match connected {
                Ok(session) => session,
                Err(e) => {
                    tracing::warn!("session with the coordinator: {e}; retrying");
                    tokio::time::sleep(RECONNECT_WAIT).await;
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
                        if let Some(leave) = self.obey(d, &control, &mut assigned) {
                            self.leave(&control, leave);
                            return;
                        }
                    }
                    _ = beat.tick() => {
                        if heard.elapsed() > silence {
                            tracing::warn!("no word from the coordinator for {:?}", heard.elapsed());
                            self.client.suspect_leader();
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
                    true = shut_down(&mut shutdown) => {
                        self.preempted(&mut session).await;
                        self.leave(&control, Leave::Exit(AgentExit::Preempted));
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

    /// Carries out the decision on a directive; `Some` when this registration must end.
    fn obey(
        &self,
        d: directive::Directive,
        control: &std_mpsc::Sender<Control>,
        assigned: &mut u64,
    ) -> Option<Leave> {
        let acting = self.shared.status.borrow().generation;
        match decide::obey(d, acting, *assigned) {
            Obey::Ignore => {}
            Obey::Quiesce { generation, after_step } => {
                tracing::info!(generation, after_step, "quiesce");
                self.shared.quiesce_after(generation, after_step);
                let _ = control.send(Control::Quiesce(generation));
            }
            Obey::Assign { assignment, interrupt } => {
                *assigned = assignment.generation;
                if interrupt {
                    self.shared.quiesce(assignment.generation);
                }
                let _ = control.send(Control::Assign(assignment));
            }
            Obey::Stop(leave) => {
                tracing::info!("stop: {leave:?}");
                return Some(leave);
            }
        }
        None
    }

    /// Stops the trainer and tells it why.
    fn leave(&self, control: &std_mpsc::Sender<Control>, leave: Leave) {
        self.shared.stop();
        let _ = control.send(Control::Stop(leave));
    }

    /// Tells the leader at once that this worker leaves, so it re-forms the job without waiting
    /// for the lease. A worker inside its steps trains on meanwhile: when the leader has the
    /// others stop after the step in flight (the deadline leaves time for it), this worker
    /// finishes that step too, so nobody's work on it is lost; otherwise it stops at once.
    async fn preempted(&self, session: &mut Session) {
        // A second before the kill, it stops whatever it is doing.
        let leave_by =
            tokio::time::Instant::now() + self.preemption_deadline.saturating_sub(Duration::from_secs(1));
        let status = self.shared.status.borrow().clone();
        let finishes = status.phase == "training";
        if !finishes {
            self.shared.stop();
        }
        tracing::warn!(
            step = status.steps_done,
            deadline = ?self.preemption_deadline,
            finishes_step = finishes,
            "SIGTERM: leaving the job"
        );
        let notice = preemption_notice(&self.worker_id, &status, self.preemption_deadline, finishes);
        let mut departure = Departure::AtOnce;
        if session.events.send(notice).await.is_ok() {
            // Dropping the session resets its stream, possibly before the notice is on the
            // wire: hold it until the leader answers with a stop or ends the session.
            let answered = tokio::time::timeout(PREEMPTION_NOTICE_WAIT, async {
                while let Ok(Some(d)) = session.directives.message().await {
                    if let Some(departure) = d.directive.as_ref().and_then(decide::departure) {
                        return departure;
                    }
                }
                Departure::AtOnce
            });
            match answered.await {
                Ok(answer) => departure = answer,
                Err(_) => tracing::warn!(
                    "the leader did not answer the preemption notice within {PREEMPTION_NOTICE_WAIT:?}"
                ),
            }
        }
        if let (Departure::AfterStep(after_step), true) = (departure, finishes) {
            tracing::info!(after_step, "finishing the step in flight before leaving");
            self.shared.quiesce_after(status.generation + 1, after_step);
            let mut trainer = self.shared.status.subscribe();
            let stopped = trainer.wait_for(|s| s.phase != "training");
            if tokio::time::timeout_at(leave_by, stopped).await.is_err() {
                tracing::warn!(after_step, "the step in flight did not finish before the deadline");
            }
        }
        self.shared.stop();
    }

    /// Reports steps in order; a report is repeated until the step is committed or the job has
    /// moved to another generation (which commits or drops it).
    pub(super) async fn report_steps(self, mut reports: mpsc::Receiver<StepReport>) {
        let mut suspicions = self.client.suspicions();
        let mut status = self.shared.status.subscribe();
        while let Some(report) = reports.recv().await {
            loop {
                if self.shared.stop.load(Ordering::SeqCst)
                    || self.shared.status.borrow().generation > report.generation
                {
                    break;
                }
                suspicions.mark_unchanged();
                // A report waits for its step's commit. Held by a node that hangs (the session
                // has left it), it is asked again where the session went; once the trainer is in
                // a newer generation, which carries the steps not committed, it is dropped. Either
                // way the queue behind it moves on instead of waiting out the call's timeout.
                let answer = tokio::select! {
                    answer = self.client.report_step(report.clone()) => answer,
                    _ = suspicions.changed() => continue,
                    _ = status.wait_for(|s| s.generation > report.generation) => break,
                };
                match answer {
                    Ok(ack) if decide::report_settled(&report, &ack) => break,
                    Ok(_) => continue,
                    Err(e) if e.code() == tonic::Code::Unavailable => {
                        tracing::warn!(step = report.step, "step report: {e}; repeating it");
                        tokio::time::sleep(REPORT_RETRY_WAIT).await;
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

/// Resolves to true once the agent must leave (false if the sender is gone: the runtime ends).
async fn shut_down(shutdown: &mut watch::Receiver<bool>) -> bool {
    shutdown.wait_for(|&down| down).await.is_ok()
}

/// How long a batch of log lines is offered again while the leader cannot take it (an election,
/// a restart) before it is dropped; lines queue meanwhile, up to [`LOG_QUEUE`].
const LOG_RETRY_FOR: Duration = Duration::from_secs(60);

/// Sends log lines in batches, at most every half second, until every sender is dropped. Lines
/// are numbered in order (`seq`, from 1), and a batch the leader did not take is offered again:
/// the leader keeps a line it already has only once, so none is lost or doubled across a
/// leader change.
pub(super) async fn forward_logs(client: Client, mut lines: mpsc::Receiver<LogLine>) {
    let mut batch = Vec::new();
    let mut seq = 0;
    let mut number = |mut line: LogLine| {
        seq += 1;
        line.seq = seq;
        line
    };
    while let Some(line) = lines.recv().await {
        batch.push(number(line));
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        while batch.len() < 256 {
            match tokio::time::timeout_at(deadline, lines.recv()).await {
                Ok(Some(line)) => batch.push(number(line)),
                _ => break,
            }
        }
        let given_up = tokio::time::Instant::now() + LOG_RETRY_FOR;
        while let Err(e) = client.push_logs(batch.clone()).await {
            if tokio::time::Instant::now() >= given_up {
                tracing::warn!("dropping {} log lines the coordinator did not take: {e}", batch.len());
                break;
            }
            tracing::debug!("log lines to the coordinator: {e}; offering them again");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        batch.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preemption_notice_reports_the_configured_deadline() {
        let status = Status { generation: 4, steps_done: 9, phase: "training" };
        let notice = preemption_notice("job.w2", &status, Duration::from_secs(15), true);
        let Some(worker_event::Event::Preempted(p)) = notice.event else { panic!("{notice:?}") };
        assert_eq!((p.worker_id.as_str(), p.generation, p.deadline_ms), ("job.w2", 4, 15_000));
        assert!(p.finishes_step);
    }
}
