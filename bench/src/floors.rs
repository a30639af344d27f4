//! The floors under every lock operation on this machine: one `fdatasync` on the data disk
//! (after an append that grows the file, and after an overwrite inside space already allocated
//! and synced, which is what lockd's WAL does with its preallocated segments, alone and in three
//! files at once as the three nodes of a cluster on this disk do), one gRPC unary
//! round trip over loopback, and one plain TCP round trip to another process (a second copy of
//! this tool, started with `--tcp-echo`): the cost of waking the other side, with no HTTP/2.
//! A Raft commit costs at least one fdatasync, and a client operation at least one round trip
//! to the leader plus one leader → follower, so these bound what W3 can reach. Owns its probe
//! file, its in-process server and its echo process; nothing else.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::stats::{Samples, Summary};

/// Bytes appended before each fdatasync: one page, like a small Raft log append.
const FSYNC_WRITE_BYTES: usize = 4096;

/// Pages preallocated (written and synced) for the overwrite probe, which cycles through them:
/// 4 MiB, like a slice of a WAL segment's preallocated zeros.
const OVERWRITE_PAGES: usize = 1024;

/// The measured floors.
#[derive(Debug, Clone, Serialize)]
pub struct Floors {
    /// fdatasync of a 4 KiB append to a file in the data directory (the file grows, so the
    /// sync also commits its new size).
    pub fdatasync: Summary,
    /// fdatasync of a 4 KiB overwrite inside a region already written and synced (no size or
    /// block allocation to commit), as lockd's WAL writes into its preallocated zeros.
    pub fdatasync_overwrite: Summary,
    /// The same overwrite probe in [`CONCURRENT_SYNCERS`] files at once, one thread each, all
    /// samples together: what each node's `fdatasync` costs when the three nodes of a
    /// benchmark cluster sync on this one disk at the same moment, as they do for every entry.
    pub fdatasync_overwrite_concurrent: Summary,
    /// A unary gRPC call (grpc.health.v1 Check) to an in-process tonic server over loopback.
    pub grpc_round_trip: Summary,
    /// A 64-byte message to another process over loopback TCP and its echo (`TCP_NODELAY`,
    /// blocking sockets on both sides): what it costs to wake a process and be woken, as the
    /// client, the leader and the followers do for every message, before any gRPC work.
    pub tcp_process_round_trip: Summary,
}

/// Files synced at once by the concurrent `fdatasync` probe: one per node of the cluster.
pub const CONCURRENT_SYNCERS: usize = 3;

/// Untimed round trips before the timed ones of either round-trip probe, so the connection
/// and the other side are warm.
const WARMUP_ROUND_TRIPS: usize = 50;

/// Bytes of each TCP echo probe message: about one small Raft answer.
const ECHO_BYTES: usize = 64;

/// Measures both floors: `fsyncs` fdatasyncs in `dir`, then `round_trips` gRPC calls.
pub async fn measure(dir: &Path, fsyncs: usize, round_trips: usize) -> Result<Floors> {
    let dir = dir.to_path_buf();
    let (fdatasync, fdatasync_overwrite, fdatasync_overwrite_concurrent) =
        tokio::task::spawn_blocking(move || {
            Ok::<_, anyhow::Error>((
                fdatasync_samples(&dir, Probe::Append, 0, fsyncs)?,
                fdatasync_samples(&dir, Probe::Overwrite, 0, fsyncs)?,
                concurrent_fdatasync_samples(&dir, fsyncs)?,
            ))
        })
        .await
        .context("the fdatasync probe panicked")??;
    let grpc_round_trip = round_trip_samples(round_trips).await?;
    let tcp_process_round_trip =
        tokio::task::spawn_blocking(move || tcp_process_round_trip_samples(round_trips))
            .await
            .context("the TCP echo probe panicked")??;
    Ok(Floors {
        fdatasync: fdatasync.summary(),
        fdatasync_overwrite: fdatasync_overwrite.summary(),
        fdatasync_overwrite_concurrent: fdatasync_overwrite_concurrent.summary(),
        grpc_round_trip: grpc_round_trip.summary(),
        tcp_process_round_trip: tcp_process_round_trip.summary(),
    })
}

/// The echo side of the TCP floor, in the child process: binds a loopback port, prints it on
/// stdout, echoes every byte of the one connection it accepts until the peer closes it.
pub fn serve_tcp_echo() -> Result<()> {
    use std::io::{Read, Write};
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").context("binding the TCP echo port")?;
    let port = listener
        .local_addr()
        .context("reading the echo port")?
        .port();
    println!("{port}");
    std::io::stdout()
        .flush()
        .context("printing the echo port")?;
    let (mut stream, _) = listener
        .accept()
        .context("accepting the probe connection")?;
    stream.set_nodelay(true).context("setting TCP_NODELAY")?;
    let mut buf = [0u8; ECHO_BYTES];
    loop {
        let n = stream.read(&mut buf).context("reading a probe")?;
        if n == 0 {
            return Ok(());
        }
        stream.write_all(&buf[..n]).context("echoing a probe")?;
    }
}

