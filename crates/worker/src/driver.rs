//! The one training loop, whoever runs it: a launch on one slice (`crate::single`), the local
//! workers of several slices and the cluster's workers (`crate::agent`).
//!
//! A run is a [`Plan`] (the job's steps and learning rates, the steps already done, what an
//! interruption does) over [`Steps`]: on a worker, [`TrainerSteps`], an objective on
//! the trainer's devices over the ranks this worker computes. Each step: hand on a checkpoint
//! upload that has finished, stop at the boundary if told to, run the step, evaluate when due,
//! report, start a save when due. After the last step (or when interrupted, if the plan says to
//! save and leave) the state is saved. What differs between runners is only where reports go (a
//! [`Sink`]), who may interrupt (a [`Control`]) and what becomes of a save (the schedule's
//! `ckpt::Commit`, which commits or reports it). The loop knows nothing of PJRT: its unit tests
//! drive it, and the real save schedule, with fake steps and a fake `ckpt::Saver`.
//!
//! **Invariant:** the state on the devices is always that of a whole number of steps. A step
//! that fails (a peer lost mid-reduction, an abort) is discarded before apply, and the run ends
//! there; the caller decides what follows.

use crate::ckpt::{CheckpointEvent, Checkpoints};
use crate::error::WorkerError;
use crate::objective::{EvalReport, Objective};
use crate::step::{Reduce, StepResult, run_step};
use crate::trainer::Trainer;
use collective::Group;
use job::OptimizerSpec;
use std::collections::BTreeMap;
use std::time::Instant;

/// What a run is asked to do.
pub struct Plan<'a> {
    /// The job's steps: the run does steps `start .. steps`.
    pub steps: u64,
    /// The learning rate of every step.
    pub optimizer: &'a OptimizerSpec,
    /// Steps the state has done.
    pub start: u64,
    /// Evaluate before the first step (the start of a run, not of every generation).
    pub evaluate_first: bool,
    /// What an interruption at a step boundary does.
    pub on_interrupt: OnInterrupt,
}

/// What a run does when its [`Control`] stops it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnInterrupt {
    /// Saves the state of the steps done (waiting for the save), then ends: a preempted run
    /// on its own, which a relaunch resumes from there.
    SaveAndLeave,
    /// Ends at once: the state stays on the devices for whoever goes on with it (a worker
    /// quiesced for its job's next generation).
    Leave,
}

/// The steps a run takes and the state they move: what the driver drives. The real one is
/// [`TrainerSteps`] (an objective on a trainer's devices); tests drive fakes.
pub trait Steps {
    /// What a save copies.
    type State: ?Sized;

    /// The state, for a save.
    fn state(&self) -> &Self::State;

    /// Runs 0-based step `step` at `learning_rate`: the state becomes that of `step + 1` steps,
    /// or, on error, has taken nothing of the step in yet.
    fn run(&mut self, step: u64, learning_rate: f64) -> Result<StepResult, WorkerError>;

    /// Forgets what a failed step left in flight: the state is again that of its last step.
    fn discard(&mut self) -> Result<(), WorkerError>;

    /// Scores the state on held-out problems; `None` when the job has none.
    fn evaluate(&mut self) -> Result<Option<EvalReport>, WorkerError>;

    /// Evaluate after every this many steps too (0: only before the first step and after the last).
    fn eval_every(&self) -> u64;
}

/// Where a run's progress goes.
pub trait Sink {
    /// After every step.
    fn on_step(&mut self, step: &StepResult);

    /// After a held-out evaluation, `step` the steps done (the start step: before training).
    fn on_eval(&mut self, _step: u64, _report: &EvalReport) {}

    /// When a checkpoint is restored, started, skipped, handed on, committed or failed.
    fn on_checkpoint(&mut self, _event: &CheckpointEvent) {}
}

/// Who may stop a run at a step boundary.
pub trait Control {
    /// Whether the run must stop at the boundary where `done` steps are done.
    fn interrupted(&self, done: u64) -> bool;
}

/// A run no one stops between steps.
pub struct Uninterrupted;

impl Control for Uninterrupted {
    fn interrupted(&self, _done: u64) -> bool {
        false
    }
}

