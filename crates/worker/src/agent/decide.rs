//! The worker's decisions as pure functions of what it knows, tested here; the session and the
//! trainer side only carry them out (as the coordinator's `decide.rs` does for the leader).

use super::{AgentExit, AssignmentError, Control, Leave};
use crate::error::{Part, WorkerError};
use collective::GroupSpec;
use proto::v1::{Assignment, FailureKind, Peer, StepAck, StepReport, directive, resume};
use std::net::{AddrParseError, SocketAddr};
use std::time::Duration;

/// An assignment this worker cannot carry out as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unassignable {
    /// Told to keep a state it does not hold.
    #[error(
        "told to keep the state at step {start_step}, but this worker holds {}",
        held.map_or("no state".to_string(), |s| format!("step {s}"))
    )]
    KeepWithout {
        /// The generation's start.
        start_step: u64,
        /// The steps of the state it holds, if any.
        held: Option<u64>,
    },
    /// The resumed state is not at the generation's start.
    #[error("the state is at step {held} but the generation starts at step {start_step}")]
    WrongStart {
        /// The generation's start.
        start_step: u64,
        /// The steps of the state it holds.
        held: u64,
    },
    /// A member's data address does not parse.
    #[error("peer {worker_id} data address {addr:?}: {source}")]
    PeerAddress {
        /// The member.
        worker_id: String,
        /// Its address as sent.
        addr: String,
        /// Why it does not parse.
        source: AddrParseError,
    },
    /// A member is placed on a rank the job does not have.
    #[error("rank {rank} is beyond the data-parallel size {dp_size}")]
    RankBeyond {
        /// The rank.
        rank: u32,
        /// The job's data-parallel size.
        dp_size: u32,
    },
    /// A rank nobody computes.
    #[error("the assignment places no member on rank {rank}")]
    RankUnplaced {
        /// The rank.
        rank: usize,
    },
    /// This worker is not a member of the generation it was assigned.
    #[error("the assignment does not list this worker ({worker_id})")]
    NotListed {
        /// This worker.
        worker_id: String,
    },
    /// The save ids a newer coordinator sends are missing.
    #[error("the assignment names no save id: the coordinator is older than this worker; upgrade it")]
    NoSaveId,
    /// The bundle id cannot name a directory.
    #[error("the job's bundle id {id:?} is not a name")]
    BundleId {
        /// The id as sent.
        id: String,
    },
}

/// What the leader is told when this worker cannot go on in its generation: what kind of
/// failure, whom it suspects, and the checkpoint that failed its integrity check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Failure {
    pub(super) kind: FailureKind,
    pub(super) suspect_worker_id: String,
    pub(super) corrupt_checkpoint: String,
}

impl Failure {
    fn of(kind: FailureKind) -> Self {
        Failure { kind, suspect_worker_id: String::new(), corrupt_checkpoint: String::new() }
    }
}

/// What kind of failure a worker error is, for the leader: a checkpoint whose bytes are bad
/// (passed over), the job's own inputs, which no member can run (the bundle, the spec, the
/// model, a step with nothing to learn from), or this worker's own.
fn kind_of(error: &WorkerError) -> Failure {
    if let Some(uri) = error.corrupt_checkpoint() {
        return Failure { corrupt_checkpoint: uri.to_string(), ..Failure::of(FailureKind::Checkpoint) };
    }
    match error {
        WorkerError::Incompatible { part: Part::Bundle | Part::Job | Part::Model, .. }
        | WorkerError::NothingToLearn { .. }
        | WorkerError::Bundle(_) => Failure::of(FailureKind::Job),
        _ => Failure::of(FailureKind::Own),
    }
}

/// What the leader is told of an assignment that failed.
pub(super) fn assignment_failure(error: &AssignmentError) -> Failure {
    match error {
        AssignmentError::Worker { source, .. } => kind_of(source),
        AssignmentError::WrongBundle { .. } => Failure::of(FailureKind::Job),
        // A member this survivor was to serve never took the state: that member goes, not this
        // worker, which holds the job's state.
        AssignmentError::Peer(crate::peer::PeerError::NotPulled { missing, .. }) if !missing.is_empty() => {
            Failure { suspect_worker_id: missing[0].clone(), ..Failure::of(FailureKind::Peer) }
        }
        AssignmentError::Spec(_)
        | AssignmentError::Unassignable(_)
        | AssignmentError::FetchBundle { .. }
        | AssignmentError::PeerLookup { .. }
        | AssignmentError::Peer(_)
        | AssignmentError::Ring(_) => Failure::of(FailureKind::Own),
    }
}

