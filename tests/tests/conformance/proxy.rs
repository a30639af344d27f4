//! A TCP forwarder the conformance suite puts between a store and its database, so a case can
//! cut the link (every open connection dropped, new ones refused) and watch how the store
//! reports it. Owns nothing else.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running forwarder to one upstream address.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let conns = tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let conn = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                conns.lock().expect("proxy task list").push(conn);
            }
        });
        tasks.lock().expect("proxy task list").push(accept);
        Ok(Proxy { addr, tasks })
    }

    /// The address clients connect to instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every connection and stops listening: the store's transport is gone.
    pub fn cut(&self) {
        for task in self.tasks.lock().expect("proxy task list").drain(..) {
            task.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
    }
}