/// Why a run ended.
#[derive(Debug)]
pub enum Ended {
    /// Every step of the job is done and the final state saved.
    Finished,
    /// Told to stop at a step boundary.
    Interrupted,
    /// 0-based step `step` failed and was discarded: the state is that of `step` steps.
    StepFailed {
        /// The step that failed.
        step: u64,
        /// Why.
        error: WorkerError,
    },
}

/// A run at a glance.
#[derive(Debug)]
pub struct Trained {
    /// Why it ended.
    pub ended: Ended,
    /// Steps done when it started.
    pub start: u64,
    /// Its first and last steps.
    pub first: Option<StepResult>,
    /// See `first`.
    pub last: Option<StepResult>,
    /// Wall time of its steps (evaluations excluded).
    pub seconds: f64,
    /// Tokens its steps processed on this worker.
    pub tokens: u64,
    /// The evaluation before the first step, and the latest one.
    pub eval_first: Option<EvalReport>,
    /// See `eval_first`.
    pub eval_last: Option<EvalReport>,
}

impl Trained {
    /// Steps this run did.
    pub fn steps(&self) -> u64 {
        self.last.as_ref().map_or(0, |last| last.step - self.start)
    }

    /// Tokens per second over its steps.
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens as f64 / self.seconds.max(1e-9)
    }
}

/// Runs `plan` on `steps`, whose state is that of `plan.start` steps, saving through
/// `checkpoints`. Errors are the run's own (a save that cannot start or the final save failing,
/// an evaluation that fails); a failed step ends the run with [`Ended::StepFailed`].
pub fn train<S: Steps + ?Sized>(
    steps: &mut S,
    plan: &Plan<'_>,
    mut checkpoints: Option<&mut Checkpoints<S::State>>,
    sink: &mut dyn Sink,
    control: &dyn Control,
) -> Result<Trained, WorkerError> {
    let mut run = Trained {
        ended: Ended::Finished,
        start: plan.start,
        first: None,
        last: None,
        seconds: 0.0,
        tokens: 0,
        eval_first: None,
        eval_last: None,
    };
    // Evaluations ride on the report of the step they follow (the first one on the first step's).
    let mut evaluations = BTreeMap::new();
    if plan.evaluate_first
        && plan.start < plan.steps
        && let Some(report) = steps.evaluate()?
    {
        sink.on_eval(plan.start, &report);
        evaluations.insert("eval_accuracy_initial".to_string(), report.accuracy());
        evaluations.insert("eval_reward_initial".to_string(), report.reward);
        run.eval_first = Some(report);
    }
    let started = Instant::now();
    let mut eval_seconds = 0.0;
    for step in plan.start..plan.steps {
        if let Some(checkpoints) = checkpoints.as_deref_mut() {
            checkpoints.poll()?.iter().for_each(|e| sink.on_checkpoint(e));
        }
        if control.interrupted(step) {
            run.ended = Ended::Interrupted;
            break;
        }
        let learning_rate = plan.optimizer.learning_rate(step, plan.steps);
        let mut result = match steps.run(step, learning_rate) {
            Ok(result) => result,
            Err(error) => {
                // The state is still that of `step` steps: apply runs only after the reduction.
                steps.discard()?;
                run.ended = match control.interrupted(step) {
                    true => Ended::Interrupted,
                    false => Ended::StepFailed { step, error },
                };
                break;
            }
        };
        let done = step + 1;
        if eval_due(done, plan.steps, steps.eval_every()) {
            let eval_started = Instant::now();
            if let Some(report) = steps.evaluate()? {
                sink.on_eval(done, &report);
                evaluations.insert("eval_accuracy".to_string(), report.accuracy());
                evaluations.insert("eval_reward".to_string(), report.reward);
                run.eval_last = Some(report);
            }
            eval_seconds += eval_started.elapsed().as_secs_f64();
        }
        result.metrics.append(&mut evaluations);
        sink.on_step(&result);
        run.tokens += result.tokens;
        if run.first.is_none() {
            run.first = Some(result.clone());
        }
        run.last = Some(result);
        if let Some(checkpoints) = checkpoints.as_deref_mut() {
            checkpoints
                .after_step(steps.state(), done, plan.steps)?
                .iter()
                .for_each(|e| sink.on_checkpoint(e));
        }
    }
    run.seconds = started.elapsed().as_secs_f64() - eval_seconds;
    let save_at_end = match run.ended {
        Ended::Finished => true,
        Ended::Interrupted => plan.on_interrupt == OnInterrupt::SaveAndLeave,
        Ended::StepFailed { .. } => false,
    };
    if save_at_end && let Some(checkpoints) = checkpoints {
        // The state is that of the steps done, a whole number of them.
        let done = run.last.as_ref().map_or(plan.start, |last| last.step);
        checkpoints.finish(steps.state(), done)?.iter().for_each(|e| sink.on_checkpoint(e));
    }
    Ok(run)
}

