//! TLS on a node's port and between nodes (docs/SECURITY.md §1), with real `lockd run`
//! processes and certificates minted per test with lock-tls's `mint`:
//!
//! - a plaintext client, a client without a certificate (when one is required) and a client
//!   whose certificate another CA signed are refused, and a node logs its refusals once, not
//!   once per connection;
//! - a node whose certificate another CA signed gets no Raft traffic through: its RPCs are
//!   refused at the handshake, and the leader cannot replicate to it;
//! - certificate and key files replaced on disk are used by new connections without a restart,
//!   and a broken replacement keeps the old ones.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_proto::v1::admin_service_client::AdminServiceClient;
use lock_proto::v1::raft_service_client::RaftServiceClient;
use lock_proto::v1::{RaftPayload, StatusRequest, StatusResponse};
use lock_tests::{lockd_binary, poll_until};
use lock_tls::client::{ClientTls, TlsConnector, client_config};
use lock_tls::mint::Authority;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tonic::transport::{Channel, Endpoint};

/// How long a node may take to print its ready line, and a cluster to elect a leader, on a
/// loaded two-core machine.
const START_WAIT: Duration = Duration::from_secs(30);
/// How long one call or handshake of a test may take before it counts as failed.
const CALL_WAIT: Duration = Duration::from_secs(10);

/// A CA and the identities it issued, as files in one folder.
struct Pki {
    dir: PathBuf,
    name: &'static str,
    ca: Authority,
}

