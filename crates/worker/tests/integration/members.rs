//! Member processes of a test ring: their addresses, and how long they wait for each other.

use std::net::SocketAddr;
use std::time::Duration;

/// `n` distinct free loopback addresses (all held while noted); each member binds its own again
/// before it compiles.
pub fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let held: Vec<_> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    held.iter().map(|l| l.local_addr().unwrap()).collect()
}

/// How members form their ring: as long as the worker waits (members compile first, each at its
/// own pace on a loaded machine).
pub fn forming() -> collective::Config {
    collective::Config { connect_timeout: Duration::from_secs(300), ..collective::Config::default() }
}
