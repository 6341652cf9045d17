//! Local mode with several slices: an embedded single-node coordinator and one worker process
//! per slice on this machine, supervised like a cluster's hosts.
//!
//! The coordinator drives the job exactly as on a cluster (assignments, generations, step and
//! checkpoint commits) and writes the run record; this module only starts the pieces, shows
//! progress and replaces worker processes that die, which is what the Kubernetes controller does
//! for pods.

use crate::connect::ConnectArgs;
use crate::embedded::{NodeSettings, StartNode};
use crate::outage::{self, Outage};
use crate::progress::human_rate;
use anyhow::{Context, Result, bail};
use bundle::Bundle;
use client::{Client, ClientConfig, JobState, JobStatus, Submission};
use indicatif::{ProgressBar, ProgressStyle};
use job::JobSpec;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How often the launcher looks at the job and its workers.
const POLL: Duration = Duration::from_millis(500);
/// Replacements of dead worker processes before the launcher gives up on the job.
const MAX_RESPAWNS_PER_SLICE: u32 = 5;
/// How long workers get to leave once the job has ended.
const WORKER_EXIT_WAIT: Duration = Duration::from_secs(20);

/// Where the job runs.
pub enum Cluster<'a> {
    /// Here: an embedded coordinator (started by `node`) and worker processes on `plugin`,
    /// keeping compiled programs in `compile_cache` (a replaced worker loads them instead of
    /// compiling).
    Local { plugin: PathBuf, compile_cache: PathBuf, node: &'a dyn StartNode },
    /// A coordinator cluster reached as these arguments say (admin token); its workers are
    /// started by its controller or by hand (`podctl worker`). With `detach`, the launch returns
    /// once the job is accepted; otherwise it follows the job until it ends or Ctrl-C, which
    /// detaches (the job runs on).
    Remote {
        /// How to reach the cluster.
        connect: ConnectArgs,
        /// Return once the job is accepted.
        detach: bool,
    },
}

/// Runs `job` where `cluster` says; `start_over` begins a new line of checkpoints beside what
/// the job's root holds instead of resuming (the coordinator applies the resume rule).
pub fn run(
    job: &JobSpec,
    bundle: &Bundle,
    cluster: Cluster,
    start_over: bool,
    runtime: &tokio::runtime::Handle,
) -> Result<()> {
    runtime.block_on(async {
        match cluster {
            Cluster::Local { plugin, compile_cache, node } => {
                launch(job, bundle, &plugin, &compile_cache, node, start_over).await
            }
            Cluster::Remote { connect, detach } => {
                submit_remote(job, bundle, &connect, start_over, detach).await
            }
        }
    })
}

/// Submits the job to a cluster and, unless `detach`, follows it until it ends or Ctrl-C
/// detaches; the job token goes to `<run>/job-token` (mode 0600) for the workers.
async fn submit_remote(
    job: &JobSpec,
    bundle: &Bundle,
    connect: &ConnectArgs,
    start_over: bool,
    detach: bool,
) -> Result<()> {
    let run_dir = std::path::absolute(job.output_dir())?;
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let connection = connect.connect().await?;
    let client = connection.client()?;
    // The run directory as this machine names it: the coordinator derives a default
    // checkpoint root from it.
    let mut job = job.clone();
    job.output = Some(run_dir.clone());
    let mut submission = submission(&job, bundle, start_over)?;
    submission.bundle_uri = publish_bundle(&job, bundle, connect.kube_context.is_some()).await?;
    let submitted = client.submit(&submission).await?;
    let token_path = run_dir.join("job-token");
    write_private(&token_path, &submitted.job_token)?;
    println!("job {} submitted; its workers' token is in {}", submitted.job_id, token_path.display());
    if connect.kube_context.is_none() {
        println!("start one worker on each of its {} hosts (slice 0 to {}):", job.mesh.dcn, job.mesh.dcn - 1);
        println!("  {}", worker_command(&submitted.job_id, connect, &token_path));
    }
    if detach {
        print!("{}", follow_hints(&submitted.job_id, connect));
        return Ok(());
    }
    println!("following it here; Ctrl-C detaches (the job runs on)");
    match follow(&client, &submitted.job_id, None, job.steps, None).await? {
        Followed::Ended(status) => ended(&status, &run_dir),
        Followed::CtrlC { .. } => {
            println!("\ndetached from job {}: it runs on", submitted.job_id);
            print!("{}", follow_hints(&submitted.job_id, connect));
            Ok(())
        }
    }
}