/// What the session does with a directive from the leader.
#[derive(Debug, PartialEq)]
pub(super) enum Obey {
    /// Nothing: an old or repeated directive, or an ack.
    Ignore,
    /// Move to `generation` and wait for its assignment; the run in flight stops at a step
    /// boundary: at once, or once `after_step` steps are done (0: at once).
    Quiesce { generation: u64, after_step: u64 },
    /// Work in this generation; `interrupt` when a run of an older one is in flight.
    Assign { assignment: Box<Assignment>, interrupt: bool },
    /// Stop working for the job, or register again.
    Stop(Leave),
}

/// Decides on directive `d`, with the trainer acting in generation `acting` and the newest
/// assignment forwarded so far of generation `assigned` (the leader repeats the one in force on
/// every new session: it is forwarded once).
pub(super) fn obey(d: directive::Directive, acting: u64, assigned: u64) -> Obey {
    match d {
        directive::Directive::Quiesce(q) if q.generation > acting => {
            Obey::Quiesce { generation: q.generation, after_step: q.after_step }
        }
        directive::Directive::Assignment(a) if a.generation > assigned => {
            let interrupt = a.generation > acting;
            Obey::Assign { assignment: Box::new(a), interrupt }
        }
        directive::Directive::Stop(stop) => Obey::Stop(match stop.removed {
            true => Leave::Rejoin(stop.reason),
            false => Leave::Exit(AgentExit::Stopped(stop.reason)),
        }),
        _ => Obey::Ignore,
    }
}

/// When a worker that gave notice of leaving (SIGTERM) stops, as the leader's answer says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Departure {
    /// Now, aborting the step in flight.
    AtOnce,
    /// Once this many steps are done, where the others stop too.
    AfterStep(u64),
}

/// The leader's answer to a preemption notice in `d`, if it is one: a stop (with the boundary the
/// others stop at, when it lets the step in flight finish) or a quiesce.
pub(super) fn departure(d: &directive::Directive) -> Option<Departure> {
    match d {
        directive::Directive::Stop(stop) if stop.after_step > 0 => {
            Some(Departure::AfterStep(stop.after_step))
        }
        directive::Directive::Stop(_) | directive::Directive::Quiesce(_) => Some(Departure::AtOnce),
        directive::Directive::Assignment(_) | directive::Directive::Ack(_) => None,
    }
}

/// How long a session may hear nothing from the leader (heartbeats are acknowledged every
/// `heartbeat`) before the worker takes it for dead and looks for another leader: half the
/// `lease`, and no less than three heartbeats. A new leader grants every worker one lease from
/// when it leads, some way into the silence, so the worker must notice the silence and find the
/// new leader within that one lease, even when the old leader hangs with its connections open.
pub(super) fn session_silence(lease: Duration, heartbeat: Duration) -> Duration {
    (lease / 2).max(heartbeat * 3)
}

/// What the trainer side does with a message from the session.
#[derive(Debug, PartialEq)]
pub(super) enum Next {
    /// Leave this registration.
    Leave(Leave),
    /// Act in generation `generation`, idle until its assignment.
    Idle(u64),
    /// Run this assignment.
    Run(Box<Assignment>),
    /// Nothing: older than what the trainer acts in, or already superseded.
    Skip,
}

/// Decides on `control` with the trainer acting in generation `acting`; `superseded(g)` says
/// whether a newer directive than generation `g` has arrived meanwhile.
pub(super) fn next(control: Control, acting: u64, superseded: impl Fn(u64) -> bool) -> Next {
    match control {
        Control::Stop(leave) => Next::Leave(leave),
        Control::Quiesce(generation) if generation > acting => Next::Idle(generation),
        Control::Assign(a) if a.generation >= acting && !superseded(a.generation) => Next::Run(a),
        Control::Quiesce(_) | Control::Assign(_) => Next::Skip,
    }
}

