//! Free TCP ports on 127.0.0.1 for node listeners.
//!
//! Owns only port picking: bind port 0, read the port the kernel chose, release it. Between the
//! release and the node's own bind another process can take the port; the cluster start-up
//! detects that (the node exits with "address in use") and retries with fresh ports.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

use crate::HarnessError;

/// `n` distinct free ports on 127.0.0.1, as chosen by the kernel for port 0.
///
/// All listeners are held until every port is read, so the kernel cannot hand out the same
/// port twice in one call.
pub fn free_ports(n: usize) -> Result<Vec<u16>, HarnessError> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            HarnessError::new(format!("cannot bind 127.0.0.1:0 to find a free port: {e}"))
        })?;
    listeners
        .iter()
        .map(|l| {
            l.local_addr()
                .map(|a| a.port())
                .map_err(|e| HarnessError::new(format!("cannot read a bound port: {e}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_nonzero() {
        let ports = free_ports(5).expect("free ports");
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 5);
        assert!(ports.iter().all(|&p| p != 0));
    }
}