/// `count` timed round trips of [`ECHO_BYTES`] to a copy of this tool serving the echo
/// ([`serve_tcp_echo`]), after a few untimed ones. Blocking: run it off the async workers.
fn tcp_process_round_trip_samples(count: usize) -> Result<Samples> {
    let exe = std::env::current_exe().context("finding this executable for the echo process")?;
    let mut child = std::process::Command::new(&exe)
        .arg("--tcp-echo")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {} --tcp-echo", exe.display()))?;
    let result = echo_round_trips(&mut child, count);
    // Closing the connection ends the child; kill it if the probe failed before connecting.
    if result.is_err() {
        let _ = child.kill();
    }
    let status = child.wait().context("waiting for the echo process")?;
    let samples = result?;
    anyhow::ensure!(status.success(), "the echo process failed: {status}");
    Ok(samples)
}

/// Connects to the echo `child` at the port it printed and times `count` round trips.
fn echo_round_trips(child: &mut std::process::Child, count: usize) -> Result<Samples> {
    use std::io::{BufRead, Read, Write};
    let stdout = child
        .stdout
        .take()
        .context("the echo process has no stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .context("reading the echo port")?;
    let port: u16 = line
        .trim()
        .parse()
        .with_context(|| format!("the echo process printed {line:?}, not a port"))?;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))
        .context("connecting to the echo process")?;
    stream.set_nodelay(true).context("setting TCP_NODELAY")?;
    let message = [0x5a_u8; ECHO_BYTES];
    let mut echo = [0u8; ECHO_BYTES];
    let mut samples = Samples::with_capacity(count);
    for i in 0..count + WARMUP_ROUND_TRIPS {
        let t0 = Instant::now();
        stream.write_all(&message).context("sending a probe")?;
        stream.read_exact(&mut echo).context("reading an echo")?;
        if i >= WARMUP_ROUND_TRIPS {
            samples.push(t0.elapsed());
        }
    }
    Ok(samples)
}

/// Where each probed page is written before its `fdatasync`.
#[derive(Clone, Copy)]
enum Probe {
    /// Past the end of the file, which grows: the sync also commits the new size.
    Append,
    /// Inside [`OVERWRITE_PAGES`] already written and synced, cycling: only the data to sync.
    Overwrite,
}

/// [`CONCURRENT_SYNCERS`] threads, each running the overwrite probe (`count` syncs) on its own
/// file at the same time; their samples together.
fn concurrent_fdatasync_samples(dir: &Path, count: usize) -> Result<Samples> {
    std::thread::scope(|scope| {
        let probes: Vec<_> = (1..=CONCURRENT_SYNCERS)
            .map(|n| scope.spawn(move || fdatasync_samples(dir, Probe::Overwrite, n, count)))
            .collect();
        let mut all = Samples::with_capacity(count * CONCURRENT_SYNCERS);
        for probe in probes {
            let samples = probe
                .join()
                .map_err(|_| anyhow::anyhow!("a concurrent fdatasync probe panicked"))??;
            all.merge(samples);
        }
        Ok(all)
    })
}

/// `count` timed `fdatasync`s of probe file number `n` in `dir`, each after one page written as
/// `probe` says. The file is removed afterwards.
fn fdatasync_samples(dir: &Path, probe: Probe, n: usize, count: usize) -> Result<Samples> {
    let path = dir.join(match probe {
        Probe::Append => format!("fdatasync-probe-{n}"),
        Probe::Overwrite => format!("fdatasync-overwrite-probe-{n}"),
    });
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    if let Probe::Overwrite = probe {
        let zeros = vec![0_u8; FSYNC_WRITE_BYTES * OVERWRITE_PAGES];
        file.write_all_at(&zeros, 0)
            .and_then(|()| file.sync_all())
            .with_context(|| format!("preallocating {}", path.display()))?;
    }
    let page = [0x5a_u8; FSYNC_WRITE_BYTES];
    let mut samples = Samples::with_capacity(count);
    for i in 0..count {
        let page_no = match probe {
            Probe::Append => i,
            Probe::Overwrite => i % OVERWRITE_PAGES,
        };
        file.write_all_at(&page, (page_no * FSYNC_WRITE_BYTES) as u64)
            .with_context(|| format!("writing {}", path.display()))?;
        let t0 = Instant::now();
        file.sync_data()
            .with_context(|| format!("fdatasync of {}", path.display()))?;
        samples.push(t0.elapsed());
    }
    drop(file);
    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    Ok(samples)
}

async fn round_trip_samples(count: usize) -> Result<Samples> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the loopback probe server")?;
    let addr = listener.local_addr().context("reading the probe address")?;
    let incoming = TcpListenerStream::new(listener).map(|stream| {
        let stream = stream?;
        stream.set_nodelay(true)?;
        Ok::<_, std::io::Error>(stream)
    });
    let (_reporter, service) = tonic_health::server::health_reporter();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stop_rx.await;
            }),
    );
    let mut client = HealthClient::new(crate::lockd::channel(&addr.to_string()).await?);
    let mut samples = Samples::with_capacity(count);
    // A few calls first so the connection and the server task are warm.
    for i in 0..count + WARMUP_ROUND_TRIPS {
        let t0 = Instant::now();
        client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .context("loopback grpc.health.v1 Check")?;
        if i >= WARMUP_ROUND_TRIPS {
            samples.push(t0.elapsed());
        }
    }
    let _ = stop_tx.send(());
    server
        .await
        .context("the probe server panicked")?
        .context("the probe server failed")?;
    Ok(samples)
}