/// The steps of a run on a worker: `objective`'s on `trainer`'s devices, for the logical ranks
/// this worker computes, reduced over `group` (`None` when it holds every rank).
pub struct TrainerSteps<'a> {
    /// The state and the programs.
    pub trainer: &'a mut Trainer,
    /// What a step learns from.
    pub objective: &'a dyn Objective,
    /// The logical data-parallel ranks this worker computes, ascending.
    pub ranks: &'a [usize],
    /// Micro-batches each rank runs per step.
    pub accum: u64,
    /// The ring between workers.
    pub group: Option<&'a Group>,
}

impl Steps for TrainerSteps<'_> {
    type State = Trainer;

    fn state(&self) -> &Trainer {
        self.trainer
    }

    fn run(&mut self, step: u64, learning_rate: f64) -> Result<StepResult, WorkerError> {
        let reduce = self.group.map_or(Reduce::Alone, Reduce::Ring);
        run_step(self.trainer, self.objective, step, self.ranks, self.accum, learning_rate, reduce)
    }

    fn discard(&mut self) -> Result<(), WorkerError> {
        self.trainer.discard_step()
    }

    fn evaluate(&mut self) -> Result<Option<EvalReport>, WorkerError> {
        self.objective.evaluate(self.trainer)
    }

    fn eval_every(&self) -> u64 {
        self.objective.eval_every()
    }
}

/// Whether a held-out evaluation is due after `done` of `total` steps, evaluating every `every`.
fn eval_due(done: u64, total: u64, every: u64) -> bool {
    done == total || (every > 0 && done.is_multiple_of(every))
}

#[cfg(test)]
mod tests {
    //! The loop and the real save schedule driven by fakes: a state that is its step count,
    //! saves whose uploads finish a chosen number of steps after they start. No PJRT here.
    use super::*;
    use crate::ckpt::{Commit, HostSave, PendingSave, Saver};
    use crate::phases::Phases;
    use checkpoint::manifest::ObjectEntry;
    use checkpoint::{DataPosition, HostReport, SaveProgress, SaveSpec, Topology};
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    use std::sync::Arc;
    use tokio::sync::oneshot;

    /// What a run did, as the fakes saw it.
    #[derive(Default)]
    struct Log {
        /// The step count of the state at each step run.
        ran: Vec<u64>,
        learning_rates: Vec<f64>,
        discarded: u32,
        /// The step count of the state at each evaluation.
        evaluated: Vec<u64>,
        /// Saves started: the step asked for and the state's step count when copied.
        saves: Vec<(u64, u64)>,
        /// Saves committed, and whether each was the run's last.
        commits: Vec<(u64, bool)>,
        /// Uploads in flight: the step count they end at, their step, where their outcome goes.
        uploads: Vec<(u64, u64, Outcome)>,
    }

    type Outcome = oneshot::Sender<Result<HostSave, WorkerError>>;

    type Shared = Rc<RefCell<Log>>;

    /// A state that is its step count.
    struct Counter(Rc<Cell<u64>>);

    struct FakeSteps {
        state: Counter,
        /// Steps begun, failed ones too.
        attempts: Rc<Cell<u64>>,
        log: Shared,
        total: u64,
        fail_at: Option<u64>,
        eval_every: u64,
    }

    impl Steps for FakeSteps {
        type State = Counter;

        fn state(&self) -> &Counter {
            &self.state
        }