/// How an assignment's state is brought to its start step.
#[derive(Debug, PartialEq)]
pub(super) enum ResumePlan {
    /// Start afresh (`grpo.init_from` or the job seed).
    Fresh,
    /// Start afresh and offer that state to peers: told to keep a state it never made (the
    /// generation changed before it got to), a member makes the initial one now.
    FreshAndOffer,
    /// Keep the state on the devices and offer it to peers that are new to the job.
    KeepAndOffer,
    /// Fetch the state of `step` steps from live peer `worker_id`.
    Peer { worker_id: String, step: u64 },
    /// Restore the committed checkpoint at `uri`, of `step` steps.
    Checkpoint { uri: String, step: u64 },
}

/// Decides how to resume for an assignment starting at `start_step` from `source`, with this
/// worker holding the state of `steps_done` steps when `holds_state`.
pub(super) fn resume_plan(
    source: Option<&resume::Source>,
    start_step: u64,
    holds_state: bool,
    steps_done: u64,
) -> Result<ResumePlan, Unassignable> {
    Ok(match source {
        None | Some(resume::Source::Fresh(_)) => ResumePlan::Fresh,
        // The state after no step is the initial one.
        Some(resume::Source::Keep(_)) if !holds_state && start_step == 0 && steps_done == 0 => {
            ResumePlan::FreshAndOffer
        }
        Some(resume::Source::Keep(_)) if holds_state && steps_done == start_step => ResumePlan::KeepAndOffer,
        Some(resume::Source::Keep(_)) => {
            return Err(Unassignable::KeepWithout { start_step, held: holds_state.then_some(steps_done) });
        }
        Some(resume::Source::Peer(p)) => ResumePlan::Peer { worker_id: p.worker_id.clone(), step: p.step },
        Some(resume::Source::Checkpoint(c)) => ResumePlan::Checkpoint { uri: c.uri.clone(), step: c.step },
    })
}

/// A word for the resume source, for logs.
pub(super) fn resume_name(a: &Assignment) -> &'static str {
    match a.resume.as_ref().and_then(|r| r.source.as_ref()) {
        None | Some(resume::Source::Fresh(_)) => "fresh",
        Some(resume::Source::Keep(_)) => "keep",
        Some(resume::Source::Peer(_)) => "from a peer",
        Some(resume::Source::Checkpoint(_)) => "from a checkpoint",
    }
}

/// What the leader is told when a step failed with `error` in a generation of `peers`: the
/// member the ring lost or that broke the protocol; the job's inputs or this worker's own
/// failure; `None` when a peer aborted or relayed a failure (whoever saw it first reports it).
pub(super) fn step_failure(error: &WorkerError, peers: &[Peer]) -> Option<Failure> {
    match error {
        WorkerError::Collective(
            collective::Error::PeerLost { member, .. } | collective::Error::Protocol { member, .. },
        ) => peers
            .get(*member)
            .map(|p| Failure { suspect_worker_id: p.worker_id.clone(), ..Failure::of(FailureKind::Peer) }),
        WorkerError::Collective(_) => None,
        own => Some(kind_of(own)),
    }
}

/// Removals in a row, with no step done in between, after which the worker stops rejoining: a
/// worker that cannot take part must not churn the job's generations for ever.
pub(super) const MAX_FRUITLESS_REJOINS: u32 = 3;

/// After a removal: the removals in a row without a step done, counting this one, and whether
/// to give up rather than register again.
pub(super) fn rejoin(fruitless: u32, steps_this_registration: u64) -> (u32, bool) {
    let fruitless = if steps_this_registration == 0 { fruitless + 1 } else { 0 };
    (fruitless, fruitless >= MAX_FRUITLESS_REJOINS)
}

/// The instance id of registration `n` (1-based): a configured id (a pod's name) as it is the
/// first time and suffixed after (registering again under the same id would return the removed
/// worker id), else one made of host, process and time.
pub(super) fn instance_id(
    configured: Option<&str>,
    n: u32,
    host: &str,
    pid: u32,
    unix_nanos: u128,
) -> String {
    match (configured, n) {
        (Some(id), 1) => id.to_string(),
        (Some(id), n) => format!("{id}-r{n}"),
        (None, _) => format!("{host}-{pid}-{unix_nanos}"),
    }
}

/// Whether a step report needs no repeating: its step is committed, or the job moved to another
/// generation (which commits or drops it).
pub(super) fn report_settled(report: &StepReport, ack: &StepAck) -> bool {
    ack.committed_step >= report.step || ack.generation != report.generation
}