/// The flags that reach the cluster `connect` names, as another command takes them.
fn connect_flags(connect: &ConnectArgs) -> String {
    let path = |p: &Path| p.display().to_string();
    let mut flags = Vec::new();
    if let Some(context) = &connect.context {
        flags.push(format!("--context {context}"));
    } else if let Some(kube) = &connect.kube_context {
        flags.push(format!("--kube-context {kube}"));
        if let Some(namespace) = &connect.kube_namespace {
            flags.push(format!("--kube-namespace {namespace}"));
        }
    } else {
        flags.push(format!("--coordinator {}", connect.coordinator.join(",")));
        match (&connect.tls_dir, &connect.ca) {
            _ if connect.insecure_plaintext => flags.push("--insecure-plaintext".into()),
            (Some(dir), _) => flags.push(format!("--tls-dir {}", path(dir))),
            (None, Some(ca)) => flags.push(format!("--ca {}", path(ca))),
            (None, None) => {}
        }
    }
    match (&connect.token_file, &connect.token) {
        (Some(file), _) if connect.context.is_none() => flags.push(format!("--token-file {}", path(file))),
        _ => {}
    }
    flags.join(" ")
}

/// How to follow and stop a job that runs on without this launch.
fn follow_hints(job_id: &str, connect: &ConnectArgs) -> String {
    let flags = connect_flags(connect);
    let token = match (&connect.token, &connect.token_file, &connect.context) {
        (Some(_), None, None) => " (with PODCTL_TOKEN set)",
        _ => "",
    };
    format!(
        "follow it:  podctl status {job_id} --watch {flags}\n\
         its logs:   podctl logs {job_id} -f {flags}\n\
         stop it:    podctl stop {job_id} {flags}{token}\n"
    )
}

/// The `podctl worker` command a host of a cluster runs for `job_id`, with the addresses and
/// TLS flags of this launch filled in; what only the host knows is left as `<...>`.
fn worker_command(job_id: &str, connect: &ConnectArgs, token_file: &Path) -> String {
    let mut words = vec![
        "podctl worker".to_string(),
        format!("--job {job_id}"),
        format!("--coordinator {}", connect.coordinator.join(",")),
    ];
    let path = |p: &Path| p.display().to_string();
    match (&connect.tls_dir, &connect.ca) {
        _ if connect.insecure_plaintext => words.push("--insecure-plaintext".into()),
        (Some(dir), _) => words.push(format!("--tls-dir {}", path(dir))),
        (None, ca) => {
            words.push(format!("--ca {}", ca.as_deref().map_or("<ca.pem>".into(), path)));
            // A worker needs a client certificate when the coordinators ask for mutual TLS.
            let cert = connect.cert.as_deref().map_or("<client.pem>".into(), path);
            let key = connect.key.as_deref().map_or("<client.key>".into(), path);
            words.push(format!("--cert {cert} --key {key}"));
        }
    }
    words.push(format!("--token-file {}", path(token_file)));
    words.push("--slice <0..> --plugin <PJRT plugin .so>".into());
    words.join(" ")
}

