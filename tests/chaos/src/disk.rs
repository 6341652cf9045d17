//! The checkpoint folder's disk: a small ext4 filesystem on a loop device the harness makes and
//! mounts in a mount namespace of its own, so that a full disk is a real `ENOSPC` and a slow
//! disk a real throttled block device, and nothing of the host's is touched.
//!
//! Full: a ballast file takes every free block until the fault ends; the next checkpoint write
//! fails with `ENOSPC`. Slow: the block I/O controller (cgroup v1 `blkio.throttle`, or v2
//! `io.max`) caps writes to the loop device; fsyncs wait for them. Requires root and
//! `mkfs.ext4`, `mount`, `fallocate` (util-linux, e2fsprogs).

use anyhow::{Context, Result, bail};
use nix::sched::{CloneFlags, unshare};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the block I/O controller's write caps are, by cgroup version, and the line that caps
/// device `dev` (`major:minor`) at `bytes` a second (`None`: lifts the cap).
const BLKIO_V1: &str = "/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device";
const IO_V2: &str = "/sys/fs/cgroup/io.max";

fn cap_line(v1: bool, dev: &str, bytes: Option<u64>) -> String {
    match (v1, bytes) {
        (true, Some(b)) => format!("{dev} {b}"),
        (true, None) => format!("{dev} 0"),
        (false, Some(b)) => format!("{dev} wbps={b}"),
        (false, None) => format!("{dev} wbps=max"),
    }
}

fn run(command: &mut Command) -> Result<String> {
    let out = command.output().with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!("{command:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The mounted filesystem.
pub struct Disk {
    /// Where it is mounted.
    pub mount: PathBuf,
    image: PathBuf,
    /// The loop device's `major:minor`.
    device: String,
    ballast: PathBuf,
    throttled: bool,
}

impl Disk {
    /// Moves the calling thread (and what it starts afterwards) into a new mount namespace and
    /// mounts a fresh `size_mib` filesystem at `dir/disk` (its image: `dir/disk.img`).
    pub fn create(dir: &Path, size_mib: u64) -> Result<Disk> {
        // Mounts made from here on are this thread's and its children's only, and go with them.
        unshare(CloneFlags::CLONE_NEWNS).context(
            "cannot create a mount namespace: the chaos harness needs root (CAP_SYS_ADMIN) for the disk \
             it fills and slows",
        )?;
        run(Command::new("mount").args(["--make-rprivate", "/"]))?;
        let image = dir.join("disk.img");
        let mount = dir.join("disk");
        std::fs::create_dir_all(&mount)?;
        std::fs::File::create(&image)?.set_len(size_mib << 20)?;
        // No blocks reserved for root: the workers run as root and must meet the full disk too.
        run(Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0"]).arg(&image))?;
        run(Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&mount))?;
        let source = run(Command::new("findmnt").args(["-n", "-o", "SOURCE"]).arg(&mount))?;
        let rdev = std::fs::metadata(source.trim())
            .with_context(|| format!("the loop device {} of {}", source.trim(), mount.display()))?
            .rdev();
        // glibc's major()/minor().
        let major = ((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff);
        let minor = ((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff);
        let disk = Disk {
            ballast: mount.join("ballast"),
            mount,
            image,
            device: format!("{major}:{minor}"),
            throttled: false,
        };
        // A cap a crashed harness left on a loop device of the same number.
        disk.write_cap(None)?;
        Ok(disk)
    }

    /// Takes every free block: the next write fails with `ENOSPC`.
    pub fn fill(&self) -> Result<()> {
        let df = run(Command::new("df").args(["-B1", "--output=avail"]).arg(&self.mount))?;
        let free: u64 = df.lines().last().and_then(|l| l.trim().parse().ok()).context("df's free bytes")?;
        // fallocate takes the bulk at once; writes take the rest, down to the last block (ext4
        // reserves blocks at write time, so a write past the end fails at once).
        let bulk = free.saturating_sub(4 << 20);
        if bulk > 0 {
            run(Command::new("fallocate").arg("-l").arg(bulk.to_string()).arg(&self.ballast))?;
        }
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&self.ballast)?;
        for block in [64 << 10, 4 << 10] {
            let zeros = vec![0u8; block];
            loop {
                use std::io::Write;
                match file.write_all(&zeros) {
                    Ok(()) => continue,
                    Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                    Err(e) => return Err(e).context("filling the checkpoint disk"),
                }
            }
        }
        match file.sync_data() {
            Err(e) if e.raw_os_error() != Some(nix::libc::ENOSPC) => {
                Err(e).context("filling the checkpoint disk")
            }
            _ => Ok(()),
        }
    }

    /// Gives the blocks back.
    pub fn free(&self) -> Result<()> {
        match std::fs::remove_file(&self.ballast) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// Caps writes to the device at `bytes_per_second`.
    pub fn slow(&mut self, bytes_per_second: u64) -> Result<()> {
        self.throttled = true;
        self.write_cap(Some(bytes_per_second))
    }

    /// Lifts the cap.
    pub fn unslow(&mut self) -> Result<()> {
        self.throttled = false;
        self.write_cap(None)
    }

    fn write_cap(&self, bytes: Option<u64>) -> Result<()> {
        let v1 = Path::new(BLKIO_V1).exists();
        let file = if v1 { BLKIO_V1 } else { IO_V2 };
        std::fs::write(file, cap_line(v1, &self.device, bytes)).with_context(|| {
            format!(
                "writing {file}: the slow disk needs the block I/O controller (cgroup blkio or io) and root"
            )
        })
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        if self.throttled {
            let _ = self.write_cap(None);
        }
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = std::fs::remove_file(&self.image);
    }
}