impl Pki {
    fn new(dir: &Path, name: &'static str) -> Self {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let ca = Authority::new(&format!("{name} CA")).unwrap();
        ca.write(&dir.join("ca.pem"), &dir.join("ca-key.pem"))
            .unwrap();
        Self { dir, name, ca }
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Issues a certificate for `principal` into `<stem>.pem` / `<stem>-key.pem`.
    fn issue(&self, stem: &str, principal: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (
            self.dir.join(format!("{stem}.pem")),
            self.dir.join(format!("{stem}-key.pem")),
        );
        self.ca
            .issue(principal)
            .unwrap()
            .write(&cert, &key)
            .unwrap();
        (cert, key)
    }
}

/// One `lockd run` process, killed when dropped.
struct Node {
    child: Child,
    addr: String,
    stderr: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

/// The TLS files and flags of one node.
struct NodeTls<'a> {
    ca: &'a Path,
    cert: &'a Path,
    key: &'a Path,
    require_client_cert: bool,
}

/// Starts Raft node `id` of the cluster `peers` on `port` with `tls` (node 1 bootstraps), and
/// waits for its ready line.
async fn start(dir: &Path, id: u64, port: u16, peers: &str, tls: NodeTls<'_>) -> Node {
    let mut args: Vec<OsString> = vec!["--data-dir".into(), dir.join(format!("node{id}")).into()];
    args.extend(["--peers".into(), peers.into()]);
    if id == 1 {
        args.push("--bootstrap".into());
    }
    start_with(dir, id, port, args, tls).await
}

/// Starts node `id` on `port` with `tls` and the other arguments `args`, and waits for its
/// ready line.
async fn start_with(dir: &Path, id: u64, port: u16, args: Vec<OsString>, tls: NodeTls<'_>) -> Node {
    let stdout = dir.join(format!("node{id}.stdout.log"));
    let stderr = dir.join(format!("node{id}.stderr.log"));
    let roles = lock_tests::pki::roles_env(1..=3, &[("node-1-rotated".into(), "node".into())]);
    let mut command = Command::new(lockd_binary().unwrap());
    command
        .arg("run")
        .args(["--node-id", &id.to_string()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(args)
        .args(["--worker-threads", "1"])
        .arg("--tls-ca")
        .arg(tls.ca)
        .arg("--tls-cert")
        .arg(tls.cert)
        .arg("--tls-key")
        .arg(tls.key)
        .env_clear()
        .env("RUST_LOG", "info,openraft=warn")
        // The harness's role map (node-1..3 node, client/operator/admin their own), and the
        // rotation test's renamed node: an unmapped principal may call nothing.
        .env(roles.0, roles.1)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap());
    if tls.require_client_cert {
        command.arg("--require-client-cert");
    }
    let mut node = Node {
        child: command.spawn().expect("lockd starts"),
        addr: format!("127.0.0.1:{port}"),
        stderr,
    };
    let deadline = Instant::now() + START_WAIT;
    loop {
        if std::fs::read_to_string(&stdout)
            .unwrap_or_default()
            .contains("lockd ready")
        {
            return node;
        }
        if let Some(status) = node.child.try_wait().unwrap() {
            panic!(
                "node {id} exited ({status}) before it was ready:\n{}",
                node.log()
            );
        }
        assert!(
            Instant::now() < deadline,
            "node {id} not ready within {START_WAIT:?}:\n{}",
            node.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A channel to `addr` over TLS trusting `ca`, presenting `identity` if given; the connection
/// is made (and so the handshake done) before this returns.
async fn tls_channel(
    addr: &str,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<Channel, String> {
    let config = client_config(ca, identity).map_err(|e| e.to_string())?;
    let connector = TlsConnector::new(Arc::new(ClientTls::Fixed(Arc::new(config))));
    // `http`: the connector does the TLS.
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(CALL_WAIT)
        .connect_with_connector(connector)
        .await
        .map_err(|e| format!("{e:?}"))
}

/// `AdminService.Status` over TLS as `identity`.
async fn status_tls(
    addr: &str,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<StatusResponse, String> {
    let channel = tls_channel(addr, ca, identity).await?;
    let mut client = AdminServiceClient::new(channel);
    match tokio::time::timeout(CALL_WAIT, client.status(StatusRequest {})).await {
        Ok(Ok(answer)) => Ok(answer.into_inner()),
        Ok(Err(status)) => Err(format!("{status:?}")),
        Err(_) => Err(format!("no answer within {CALL_WAIT:?}")),
    }
}

/// `AdminService.Status` in plaintext.
async fn status_plain(addr: &str) -> Result<StatusResponse, String> {
    let call = async {
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))?;
        AdminServiceClient::new(channel)
            .status(StatusRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| format!("{s:?}"))
    };
    tokio::time::timeout(CALL_WAIT, call)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {CALL_WAIT:?}")))
}

/// The certificate `addr` presents in a fresh TLS handshake (as `identity`, trusting `ca`).
async fn served_certificate(
    addr: &str,
    ca: &Path,
    identity: (&Path, &Path),
) -> Result<CertificateDer<'static>, String> {
    let config = client_config(ca, Some(identity)).map_err(|e| e.to_string())?;
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = ServerName::try_from("127.0.0.1").expect("an IP is a server name");
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
    };
    let stream = tokio::time::timeout(CALL_WAIT, handshake)
        .await
        .map_err(|_| "handshake timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first().cloned())
        .ok_or_else(|| "no server certificate".to_owned())
}

/// Waits until `node` (asked as `identity`) knows a leader.
async fn wait_for_leader(node: &Node, ca: &Path, identity: (&Path, &Path)) -> StatusResponse {
    poll_until("a leader", START_WAIT, || async {
        match status_tls(&node.addr, ca, Some(identity)).await {
            Ok(status) if status.leader_id.is_some() && status.commit_index > 0 => Ok(status),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", node.log()))
}

fn one_port() -> u16 {
    lock_tests::ports::free_ports(1).unwrap()[0]
}

fn ids(cert: &CertificateDer<'_>) -> (String, String) {
    (
        lock_tls::principal_of(cert).unwrap(),
        lock_tls::serial_of(cert).unwrap(),
    )
}

#[tokio::test]
async fn plaintext_no_certificate_and_another_cas_certificate_are_refused_and_logged_once() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "cluster");
    let foreign = Pki::new(dir.path(), "foreign");
    let (node_cert, node_key) = pki.issue("node1", "node-1");
    let client = pki.issue("client", "client");
    let intruder = foreign.issue("intruder", "client");
    let port = one_port();
    let node = start(
        dir.path(),
        1,
        port,
        &format!("1=127.0.0.1:{port}"),
        NodeTls {
            ca: &pki.ca(),
            cert: &node_cert,
            key: &node_key,
            require_client_cert: true,
        },
    )
    .await;
    let client = (client.0.as_path(), client.1.as_path());
    wait_for_leader(&node, &pki.ca(), client).await;

    let plain = status_plain(&node.addr).await;
    assert!(plain.is_err(), "a plaintext client was answered: {plain:?}");
    let anonymous = status_tls(&node.addr, &pki.ca(), None).await;
    assert!(
        anonymous.is_err(),
        "a client without a certificate was answered: {anonymous:?}"
    );
    let other_ca = status_tls(&node.addr, &pki.ca(), Some((&intruder.0, &intruder.1))).await;
    assert!(
        other_ca.is_err(),
        "a certificate of another CA was accepted: {other_ca:?}"
    );
    // A client that trusts another CA does not accept the node's certificate either.
    let wrong_trust = status_tls(&node.addr, &foreign.ca(), Some((&intruder.0, &intruder.1))).await;
    assert!(wrong_trust.is_err(), "{wrong_trust:?}");

    // The node still serves the right client, and said so once for all those refusals.
    status_tls(&node.addr, &pki.ca(), Some(client))
        .await
        .expect("the cluster's client is still answered");
    let log = poll_until("the refusal in the log", START_WAIT, || async {
        let log = node.log();
        if log.contains("TLS handshake refused") {
            Ok(log)
        } else {
            Err("not logged yet".to_owned())
        }
    })
    .await
    .unwrap();
    assert_eq!(
        log.matches("TLS handshake refused").count(),
        1,
        "refusals are logged once, then summarised:\n{log}"
    );
    assert_eq!(pki.name, "cluster");
}

#[tokio::test]
async fn without_require_client_cert_a_client_may_present_none_but_not_another_cas() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "cluster");
    let foreign = Pki::new(dir.path(), "foreign");
    let (node_cert, node_key) = pki.issue("node1", "node-1");
    let client = pki.issue("client", "client");
    let intruder = foreign.issue("intruder", "client");
    let port = one_port();
    let node = start(
        dir.path(),
        1,
        port,
        &format!("1=127.0.0.1:{port}"),
        NodeTls {
            ca: &pki.ca(),
            cert: &node_cert,
            key: &node_key,
            require_client_cert: false,
        },
    )
    .await;
    wait_for_leader(&node, &pki.ca(), (&client.0, &client.1)).await;
    // The handshake admits a client without a certificate when none is required; the call
    // then needs a principal from a bearer token (docs/SECURITY.md §2), so it is answered —
    // UNAUTHENTICATED — rather than refused at the handshake.
    let anonymous = status_tls(&node.addr, &pki.ca(), None).await;
    assert!(
        matches!(&anonymous, Err(e) if e.contains("Unauthenticated")),
        "{anonymous:?}"
    );
    let other_ca = status_tls(&node.addr, &pki.ca(), Some((&intruder.0, &intruder.1))).await;
    assert!(other_ca.is_err(), "{other_ca:?}");
    assert!(status_plain(&node.addr).await.is_err());
}

#[tokio::test]
async fn a_node_with_a_certificate_of_another_ca_gets_no_raft_traffic_through() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "cluster");
    let foreign = Pki::new(dir.path(), "foreign");
    let ports = lock_tests::ports::free_ports(3).unwrap();
    let peers = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let n1 = pki.issue("node1", "node-1");
    let n2 = pki.issue("node2", "node-2");
    // The rogue node trusts the cluster's CA, so nothing but its own certificate stands
    // between it and the cluster.
    let rogue = foreign.issue("node3", "node-3");
    let admin = pki.issue("admin", "admin");
    let admin = (admin.0.as_path(), admin.1.as_path());
    let mut nodes = Vec::new();
    for (id, (cert, key)) in [(1, &n1), (2, &n2), (3, &rogue)] {
        let tls = NodeTls {
            ca: &pki.ca(),
            cert,
            key,
            require_client_cert: true,
        };
        nodes.push(start(dir.path(), id, ports[id as usize - 1], &peers, tls).await);
    }

    // Nodes 1 and 2 are a quorum of three: they elect a leader and commit without node 3.
    let status = wait_for_leader(&nodes[0], &pki.ca(), admin).await;
    let leader = status.leader_id.expect("a leader");
    assert!(leader == 1 || leader == 2, "leader {leader}");

    // Raft RPCs presenting the rogue certificate are refused at the handshake; the same RPC
    // with a cluster node's certificate reaches the Raft service (which refuses the empty
    // payload as a bad argument: the point is that it got that far).
    let vote = |identity: (PathBuf, PathBuf)| {
        let (ca, addr) = (pki.ca(), nodes[0].addr.clone());
        async move {
            let channel = tls_channel(&addr, &ca, Some((&identity.0, &identity.1))).await?;
            let mut client = RaftServiceClient::new(channel);
            match tokio::time::timeout(CALL_WAIT, client.vote(RaftPayload::default())).await {
                Ok(Ok(_)) => Ok(tonic::Code::Ok),
                Ok(Err(status)) => Ok(status.code()),
                Err(_) => Err("no answer".to_owned()),
            }
        }
    };
    let from_member = vote(n2.clone()).await;
    assert_eq!(
        from_member,
        Ok(tonic::Code::InvalidArgument),
        "a member's vote request reached the Raft service"
    );
    // Under TLS 1.3 the client's side of the handshake ends before the server has checked the
    // client's certificate, so the refusal may reach the caller as the stream torn down
    // (`Cancelled`) instead of a failed connect; either way the Raft service never answered.
    let from_rogue = vote(rogue.clone()).await;
    assert!(
        matches!(
            &from_rogue,
            Err(_) | Ok(tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled)
        ),
        "the rogue node's vote request got through: {from_rogue:?}"
    );

    // The leader cannot replicate to the rogue node (its certificate does not verify), so the
    // rogue node never learns the log or the leader, and the refusals are logged.
    let leader_node = &nodes[leader as usize - 1];
    poll_until(
        "the leader's log names the certificate failure",
        START_WAIT,
        || async {
            let log = leader_node.log();
            if log.contains("invalid peer certificate") {
                Ok(())
            } else {
                Err("not yet".to_owned())
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", leader_node.log()));
    // The node logs a refusal from its handshake task, a moment after the client saw it.
    poll_until("node 1 logs the rogue handshake", START_WAIT, || async {
        if nodes[0].log().contains("TLS handshake refused") {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", nodes[0].log()));
    // Ask the rogue node itself: it serves a foreign certificate, so trust its CA for this.
    let rogue_status = status_tls(&nodes[2].addr, &foreign.ca(), Some(admin))
        .await
        .expect("the rogue node answers a client that trusts its CA");
    let cluster = status_tls(&nodes[0].addr, &pki.ca(), Some(admin))
        .await
        .unwrap();
    assert!(cluster.commit_index > 0);
    assert_eq!(
        (rogue_status.leader_id, rogue_status.last_log_index),
        (None, 0),
        "the rogue node got Raft traffic: {rogue_status:?}"
    );
}

#[tokio::test]
async fn replaced_certificate_files_are_used_by_new_connections_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "cluster");
    let (node_cert, node_key) = pki.issue("node1", "node-1");
    let client = pki.issue("client", "client");
    let client = (client.0.as_path(), client.1.as_path());
    let port = one_port();
    let mut node = start(
        dir.path(),
        1,
        port,
        &format!("1=127.0.0.1:{port}"),
        NodeTls {
            ca: &pki.ca(),
            cert: &node_cert,
            key: &node_key,
            require_client_cert: true,
        },
    )
    .await;
    wait_for_leader(&node, &pki.ca(), client).await;
    let first = served_certificate(&node.addr, &pki.ca(), client)
        .await
        .unwrap();
    let (principal, serial) = ids(&first);
    assert_eq!(principal, "node-1");
    // A connection made before the rotation.
    let old = tls_channel(&node.addr, &pki.ca(), Some(client))
        .await
        .unwrap();
    let mut old = AdminServiceClient::new(old);
    old.status(StatusRequest {})
        .await
        .expect("the old connection works");

    // A broken replacement: new connections keep the old certificate, and the node says so
    // once however many connections come.
    std::fs::write(&node_cert, "-----BEGIN CERTIFICATE-----\nbroken\n").unwrap();
    for _ in 0..3 {
        let cert = served_certificate(&node.addr, &pki.ca(), client)
            .await
            .unwrap();
        assert_eq!(ids(&cert), (principal.clone(), serial.clone()));
    }
    let log = node.log();
    assert_eq!(
        log.matches("cannot be used").count(),
        1,
        "a broken file is logged once:\n{log}"
    );

    // The new certificate and key (another serial and principal, the same CA).
    pki.issue("node1", "node-1-rotated");
    let rotated = poll_until("the new certificate served", START_WAIT, || async {
        let cert = served_certificate(&node.addr, &pki.ca(), client).await?;
        let seen = ids(&cert);
        if seen.0 == "node-1-rotated" {
            Ok(seen)
        } else {
            Err(format!("still {seen:?}"))
        }
    })
    .await
    .unwrap();
    assert_ne!(rotated.1, serial, "a new serial");
    status_tls(&node.addr, &pki.ca(), Some(client))
        .await
        .expect("a new connection works with the new certificate");
    old.status(StatusRequest {})
        .await
        .expect("the connection made before the rotation still works");
    assert!(
        node.child.try_wait().unwrap().is_none(),
        "the node kept running"
    );
    assert!(
        node.log()
            .contains("TLS files changed; new connections use the new ones")
    );
}

#[tokio::test]
async fn a_stateless_pg_node_serves_tls_the_same_way() {
    let url = match std::env::var(lock_tests::stateless::PG_URL_ENV) {
        Ok(url) if !url.trim().is_empty() => url,
        _ => panic!(
            "{} is unset: run the tests with scripts/test, or `eval \"$(scripts/test-services.sh start)\"` first",
            lock_tests::stateless::PG_URL_ENV
        ),
    };
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "cluster");
    let foreign = Pki::new(dir.path(), "foreign");
    let (node_cert, node_key) = pki.issue("node1", "node-1");
    let client = pki.issue("client", "client");
    let intruder = foreign.issue("intruder", "client");
    let port = one_port();
    let args = vec![
        "--backend".into(),
        "pg".into(),
        "--pg-url".into(),
        url.into(),
    ];
    let tls = NodeTls {
        ca: &pki.ca(),
        cert: &node_cert,
        key: &node_key,
        require_client_cert: true,
    };
    let node = start_with(dir.path(), 1, port, args, tls).await;
    let status = status_tls(&node.addr, &pki.ca(), Some((&client.0, &client.1)))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    assert_eq!(status.node_id, 1);
    assert!(
        status_plain(&node.addr).await.is_err(),
        "plaintext was answered"
    );
    let other_ca = status_tls(&node.addr, &pki.ca(), Some((&intruder.0, &intruder.1))).await;
    assert!(
        other_ca.is_err(),
        "another CA's certificate was accepted: {other_ca:?}"
    );
    assert!(node.log().contains("tls=true"), "{}", node.log());
}