/// A job event as the launch prints it: `step S: kind detail`, without the kind when the detail
/// already begins with it (`generation 1 from step 0 ...`) and without a trailing space.
fn event_line(step: u64, kind: &str, detail: &str) -> String {
    let starts_with_kind = detail.strip_prefix(kind).is_some_and(|rest| rest.starts_with(' '));
    match detail {
        "" => format!("step {step}: {kind}"),
        _ if starts_with_kind => format!("step {step}: {detail}"),
        _ => format!("step {step}: {kind} {detail}"),
    }
}

fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    std::io::Write::write_all(&mut file, text.as_bytes())?;
    Ok(())
}

/// Where a cluster's workers find the bundle. With a checkpoint root in object storage, the
/// bundle is uploaded under it once (`<root>/bundles/<bundle id>`, named by content); otherwise
/// the workers must share this machine's filesystem, which pods in Kubernetes do not.
pub async fn publish_bundle(job: &JobSpec, bundle: &Bundle, kubernetes: bool) -> Result<String> {
    let root = job.checkpoint_uri().filter(|uri| uri.contains("://") && !uri.starts_with("file://"));
    let Some(root) = root else {
        if kubernetes {
            bail!(
                "job spec field `checkpoint`: a Kubernetes cluster's workers read the bundle from the \
                 checkpoint root and write checkpoints there; add `checkpoint: {{ every: N, uri: \
                 gs://BUCKET/PREFIX }}` (docs/gke.md)"
            );
        }
        return Ok(format!("file://{}", std::path::absolute(bundle.dir())?.display()));
    };
    let storage = checkpoint::Storage::open(&root, &checkpoint::StoreOptions::default())?;
    let prefix = format!("bundles/{}", bundle.id());
    let copied = checkpoint::mirror::upload_dir(&storage, &prefix, bundle.dir(), bundle::MANIFEST_FILE)
        .await
        .with_context(|| format!("uploading the bundle to {root}/{prefix}"))?;
    let uri = format!("{}/{prefix}", root.trim_end_matches('/'));
    if copied.files > 0 {
        eprintln!("bundle uploaded to {uri} ({} files, {} bytes)", copied.files, copied.bytes);
    }
    Ok(uri)
}

/// The job with its bundle on this machine; the coordinator decides its checkpoint root.
fn submission(job: &JobSpec, bundle: &Bundle, start_over: bool) -> Result<Submission> {
    Ok(Submission {
        spec_yaml: job.to_yaml(),
        bundle_uri: format!("file://{}", std::path::absolute(bundle.dir())?.display()),
        bundle_id: bundle.id().to_string(),
        start_over,
    })
}

fn ended(status: &JobStatus, run_dir: &Path) -> Result<()> {
    match status.state {
        // Relaunched after its end: no step ran, so there is no loss to show.
        Some(JobState::Completed) if status.loss.is_nan() => {
            println!("done: {}; metrics, events and plots in {}", status.message, run_dir.display());
            Ok(())
        }
        Some(JobState::Completed) => {
            println!(
                "done: {} steps, final loss {:.4}; metrics, events and plots in {}",
                status.step,
                status.loss,
                run_dir.display()
            );
            crate::summary::print_held_out(run_dir);
            Ok(())
        }
        state => Err(crate::exit::Classified::failed(anyhow::anyhow!(
            "the job ended {}: {}",
            crate::status::state_name(state),
            status.message
        ))),
    }
}

/// A free port on loopback, for a listener whose address must be known before it binds.
fn free_loopback_port() -> Result<std::net::SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// A random hex token, for the coordinator's admin (it never leaves this process).
fn random_token() -> Result<String> {
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    Ok(hex::encode(bytes))
}

struct Slot {
    slice: u32,
    child: Child,
    respawns: u32,
}

struct Workers {
    exe: PathBuf,
    coordinator: String,
    job_id: String,
    token: String,
    plugin: PathBuf,
    compile_cache: PathBuf,
    logs: PathBuf,
    slots: Vec<Slot>,
}

