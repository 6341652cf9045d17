//! The harness's network: network namespaces it creates and deletes, nothing of the host's.
//!
//! The calling thread (and every thread and process it starts afterwards) moves into a new,
//! unnamed namespace, the hub: a bridge with the coordinators' address. Each worker slice gets
//! a namespace of its own, joined to the bridge by a veth pair; its worker binds its data plane
//! to the slice's address, so coordinators and peers reach it only across that link. Cutting a
//! slice sets the hub's end of its link down: packets in both directions are dropped, with no
//! reset, as in a real partition; healing sets it up again. Requires root (CAP_SYS_ADMIN and
//! CAP_NET_ADMIN) and `ip` from iproute2.

use anyhow::{Context, Result, bail};
use nix::sched::{CloneFlags, unshare};
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where every slice namespace's name starts, followed by the harness's pid, the network's
/// number in the process (two harnesses may run side by side, each on its own thread) and the
/// slice.
const PREFIX: &str = "podctl-chaos-";

/// Networks this process created.
static CREATED: AtomicUsize = AtomicUsize::new(0);

/// The hub namespace and the slices' namespaces.
pub struct Network {
    slices: Vec<String>,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("running `ip` (iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Deletes slice namespaces left by harness processes that are gone.
fn sweep_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name.strip_prefix(PREFIX).and_then(|rest| rest.split('-').next()) else { continue };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

impl Network {
    /// The coordinators' address, on the hub's bridge.
    pub const HUB: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

    /// Moves the calling thread into a new hub namespace and makes `slices` slice namespaces.
    /// Call it before starting any thread or runtime that must be inside.
    pub fn create(slices: usize) -> Result<Network> {
        // unshare(2) with this flag only changes this thread's network namespace.
        if let Err(error) = unshare(CloneFlags::CLONE_NEWNET) {
            bail!(
                "cannot create a network namespace ({error}): the chaos harness needs root \
                 (CAP_SYS_ADMIN, CAP_NET_ADMIN) for the namespaces it cuts slices off in"
            );
        }
        sweep_stale();
        ip(&["link", "set", "lo", "up"])?;
        ip(&["link", "add", "br0", "type", "bridge"])?;
        ip(&["addr", "add", &format!("{}/24", Self::HUB), "dev", "br0"])?;
        ip(&["link", "set", "br0", "up"])?;
        let mut network = Network { slices: Vec::new() };
        let number = CREATED.fetch_add(1, Ordering::SeqCst);
        for k in 0..slices {
            let name = format!("{PREFIX}{}-{number}-{k}", std::process::id());
            ip(&["netns", "add", &name])?;
            network.slices.push(name.clone());
            let port = format!("s{k}");
            ip(&["link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &name])?;
            ip(&["link", "set", &port, "master", "br0"])?;
            ip(&["link", "set", &port, "up"])?;
            ip(&["-n", &name, "addr", "add", &format!("{}/24", Self::slice_ip(k)), "dev", "eth0"])?;
            ip(&["-n", &name, "link", "set", "eth0", "up"])?;
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
        }
        Ok(network)
    }

    /// Slice `k`'s address.
    pub fn slice_ip(k: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, 0, 10 + k as u8)
    }

    /// Slice `k`'s namespace (for `ip netns exec`).
    pub fn namespace(&self, k: usize) -> &str {
        &self.slices[k]
    }

    /// Cuts slice `k` off: nothing goes in or out until [`Network::heal`].
    pub fn cut(&self, k: usize) -> Result<()> {
        ip(&["link", "set", &format!("s{k}"), "down"])
    }

    /// Reconnects slice `k`.
    pub fn heal(&self, k: usize) -> Result<()> {
        ip(&["link", "set", &format!("s{k}"), "up"])
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // The hub goes with this process; the slice namespaces are named, so delete them.
        for name in &self.slices {
            let _ = ip(&["netns", "del", name]);
        }
    }
}