/// The ring of the generation: members in the assignment's order, ranks where it put them.
pub(super) fn group_spec(a: &Assignment, worker_id: &str) -> Result<GroupSpec, Unassignable> {
    let members = a
        .peers
        .iter()
        .map(|p| {
            p.data_addr.parse::<SocketAddr>().map_err(|source| Unassignable::PeerAddress {
                worker_id: p.worker_id.clone(),
                addr: p.data_addr.clone(),
                source,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut placement = vec![usize::MAX; a.dp_size as usize];
    for (member, p) in a.peers.iter().enumerate() {
        for &rank in &p.virtual_ranks {
            let slot = placement
                .get_mut(rank as usize)
                .ok_or(Unassignable::RankBeyond { rank, dp_size: a.dp_size })?;
            *slot = member;
        }
    }
    if let Some(rank) = placement.iter().position(|&m| m == usize::MAX) {
        return Err(Unassignable::RankUnplaced { rank });
    }
    let me = a
        .peers
        .iter()
        .position(|p| p.worker_id == worker_id)
        .ok_or_else(|| Unassignable::NotListed { worker_id: worker_id.to_string() })?;
    Ok(GroupSpec { job: a.job_id.clone(), generation: a.generation, members, placement, me })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_leader_is_given_up_with_time_to_find_the_next_within_its_lease() {
        let (lease, heartbeat) = (Duration::from_secs(3), Duration::from_millis(500));
        let silence = session_silence(lease, heartbeat);
        // The new leader leads an election timeout (0.6-1 s) after the old one went quiet and
        // grants a lease from then: noticing and reconnecting must fit in lease + 0.6 s.
        assert!(silence + heartbeat < lease, "{silence:?}: no time left to reconnect");
        assert!(silence >= heartbeat * 3, "{silence:?}: a late ack or two is no silence");
        assert_eq!(
            session_silence(Duration::from_millis(600), Duration::from_millis(500)),
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn a_failed_assignment_tells_the_leader_what_kind_of_failure_it_is() {
        let corrupt = checkpoint::CheckpointError::Corrupt {
            key: "c/000000000010-s/host-0.shards".into(),
            chunk: 1,
            bytes: 8..16,
            expected: 1,
            actual: 2,
        };
        let uri = "file:///c/000000000010-s";
        let worker = |source| AssignmentError::Worker { doing: "resuming", source: Box::new(source) };
        let restore = worker(WorkerError::restore(uri)(corrupt.into()));
        assert_eq!(
            assignment_failure(&restore),
            Failure { corrupt_checkpoint: uri.into(), ..Failure::of(FailureKind::Checkpoint) }
        );
        let other_model = worker(WorkerError::incompatible(Part::Checkpoint, "another model"));
        assert_eq!(
            assignment_failure(&other_model),
            Failure::of(FailureKind::Own),
            "the checkpoint is sound"
        );
        let sft_bundle = worker(WorkerError::incompatible(Part::Bundle, "an SFT bundle for a GRPO job"));
        assert_eq!(assignment_failure(&sft_bundle), Failure::of(FailureKind::Job), "no member can run it");
        let plugin = worker(WorkerError::incompatible(Part::Plugin, "a TPU bundle on the CPU plugin"));
        assert_eq!(assignment_failure(&plugin), Failure::of(FailureKind::Own), "another host may have it");
        let unlisted = AssignmentError::Unassignable(Unassignable::NotListed { worker_id: "w".into() });
        assert_eq!(assignment_failure(&unlisted), Failure::of(FailureKind::Own));
    }
    use proto::v1::{FromPeer, Keep, Quiesce, Resume, StopWork};

    fn assignment(generation: u64) -> Assignment {
        Assignment { job_id: "j".into(), generation, ..Default::default() }
    }

    fn peer(id: &str, port: u16, ranks: &[u32]) -> Peer {
        Peer { worker_id: id.into(), data_addr: format!("127.0.0.1:{port}"), virtual_ranks: ranks.to_vec() }
    }

    #[test]
    fn directives_are_obeyed_once_and_only_when_newer() {
        let quiesce =
            |g| directive::Directive::Quiesce(Quiesce { generation: g, reason: "r".into(), after_step: 7 });
        assert_eq!(obey(quiesce(3), 3, 3), Obey::Ignore, "a quiesce to the generation in force");
        assert_eq!(obey(quiesce(4), 3, 3), Obey::Quiesce { generation: 4, after_step: 7 });
        let assign = |g| directive::Directive::Assignment(assignment(g));
        assert_eq!(obey(assign(3), 2, 3), Obey::Ignore, "the repeat of the assignment forwarded");
        assert_eq!(
            obey(assign(4), 4, 3),
            Obey::Assign { assignment: Box::new(assignment(4)), interrupt: false }
        );
        assert_eq!(
            obey(assign(5), 4, 4),
            Obey::Assign { assignment: Box::new(assignment(5)), interrupt: true }
        );
        let stop =
            |removed| directive::Directive::Stop(StopWork { reason: "why".into(), removed, after_step: 0 });
        assert_eq!(obey(stop(true), 1, 1), Obey::Stop(Leave::Rejoin("why".into())));
        assert_eq!(obey(stop(false), 1, 1), Obey::Stop(Leave::Exit(AgentExit::Stopped("why".into()))));
    }

    #[test]
    fn a_leaving_worker_finishes_its_step_only_when_the_leader_names_the_boundary() {
        let stop = |after_step| {
            directive::Directive::Stop(StopWork { reason: "r".into(), removed: true, after_step })
        };
        assert_eq!(departure(&stop(12)), Some(Departure::AfterStep(12)));
        assert_eq!(departure(&stop(0)), Some(Departure::AtOnce));
        let quiesce =
            directive::Directive::Quiesce(Quiesce { generation: 5, reason: "r".into(), after_step: 9 });
        assert_eq!(departure(&quiesce), Some(Departure::AtOnce), "a quiesce is not an answer to the notice");
        assert_eq!(departure(&directive::Directive::Assignment(assignment(4))), None);
    }

    #[test]
    fn the_trainer_runs_only_assignments_nothing_newer_has_superseded() {
        let never = |_| false;
        assert_eq!(next(Control::Quiesce(5), 4, never), Next::Idle(5));
        assert_eq!(next(Control::Quiesce(4), 4, never), Next::Skip);
        assert_eq!(
            next(Control::Assign(Box::new(assignment(4))), 4, never),
            Next::Run(Box::new(assignment(4)))
        );
        assert_eq!(next(Control::Assign(Box::new(assignment(3))), 4, never), Next::Skip, "older");
        assert_eq!(next(Control::Assign(Box::new(assignment(5))), 4, |g| g < 6), Next::Skip, "superseded");
        let leave = Leave::Exit(AgentExit::Preempted);
        assert_eq!(next(Control::Stop(leave.clone()), 4, never), Next::Leave(leave));
    }

    #[test]
    fn resume_plans_follow_the_source_and_what_the_worker_holds() {
        let keep = resume::Source::Keep(Keep {});
        assert_eq!(resume_plan(None, 0, false, 0), Ok(ResumePlan::Fresh));
        assert_eq!(resume_plan(Some(&keep), 0, false, 0), Ok(ResumePlan::FreshAndOffer));
        assert_eq!(resume_plan(Some(&keep), 7, true, 7), Ok(ResumePlan::KeepAndOffer));
        let wrong = resume_plan(Some(&keep), 7, true, 6).unwrap_err();
        assert_eq!(wrong, Unassignable::KeepWithout { start_step: 7, held: Some(6) });
        assert!(wrong.to_string().ends_with("keep the state at step 7, but this worker holds step 6"));
        let none = resume_plan(Some(&keep), 7, false, 7).unwrap_err();
        assert_eq!(none, Unassignable::KeepWithout { start_step: 7, held: None });
        assert!(none.to_string().ends_with("holds no state"), "{none}");
        let from_peer =
            resume::Source::Peer(FromPeer { worker_id: "w2".into(), step: 9, ..Default::default() });
        assert_eq!(
            resume_plan(Some(&from_peer), 9, true, 3),
            Ok(ResumePlan::Peer { worker_id: "w2".into(), step: 9 })
        );
        let resume = Resume { source: Some(keep) };
        let a = Assignment { resume: Some(resume), ..assignment(1) };
        assert_eq!(resume_name(&a), "keep");
    }

    #[test]
    fn a_survivor_whose_puller_never_came_names_it() {
        let missing = AssignmentError::Peer(crate::peer::PeerError::NotPulled {
            missing: vec!["w2".into()],
            waited: std::time::Duration::from_secs(120),
        });
        let named = Failure { suspect_worker_id: "w2".into(), ..Failure::of(FailureKind::Peer) };
        assert_eq!(assignment_failure(&missing), named);
        let refused = AssignmentError::Peer(crate::peer::PeerError::Refused {
            peer: "127.0.0.1:2".parse().unwrap(),
            reason: "it holds step 6, not 7".into(),
        });
        assert_eq!(assignment_failure(&refused), Failure::of(FailureKind::Own), "the puller's own");
    }

    #[test]
    fn a_failed_step_names_the_member_the_ring_lost_or_nobody() {
        let peers = [peer("w0", 1, &[0]), peer("w1", 2, &[1])];
        let addr = "127.0.0.1:2".parse().unwrap();
        let lost = WorkerError::Collective(collective::Error::PeerLost {
            rank: 1,
            member: 1,
            addr,
            detail: "reset".into(),
        });
        let named = Failure { suspect_worker_id: "w1".into(), ..Failure::of(FailureKind::Peer) };
        assert_eq!(step_failure(&lost, &peers), Some(named));
        let aborted = WorkerError::Collective(collective::Error::PeerAborted {
            rank: 0,
            member: 0,
            detail: "x".into(),
        });
        assert_eq!(step_failure(&aborted, &peers), None, "whoever saw the failure first reports it");
        let own = WorkerError::Pjrt {
            context: "executing grad_step".into(),
            source: pjrt::Error::Pjrt {
                function: "PJRT_LoadedExecutable_Execute",
                code: pjrt::ErrorCode::ResourceExhausted,
                message: "out of memory".into(),
            },
        };
        assert_eq!(step_failure(&own, &peers), Some(Failure::of(FailureKind::Own)));
        let empty = WorkerError::NothingToLearn { step: 3, what: "target tokens", fix: "check the data" };
        assert_eq!(
            step_failure(&empty, &peers),
            Some(Failure::of(FailureKind::Job)),
            "every member fails it"
        );
    }

    #[test]
    fn a_worker_gives_up_after_removals_in_a_row_without_a_step() {
        let (mut fruitless, mut give_up) = (0, false);
        for _ in 0..MAX_FRUITLESS_REJOINS {
            assert!(!give_up);
            (fruitless, give_up) = rejoin(fruitless, 0);
        }
        assert!(give_up);
        assert_eq!(rejoin(2, 5), (0, false), "a step done resets the count");
    }

    #[test]
    fn instance_ids_are_new_for_every_registration() {
        assert_eq!(instance_id(Some("pod-0"), 1, "h", 7, 9), "pod-0");
        assert_eq!(instance_id(Some("pod-0"), 2, "h", 7, 9), "pod-0-r2");
        assert_eq!(instance_id(None, 3, "h", 7, 9), "h-7-9");
    }

    #[test]
    fn step_reports_settle_when_committed_or_when_the_generation_moved() {
        let report = StepReport { step: 5, generation: 2, ..Default::default() };
        assert!(!report_settled(&report, &StepAck { committed_step: 4, generation: 2 }));
        assert!(report_settled(&report, &StepAck { committed_step: 5, generation: 2 }));
        assert!(report_settled(&report, &StepAck { committed_step: 3, generation: 3 }));
    }

    #[test]
    fn the_ring_puts_ranks_where_the_assignment_does() {
        let a = Assignment {
            dp_size: 4,
            peers: vec![peer("w0", 1, &[0, 3]), peer("w1", 2, &[1, 2])],
            ..assignment(6)
        };
        let spec = group_spec(&a, "w1").unwrap();
        assert_eq!((spec.placement, spec.me, spec.generation), (vec![0, 1, 1, 0], 1, 6));
        assert_eq!(group_spec(&a, "w9").unwrap_err(), Unassignable::NotListed { worker_id: "w9".into() });
        let gap = Assignment { dp_size: 3, ..a.clone() };
        assert_eq!(group_spec(&gap, "w0").unwrap_err(), Unassignable::RankBeyond { rank: 3, dp_size: 3 });
        let hole = Assignment { dp_size: 5, ..a };
        assert_eq!(group_spec(&hole, "w0").unwrap_err(), Unassignable::RankUnplaced { rank: 4 });
    }
}