impl Workers {
    fn spawn(&self, slice: u32, attempt: u32) -> Result<Child> {
        let log_path = self.logs.join(format!("slice-{slice}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        use std::io::Write;
        writeln!(&log, "--- worker process {attempt} of slice {slice}")?;
        let child = Command::new(&self.exe)
            .args(["--log", "info", "worker", "--insecure-plaintext", "--coordinator", &self.coordinator])
            .args(["--job", &self.job_id, "--slice", &slice.to_string(), "--host", &format!("local-{slice}")])
            .arg("--plugin")
            .arg(&self.plugin)
            .arg("--compile-cache")
            .arg(&self.compile_cache)
            .args(["--metrics-listen", "127.0.0.1:0", "--metrics-addr-file"])
            .arg(self.logs.join(format!("slice-{slice}.metrics-addr")))
            .env("PODCTL_TOKEN", &self.token)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting the worker of slice {slice}"))?;
        // Operators (and the chaos tests) find a slice's process here.
        let pid_path = self.logs.join(format!("slice-{slice}.pid"));
        std::fs::write(&pid_path, child.id().to_string())
            .with_context(|| format!("writing {}", pid_path.display()))?;
        Ok(child)
    }

    /// Replaces worker processes that exited while the job still needs them; the coordinator
    /// sees the replacement register and hands it the lost slice's ranks (catch-up from a peer,
    /// or from the last checkpoint when none survived).
    fn supervise(&mut self, bar: &ProgressBar) -> Result<()> {
        for i in 0..self.slots.len() {
            let Some(status) = self.slots[i].child.try_wait()? else { continue };
            let slot = &self.slots[i];
            if slot.respawns >= MAX_RESPAWNS_PER_SLICE {
                bail!(
                    "the worker of slice {} died {} times (last: {status}); see {}",
                    slot.slice,
                    slot.respawns + 1,
                    self.logs.join(format!("slice-{}.log", slot.slice)).display()
                );
            }
            bar.suspend(|| {
                eprintln!("worker of slice {} exited ({status}); starting a replacement", slot.slice)
            });
            let (slice, attempt) = (slot.slice, slot.respawns + 2);
            let child = self.spawn(slice, attempt)?;
            let slot = &mut self.slots[i];
            slot.child = child;
            slot.respawns += 1;
        }
        Ok(())
    }

    /// Waits for the workers to leave (the coordinator told them to stop), then kills stragglers.
    fn reap(&mut self) {
        let deadline = Instant::now() + WORKER_EXIT_WAIT;
        for slot in &mut self.slots {
            while Instant::now() < deadline && matches!(slot.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            if matches!(slot.child.try_wait(), Ok(None)) {
                let _ = slot.child.kill();
                let _ = slot.child.wait();
            }
        }
    }
}

async fn launch(
    job: &JobSpec,
    bundle: &Bundle,
    plugin: &Path,
    compile_cache: &Path,
    node: &dyn StartNode,
    start_over: bool,
) -> Result<()> {
    let run_dir = std::path::absolute(job.output_dir())?;
    let logs = run_dir.join("workers");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let mut job = job.clone();
    job.output = Some(run_dir.clone());

    let admin = random_token()?;
    let settings = NodeSettings {
        data_dir: run_dir.join("coordinator"),
        admin_token: admin.clone(),
        metrics_listen: Some(free_loopback_port()?),
    };
    let node = node.start(settings).await.context("starting the embedded coordinator")?;
    let address = node.addr().to_string();
    // What `podctl status`/`logs` and a Prometheus scrape from another terminal need.
    std::fs::write(run_dir.join("coordinator.addr"), &address)?;
    if let Some(metrics) = node.metrics_addr() {
        std::fs::write(run_dir.join("coordinator.metrics-addr"), metrics.to_string())?;
    }
    let client = Client::new(ClientConfig::new(vec![address.clone()], admin, None))?;
    // A launch killed before its job ended left that job in the coordinator's log: stop it, so
    // that it neither waits for workers nor writes to the run record beside this launch's job.
    for earlier in client.list_jobs().await? {
        if !earlier.is_terminal() {
            client.stop_job(&earlier.job_id).await?;
            eprintln!(
                "stopped job {}, left running by an earlier launch of this run directory",
                earlier.job_id
            );
        }
    }
    let submitted = match client.submit(&submission(&job, bundle, start_over)?).await {
        Ok(submitted) => submitted,
        Err(e) => {
            node.stop().await.context("stopping the embedded coordinator")?;
            return Err(e.into());
        }
    };
    write_private(&run_dir.join("job-token"), &submitted.job_token)?;
    println!("coordinator {address}, job {}, run directory {}", submitted.job_id, run_dir.display());
    println!(
        "watch it from another terminal: podctl status {} --watch --coordinator {address} --insecure-plaintext \
         --token-file {}",
        submitted.job_id,
        run_dir.join("job-token").display()
    );

    let mut workers = Workers {
        exe: std::env::current_exe()?,
        coordinator: address,
        job_id: submitted.job_id.clone(),
        token: submitted.job_token,
        plugin: plugin.to_path_buf(),
        compile_cache: compile_cache.to_path_buf(),
        logs,
        slots: Vec::new(),
    };
    for slice in 0..job.mesh.dcn as u32 {
        let child = workers.spawn(slice, 1)?;
        workers.slots.push(Slot { slice, child, respawns: 0 });
    }

    let stop = StopOnCtrlC { every: job.checkpoint.as_ref().map(|c| c.every) };
    let outcome = follow(&client, &submitted.job_id, Some(&mut workers), job.steps, Some(stop)).await;
    if outcome.is_err() {
        let _ = client.stop_job(&submitted.job_id).await;
    }
    tokio::task::block_in_place(|| workers.reap());
    node.stop().await.context("stopping the embedded coordinator")?;
    match outcome? {
        Followed::Ended(status) => ended(&status, &run_dir)
            .with_context(|| format!("worker logs in {}", run_dir.join("workers").display())),
        Followed::CtrlC { status, saved } => {
            let resume = match (saved, job.checkpoint_uri()) {
                (Some(step), Some(root)) => {
                    format!("the checkpoint of step {step} is committed under {root}: launching it again resumes there")
                }
                (None, Some(_)) => "no checkpoint was committed yet: launching it again starts over".into(),
                (_, None) => {
                    "the job saves no checkpoints (`checkpoint: { every: N }`): launching it again starts over".into()
                }
            };
            Err(crate::exit::Classified::interrupted(anyhow::anyhow!(
                "interrupted (Ctrl-C) at step {}; {resume}",
                status.step
            )))
        }
    }
}

/// How following a job ended.
enum Followed {
    /// The job ended.
    Ended(JobStatus),
    /// Ctrl-C: a cluster's job was left running; a local one was stopped once the checkpoint of
    /// `saved` (if any) was committed.
    CtrlC {
        /// The job when it was left or stopped.
        status: JobStatus,
        /// The step of the checkpoint it was stopped after.
        saved: Option<u64>,
    },
}

/// What Ctrl-C does to a local job of several slices: it stops once a checkpoint after the
/// step it is at is committed (the next save its `checkpoint.every` schedules), so nothing is
/// lost; at once when it saves no checkpoints.
pub struct StopOnCtrlC {
    /// The job's `checkpoint.every`, if it saves checkpoints.
    pub every: Option<u64>,
}

/// The step whose checkpoint a stop waits for: the next multiple of `every` after `step`,
/// or the job's last step.
fn next_save(step: u64, every: u64, total: u64) -> u64 {
    ((step / every + 1) * every).min(total)
}

/// Shows the job's progress until it ends, or Ctrl-C: `stop` says what Ctrl-C does to a local
/// job (without it, Ctrl-C leaves a cluster's job running).
async fn follow(
    client: &Client,
    job_id: &str,
    mut workers: Option<&mut Workers>,
    total: u64,
    stop: Option<StopOnCtrlC>,
) -> Result<Followed> {
    let bar = ProgressBar::new(total);
    if std::io::stderr().is_terminal() {
        bar.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg} [{elapsed_precise}]")
                .expect("a valid template"),
        );
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut ctrl_c = std::pin::pin!(tokio::signal::ctrl_c());
    let mut pressed = 0;
    // Ctrl-C on a local job: stop once the checkpoint of this step is committed.
    let mut stop_after: Option<u64> = None;
    let mut events_after = 0f64;
    // The step the job starts at (a resumed job's is its checkpoint's), then the last printed.
    let mut last_printed: Option<u64> = None;
    let mut outage = Outage::new(outage::PATIENCE);
    loop {
        let mut interrupted = false;
        tokio::select! {
            _ = &mut ctrl_c => {
                interrupted = true;
                pressed += 1;
                ctrl_c.set(tokio::signal::ctrl_c());
            }
            _ = tokio::time::sleep(POLL) => {}
        }
        let status = match client.get_job(job_id).await {
            Ok(status) => {
                if let Some(lasted) = outage.answered(Instant::now()) {
                    bar.suspend(|| {
                        eprintln!("the coordinators answer again after {:.1}s", lasted.as_secs_f64())
                    });
                }
                status
            }
            Err(e) => match outage.failed(&e, Instant::now()) {
                outage::Next::Retry { first } if !interrupted => {
                    if first {
                        bar.suspend(|| eprintln!("{}", outage::began(&e)));
                    }
                    if let Some(workers) = workers.as_deref_mut() {
                        tokio::task::block_in_place(|| workers.supervise(&bar))?;
                    }
                    continue;
                }
                _ if !crate::exit::unreachable(&e) => return Err(e.into()),
                _ => {
                    let lasted = outage.lasted(Instant::now());
                    return Err(anyhow::Error::new(e).context(format!(
                        "following job {job_id}: no coordinator answered for {:.0}s (`podctl status {job_id}` \
                         shows the job once they do)",
                        lasted.as_secs_f64()
                    )));
                }
            },
        };
        if interrupted {
            let Some(stop) = &stop else {
                bar.finish_and_clear();
                return Ok(Followed::CtrlC { status, saved: None });
            };
            match (pressed, stop.every) {
                (1, Some(every)) => {
                    let step = next_save(status.step, every, total);
                    bar.suspend(|| {
                        eprintln!(
                            "\nCtrl-C: stopping once the checkpoint of step {step} is committed (at step {} now; \
                             Ctrl-C again stops at once, and a relaunch resumes from the last checkpoint)",
                            status.step
                        )
                    });
                    stop_after = Some(step);
                }
                _ => {
                    bar.suspend(|| eprintln!("\nCtrl-C: stopping the job now"));
                    client.stop_job(job_id).await?;
                    let saved = status.last_checkpoint.as_ref().map(|c| c.step);
                    return Ok(Followed::CtrlC { status: client.get_job(job_id).await?, saved });
                }
            }
        }
        // Events arrive most recent last (the last 50): print the ones not seen yet.
        let seen = events_after;
        for event in status.events.iter().filter(|e| e.unix_seconds > seen) {
            bar.suspend(|| eprintln!("{}", event_line(event.step, &event.kind, &event.detail)));
            events_after = event.unix_seconds;
        }
        bar.set_position(status.step);
        bar.set_message(format!(
            "loss {:.4} · {} · generation {} · {:?}",
            status.loss,
            human_rate(status.tokens_per_second),
            status.generation,
            status.state
        ));
        let last = *last_printed.get_or_insert(status.step);
        if bar.is_hidden() && status.step >= last + (total / 20).max(1) {
            eprintln!(
                "step {}/{} loss {:.4} {}",
                status.step,
                total,
                status.loss,
                human_rate(status.tokens_per_second)
            );
            last_printed = Some(status.step);
        }
        if status.is_terminal() {
            bar.finish_and_clear();
            return Ok(Followed::Ended(status));
        }
        let saved = status.last_checkpoint.as_ref().map(|c| c.step);
        if let Some(step) = stop_after
            && saved.is_some_and(|s| s >= step)
        {
            bar.finish_and_clear();
            client.stop_job(job_id).await?;
            return Ok(Followed::CtrlC { status: client.get_job(job_id).await?, saved });
        }
        if let Some(workers) = workers.as_deref_mut() {
            tokio::task::block_in_place(|| workers.supervise(&bar))?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_print_without_a_repeated_kind_or_a_trailing_space() {
        assert_eq!(event_line(0, "submitted", ""), "step 0: submitted");
        assert_eq!(
            event_line(0, "generation", "generation 1 from step 0 (2 workers)"),
            "step 0: generation 1 from step 0 (2 workers)"
        );
        assert_eq!(
            event_line(50, "resume", "resuming from step 50"),
            "step 50: resume resuming from step 50"
        );
        assert_eq!(event_line(3, "generations", "generation"), "step 3: generations generation");
    }

    #[test]
    fn a_stop_waits_for_the_next_scheduled_save_or_the_last_step() {
        assert_eq!(next_save(7, 5, 100), 10);
        assert_eq!(next_save(10, 5, 100), 15);
        assert_eq!(next_save(98, 5, 100), 100);
    }

    #[test]
    fn a_detached_launch_says_how_to_follow_and_stop_the_job_with_its_own_flags() {
        let mut connect = ConnectArgs {
            context: None,
            coordinator: vec!["10.0.0.1:7001".into()],
            kube_context: None,
            kube_namespace: None,
            token: None,
            token_file: Some("/home/me/token".into()),
            ca: Some("/tls/ca.pem".into()),
            cert: None,
            key: None,
            tls_dir: None,
            insecure_plaintext: false,
        };
        let hints = follow_hints("j-1", &connect);
        let flags = "--coordinator 10.0.0.1:7001 --ca /tls/ca.pem --token-file /home/me/token";
        assert_eq!(
            hints,
            format!(
                "follow it:  podctl status j-1 --watch {flags}\nits logs:   podctl logs j-1 -f {flags}\n\
                 stop it:    podctl stop j-1 {flags}\n"
            )
        );
        connect.context = Some("prod".into());
        assert!(follow_hints("j-1", &connect).contains("podctl stop j-1 --context prod\n"));
        connect.context = None;
        connect.token_file = None;
        connect.token = Some("t".into());
        assert!(follow_hints("j-1", &connect).ends_with("--ca /tls/ca.pem (with PODCTL_TOKEN set)\n"));
    }

    #[test]
    fn the_worker_command_carries_the_launch_s_addresses_and_tls() {
        let mut connect = ConnectArgs {
            context: None,
            coordinator: vec!["10.0.0.1:7001".into(), "10.0.0.2:7001".into()],
            kube_context: None,
            kube_namespace: None,
            token: None,
            token_file: None,
            ca: Some("/tls/ca.pem".into()),
            cert: None,
            key: None,
            tls_dir: None,
            insecure_plaintext: false,
        };
        let token = Path::new("/runs/j/job-token");
        let command = worker_command("j-1", &connect, token);
        assert_eq!(
            command,
            "podctl worker --job j-1 --coordinator 10.0.0.1:7001,10.0.0.2:7001 --ca /tls/ca.pem \
             --cert <client.pem> --key <client.key> --token-file /runs/j/job-token --slice <0..> \
             --plugin <PJRT plugin .so>"
        );
        connect.tls_dir = Some("/tls".into());
        assert!(worker_command("j-1", &connect, token).contains(" --tls-dir /tls --token-file"));
        connect.insecure_plaintext = true;
        assert!(worker_command("j-1", &connect, token).contains(" --insecure-plaintext --token-file"));
    }
}