        fn run(&mut self, step: u64, learning_rate: f64) -> Result<StepResult, WorkerError> {
            let done = self.state.0.get();
            self.attempts.set(self.attempts.get() + 1);
            let mut log = self.log.borrow_mut();
            log.ran.push(done);
            log.learning_rates.push(learning_rate);
            assert_eq!(step, done, "a step runs on the state of the steps before it");
            if self.fail_at == Some(step) {
                return Err(WorkerError::broken("a peer was lost mid-reduction"));
            }
            self.state.0.set(done + 1);
            // Uploads due by now finish; at the run's end every one does.
            let (due, held) = std::mem::take(&mut log.uploads)
                .into_iter()
                .partition::<Vec<_>, _>(|(end, ..)| *end <= done + 1 || done + 1 == self.total);
            log.uploads = held;
            for (_, step, outcome) in due {
                let _ = outcome.send(Ok(host_save(step)));
            }
            Ok(StepResult {
                step: step + 1,
                loss_sum: 2.0,
                token_count: 4.0,
                grad_norm: 1.0,
                learning_rate,
                tokens: 16,
                truncated_rows: 0,
                seconds: 0.0,
                metrics: BTreeMap::new(),
                phases: Phases::new(),
            })
        }

        fn discard(&mut self) -> Result<(), WorkerError> {
            self.log.borrow_mut().discarded += 1;
            Ok(())
        }

        fn evaluate(&mut self) -> Result<Option<EvalReport>, WorkerError> {
            let done = self.state.0.get();
            self.log.borrow_mut().evaluated.push(done);
            Ok(Some(EvalReport { problems: 10, correct: done.min(10), reward: 0.5, samples: Vec::new() }))
        }

        fn eval_every(&self) -> u64 {
            self.eval_every
        }
    }

    /// What the fake saver does with the save of a step.
    #[derive(Clone, Copy, PartialEq)]
    enum Upload {
        /// Uploads in this many steps (at once when 0, and the run's final save always at once).
        Takes(u64),
        /// The copy off the devices fails: the save cannot start.
        CannotStart,
        /// The upload fails.
        Fails,
        /// Uploads on another thread, done after this long whatever the steps do.
        Background(std::time::Duration),
    }

    struct FakeSaver {
        log: Shared,
        total: u64,
        upload: Box<dyn Fn(u64) -> Upload>,
    }

    impl Saver<Counter> for FakeSaver {
        fn start(&mut self, state: &Counter, step: u64) -> Result<PendingSave, WorkerError> {
            let upload = (self.upload)(step);
            if upload == Upload::CannotStart {
                return Err(WorkerError::broken("the device -> host copy failed"));
            }
            let mut log = self.log.borrow_mut();
            log.saves.push((step, state.0.get()));
            let (done, outcome) = oneshot::channel();
            match upload {
                Upload::Fails => {
                    let _ = done.send(Err(WorkerError::broken("the store refused the upload")));
                }
                Upload::Takes(steps) if steps == 0 || step == self.total => {
                    let _ = done.send(Ok(host_save(step)));
                }
                Upload::Takes(steps) => log.uploads.push((step + steps, step, done)),
                Upload::Background(delay) => {
                    std::thread::spawn(move || {
                        std::thread::sleep(delay);
                        let _ = done.send(Ok(host_save(step)));
                    });
                }
                Upload::CannotStart => unreachable!("returned above"),
            }
            Ok(PendingSave::new(step, 0.0, Arc::new(SaveProgress::default()), outcome))
        }
    }

    struct FakeCommit(Shared);

    impl Commit for FakeCommit {
        fn commit(&mut self, saved: HostSave, last: bool) -> Result<CheckpointEvent, WorkerError> {
            let step = saved.spec.step;
            self.0.borrow_mut().commits.push((step, last));
            Ok(CheckpointEvent::Committed {
                step,
                uri: format!("fake://{step}"),
                bytes: 0,
                upload_seconds: 0.0,
                deleted_objects: 0,
            })
        }
    }

    fn host_save(step: u64) -> HostSave {
        let topology = Topology::single_host(mesh::IciMesh::single_device(&["fsdp"])).unwrap();
        let spec = SaveSpec {
            step,
            save_id: "fake".into(),
            topology,
            arrays: Vec::new(),
            bundle: "00".into(),
            data_position: DataPosition { seed: 0, step },
            rng_state: Vec::new(),
            metadata: BTreeMap::new(),
        };
        let object = ObjectEntry { name: "host-0".into(), host: 0, size: 0, chunk_crc32c: Vec::new() };
        let report = HostReport {
            host: 0,
            step,
            save_id: "fake".into(),
            chunk_size: 1 << 20,
            object,
            shards: Vec::new(),
        };
        HostSave { spec, report, copy_seconds: 0.0, upload_seconds: 0.0 }
    }

    #[derive(Default)]
    struct Recorder {
        steps: Vec<StepResult>,
        evals: Vec<u64>,
        checkpoints: Vec<CheckpointEvent>,
    }

    impl Sink for Recorder {
        fn on_step(&mut self, step: &StepResult) {
            self.steps.push(step.clone());
        }

        fn on_eval(&mut self, step: u64, _: &EvalReport) {
            self.evals.push(step);
        }

        fn on_checkpoint(&mut self, event: &CheckpointEvent) {
            self.checkpoints.push(event.clone());
        }
    }

    /// Interrupts the run once `after` steps have begun.
    struct StopAfter(Rc<Cell<u64>>, u64);

    impl Control for StopAfter {
        fn interrupted(&self, _done: u64) -> bool {
            self.0.get() >= self.1
        }
    }

    /// A run of `total` steps from `start`, saving every `every` steps.
    struct Run {
        total: u64,
        start: u64,
        every: u64,
        upload: Box<dyn Fn(u64) -> Upload>,
        fail_at: Option<u64>,
        eval_every: u64,
        evaluate_first: bool,
        stop_after: Option<u64>,
        on_interrupt: OnInterrupt,
        saved_at_start: bool,
    }

    impl Run {
        fn new(total: u64, every: u64) -> Self {
            Self {
                total,
                start: 0,
                every,
                upload: Box::new(|_| Upload::Takes(0)),
                fail_at: None,
                eval_every: 0,
                evaluate_first: false,
                stop_after: None,
                on_interrupt: OnInterrupt::SaveAndLeave,
                saved_at_start: false,
            }
        }

        fn go(self) -> (Result<Trained, WorkerError>, Recorder, Log) {
            let log = Shared::default();
            let attempts = Rc::new(Cell::new(0));
            let mut steps = FakeSteps {
                state: Counter(Rc::new(Cell::new(self.start))),
                attempts: attempts.clone(),
                log: log.clone(),
                total: self.total,
                fail_at: self.fail_at,
                eval_every: self.eval_every,
            };
            let saver = FakeSaver { log: log.clone(), total: self.total, upload: self.upload };
            let mut checkpoints =
                Checkpoints::new(self.every, Box::new(saver), Box::new(FakeCommit(log.clone())))
                    .without_final_backoff();
            if self.saved_at_start {
                checkpoints.mark_saved(self.start);
            }
            let optimizer = OptimizerSpec { lr: 1e-3, warmup_steps: 2, ..OptimizerSpec::default() };
            let plan = Plan {
                steps: self.total,
                optimizer: &optimizer,
                start: self.start,
                evaluate_first: self.evaluate_first,
                on_interrupt: self.on_interrupt,
            };
            let mut sink = Recorder::default();
            let control = StopAfter(attempts, self.stop_after.unwrap_or(u64::MAX));
            let trained = train(&mut steps, &plan, Some(&mut checkpoints), &mut sink, &control);
            drop((steps, checkpoints));
            let log = Rc::try_unwrap(log).ok().expect("the fakes are gone").into_inner();
            (trained, sink, log)
        }
    }

    fn kinds(events: &[CheckpointEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                CheckpointEvent::Started { step, .. } => format!("started {step}"),
                CheckpointEvent::Skipped { step, running_step, .. } => {
                    format!("skipped {step} ({running_step})")
                }
                CheckpointEvent::Committed { step, .. } => format!("committed {step}"),
                CheckpointEvent::Failed { step, .. } => format!("failed {step}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_resumed_run_continues_at_its_step_with_the_schedule_s_learning_rates() {
        let (trained, sink, log) = Run { start: 3, saved_at_start: true, ..Run::new(8, 100) }.go();
        let trained = trained.unwrap();
        assert!(matches!(trained.ended, Ended::Finished));
        assert_eq!(log.ran, [3, 4, 5, 6, 7]);
        let optimizer = OptimizerSpec { lr: 1e-3, warmup_steps: 2, ..OptimizerSpec::default() };
        let expected: Vec<f64> = (3..8).map(|s| optimizer.learning_rate(s, 8)).collect();
        assert_eq!(log.learning_rates, expected, "the learning rate of each step, as if never stopped");
        assert_eq!((trained.start, trained.steps(), trained.tokens), (3, 5, 5 * 16));
        assert_eq!(sink.steps.iter().map(|s| s.step).collect::<Vec<_>>(), [4, 5, 6, 7, 8]);
        assert_eq!(log.commits, [(8, true)], "only the final save");

        // Resumed at the end from a save of that step: nothing to do, nothing saved again.
        let (trained, sink, log) = Run { start: 8, saved_at_start: true, ..Run::new(8, 2) }.go();
        assert!(matches!(trained.unwrap().ended, Ended::Finished));
        assert!(log.ran.is_empty() && log.saves.is_empty() && sink.checkpoints.is_empty());
    }

    #[test]
    fn saves_fall_every_n_steps_and_after_the_last_and_a_save_due_while_one_uploads_is_skipped() {
        let (trained, sink, log) = Run::new(10, 4).go();
        assert!(matches!(trained.unwrap().ended, Ended::Finished));
        assert_eq!(log.saves, [(4, 4), (8, 8), (10, 10)], "each save copies the state of its step");
        assert_eq!(log.commits, [(4, false), (8, false), (10, true)]);
        assert_eq!(
            kinds(&sink.checkpoints),
            ["started 4", "committed 4", "started 8", "committed 8", "started 10", "committed 10"]
        );

        // Uploads that take 3 steps: the save due at 4 finds the one of 2 still uploading.
        let (trained, sink, log) = Run { upload: Box::new(|_| Upload::Takes(3)), ..Run::new(8, 2) }.go();
        assert!(matches!(trained.unwrap().ended, Ended::Finished));
        assert_eq!(
            kinds(&sink.checkpoints),
            [
                "started 2",
                "skipped 4 (2)",
                "committed 2",
                "started 6",
                "committed 6",
                "started 8",
                "committed 8"
            ]
        );
        assert_eq!(log.saves, [(2, 2), (6, 6), (8, 8)], "never two uploads at once");
        assert_eq!(log.commits, [(2, false), (6, false), (8, true)]);
    }

    #[test]
    fn evaluations_fall_before_the_first_step_every_nth_step_and_after_the_last() {
        let (trained, sink, log) = Run { eval_every: 3, evaluate_first: true, ..Run::new(7, 100) }.go();
        let trained = trained.unwrap();
        assert_eq!(log.evaluated, [0, 3, 6, 7]);
        assert_eq!(sink.evals, [0, 3, 6, 7]);
        // Each evaluation rides on the report of the step it follows, the first on the first.
        let with = |key: &str| -> Vec<u64> {
            sink.steps.iter().filter(|s| s.metrics.contains_key(key)).map(|s| s.step).collect()
        };
        assert_eq!(with("eval_accuracy_initial"), [1]);
        assert_eq!(with("eval_accuracy"), [3, 6, 7]);
        assert_eq!(trained.eval_first.map(|e| e.correct), Some(0));
        assert_eq!(trained.eval_last.map(|e| e.correct), Some(7));

        // A resumed generation does not evaluate before its first step; only the last then.
        let (_, _, log) = Run { start: 2, eval_every: 0, ..Run::new(7, 100) }.go();
        assert_eq!(log.evaluated, [7]);
    }

    #[test]
    fn preemption_saves_the_steps_done_and_leaves() {
        let (trained, sink, log) = Run { stop_after: Some(5), ..Run::new(10, 4) }.go();
        let trained = trained.unwrap();
        assert!(matches!(trained.ended, Ended::Interrupted));
        assert_eq!(log.ran, [0, 1, 2, 3, 4]);
        assert_eq!(log.commits, [(4, false), (5, true)], "the state of the steps done is saved");
        assert_eq!(kinds(&sink.checkpoints).last().map(String::as_str), Some("committed 5"));

        // A worker quiesced for the next generation keeps its state on the devices instead.
        let (trained, _, log) =
            Run { stop_after: Some(5), on_interrupt: OnInterrupt::Leave, ..Run::new(10, 4) }.go();
        assert!(matches!(trained.unwrap().ended, Ended::Interrupted));
        assert_eq!(log.commits, [(4, false)]);

        // An in-flight upload is waited for before the final save.
        let slow = |_| Upload::Background(std::time::Duration::from_millis(200));
        let (_, sink, log) = Run { stop_after: Some(5), upload: Box::new(slow), ..Run::new(10, 4) }.go();
        assert_eq!(log.commits, [(4, false), (5, true)]);
        assert_eq!(kinds(&sink.checkpoints), ["started 4", "committed 4", "started 5", "committed 5"]);
    }

    #[test]
    fn a_failed_step_is_discarded_and_ends_the_run_with_no_save() {
        let (trained, sink, log) = Run { fail_at: Some(5), ..Run::new(10, 4) }.go();
        let trained = trained.unwrap();
        match &trained.ended {
            Ended::StepFailed { step, error } => {
                assert_eq!(*step, 5);
                assert!(error.to_string().contains("peer was lost"), "{error}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(log.discarded, 1);
        assert_eq!(trained.last.map(|s| s.step), Some(5), "the state is that of the steps before it");
        assert_eq!(sink.steps.len(), 5, "the failed step is never reported");
        assert_eq!(log.commits, [(4, false)], "no save of a run that failed");

        // A step that fails because the run was being interrupted is an interruption (and the
        // state, that of 5 steps, is saved).
        let (trained, _, log) = Run { fail_at: Some(5), stop_after: Some(6), ..Run::new(10, 100) }.go();
        assert!(matches!(trained.unwrap().ended, Ended::Interrupted));
        assert_eq!((log.ran, log.discarded), (vec![0, 1, 2, 3, 4, 5], 1));
        assert_eq!(log.commits, [(5, true)]);
    }

    #[test]
    fn a_failed_upload_is_reported_and_the_next_due_save_tries_again() {
        let failing = |step| if step == 4 { Upload::Fails } else { Upload::Takes(0) };
        let (trained, sink, log) = Run { upload: Box::new(failing), ..Run::new(10, 4) }.go();
        assert!(matches!(trained.unwrap().ended, Ended::Finished));
        assert_eq!(
            kinds(&sink.checkpoints),
            ["started 4", "failed 4", "started 8", "committed 8", "started 10", "committed 10"]
        );
        assert_eq!(log.commits, [(8, false), (10, true)]);
    }

    #[test]
    fn a_save_that_cannot_start_or_a_failed_final_save_fails_the_run() {
        let cannot = |step| if step == 4 { Upload::CannotStart } else { Upload::Takes(0) };
        let (trained, _, log) = Run { upload: Box::new(cannot), ..Run::new(10, 4) }.go();
        let error = trained.expect_err("a save that cannot start is the run's error");
        assert!(error.to_string().contains("copy failed"), "{error}");
        assert_eq!(log.ran, [0, 1, 2, 3], "the run stops at the save");

        // The final save commits the run's end: its failure is the run's.
        let last = |step| if step == 10 { Upload::Fails } else { Upload::Takes(0) };
        let (trained, _, log) = Run { upload: Box::new(last), ..Run::new(10, 4) }.go();
        let error = trained.expect_err("a failed final save is the run's error");
        assert!(error.to_string().contains("refused the upload"), "{error}");
        assert_eq!(log.commits, [(4, false), (8, false)]);
    }

    #[test]
    fn a_failed_final_upload_is_tried_again_until_it_goes_through() {
        let failures = Rc::new(Cell::new(0u32));
        let counted = failures.clone();
        // The final save's upload fails twice (a store's throttling), then goes through.
        let flaky = move |step| match step {
            10 if counted.get() < 2 => {
                counted.set(counted.get() + 1);
                Upload::Fails
            }
            _ => Upload::Takes(0),
        };
        let (trained, events, log) = Run { upload: Box::new(flaky), ..Run::new(10, 4) }.go();
        trained.expect("the third attempt commits the run's end");
        assert_eq!(failures.get(), 2);
        assert_eq!(log.commits, [(4, false), (8, false), (10, true)]);
        let tried_again =
            events.checkpoints.iter().filter(|e| matches!(e, CheckpointEvent::Failed { step: 10, .. }));
        assert_eq!(tried_again.count(), 2, "each failed attempt is said");
    }

    #[test]
    fn evaluations_fall_on_every_nth_step_and_the_last() {
        let due: Vec<u64> = (1..=10).filter(|&d| eval_due(d, 10, 4)).collect();
        assert_eq!(due, [4, 8, 10]);
        let only_last: Vec<u64> = (1..=10).filter(|&d| eval_due(d, 10, 0)).collect();
        assert_eq!(only_last, [10]);
    }
}
