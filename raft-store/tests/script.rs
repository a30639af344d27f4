//! Script tests of the lock state machine (raft-rs `testdata` style).
//!
//! Each file in `tests/testdata/` is a list of blocks: one or more command lines, a `----` line,
//! then the expected output up to the next blank line. Lines starting with `#` between blocks
//! are comments. Run with `UPDATE_SCRIPTS=1` to rewrite the expected output from what the table
//! actually answers (then read the diff before committing it).
//!
//! After every command the harness checks `LockTable::check_invariants()`, that no token is ever
//! issued twice, and that per key every new grant's token is greater than the previous one.
//!
//! # Commands
//!
//! ```text
//! time <ms>                                     set the stamp of the following commands
//! open <session> owner=<o> ttl=<ms>
//! close <session> | expire-session <session>
//! acquire <session> id=<n> key=<k> [ttl=<ms>] [wait=<ms>]     ttl defaults to 5000, wait to 0
//! release <session> id=<n> key=<k> token=<t>
//! renew <session> id=<n> key=<k> token=<t> [ttl=<ms>]
//! cancel <session> id=<n> key=<k> [release]
//! revoke key=<k> operator=<o> reason=<r>
//! expire-lock key=<k> token=<t>
//! promote
//! batch: <command>; <command>; ...              one Batch entry; an element `batch` is a nested (empty) Batch
//! repeat <n> <command with {i}>                 n commands, applied in batches of BATCH_MAX; prints a summary
//! batch-of <n> <command with {i}>               exactly one Batch of n commands; prints a summary
//! state                                         print grants, queues, sessions and the token floor
//! revocations                                   print the audit log's size, oldest and newest entry
//! ```
//!
//! A value `x*N` stands for `x` repeated N times (for length limits); `{i}` in a repeated
//! command is replaced by its index, from 0.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use lock_raft_store::limits::BATCH_MAX;
use lock_raft_store::{Command, Event, FreeCause, Grant, LockTable, Rejection, Response};

/// The table under test plus the global token checks the table cannot make about itself.
struct Harness {
    table: LockTable,
    stamp_ms: u64,
    /// Every token seen in a `Granted` event.
    issued: std::collections::BTreeSet<u64>,
    /// Highest token granted per key.
    last_per_key: BTreeMap<String, u64>,
}

impl Harness {
    fn new() -> Self {
        Harness {
            table: LockTable::new(),
            stamp_ms: 0,
            issued: Default::default(),
            last_per_key: BTreeMap::new(),
        }
    }

    fn apply(&mut self, command: Command, events: &mut Vec<Event>, at: &str) -> Response {
        let first_new = events.len();
        let response = self.table.apply(self.stamp_ms, command, events);
        if let Err(violation) = self.table.check_invariants() {
            panic!("{at}: {violation}");
        }
        for event in &events[first_new..] {
            if let Event::Granted { grant, .. } = event {
                assert!(
                    self.issued.insert(grant.token),
                    "{at}: token {} issued twice",
                    grant.token
                );
                assert!(
                    grant.token <= self.table.last_token(),
                    "{at}: token {} above the floor",
                    grant.token
                );
                let last = self.last_per_key.entry(grant.key.clone()).or_default();
                assert!(
                    grant.token > *last,
                    "{at}: key {} granted token {} after {}",
                    grant.key,
                    grant.token,
                    *last
                );
                *last = grant.token;
            }
        }
        response
    }

    /// Runs one script line and returns its output lines.
    fn run(&mut self, line: &str, at: &str) -> Vec<String> {
        let (verb, rest) = line.split_once(' ').unwrap_or((line, ""));
        let mut out = Vec::new();
        match verb {
            "time" => {
                self.stamp_ms = rest
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{at}: bad time"));
            }
            "state" => self.state(&mut out),
            "revocations" => {
                let revs: Vec<_> = self.table.revocations().collect();
                out.push(format!("revocations: {}", revs.len()));
                if let (Some(first), Some(last)) = (revs.first(), revs.last()) {
                    out.push(format!("  oldest: {}", revocation(first)));
                    out.push(format!("  newest: {}", revocation(last)));
                }
            }
            "repeat" | "batch-of" => {
                let (n, template) = rest
                    .split_once(' ')
                    .unwrap_or_else(|| panic!("{at}: {verb} <n> <command>"));
                let n: usize = n.parse().unwrap_or_else(|_| panic!("{at}: bad count"));
                let commands: Vec<Command> = (0..n)
                    .map(|i| parse(&template.replace("{i}", &i.to_string()), at))
                    .collect();
                let chunk = if verb == "repeat" {
                    BATCH_MAX
                } else {
                    n.max(1)
                };
                let mut events = Vec::new();
                let mut responses = Vec::new();
                let mut pending = commands.into_iter().peekable();
                while pending.peek().is_some() {
                    let batch: Vec<Command> = pending.by_ref().take(chunk).collect();
                    match self.apply(Command::Batch(batch), &mut events, at) {
                        Response::Batch(rs) => responses.extend(rs),
                        other => panic!("{at}: a batch answered {other:?}"),
                    }
                }
                let mut counts: Vec<(String, usize)> = Vec::new();
                for r in &responses {
                    let kind = kind(r);
                    match counts.iter_mut().find(|(k, _)| *k == kind) {
                        Some((_, c)) => *c += 1,
                        None => counts.push((kind, 1)),
                    }
                }
                let summary: Vec<String> = counts.iter().map(|(k, c)| format!("{c} {k}")).collect();
                out.push(format!(
                    "{verb} {n}: {}; {} events",
                    summary.join(", "),
                    events.len()
                ));
                if let Some(last) = responses.last() {
                    out.push(format!("  last: {}", response(last).join(" | ")));
                }
            }
            _ => {
                let command = parse(line, at);
                let mut events = Vec::new();
                let r = self.apply(command, &mut events, at);
                out.extend(response(&r));
                out.extend(events.iter().map(|e| format!("  > {}", event(e))));
            }
        }
        out
    }

    fn state(&self, out: &mut Vec<String>) {
        out.push(format!("last_token={}", self.table.last_token()));
        for g in self.table.grants().map(|g| g.to_grant()) {
            let waiters: Vec<String> = self
                .table
                .waiters(&g.key)
                .map(|w| format!("{}#{}(until {})", w.session_id, w.request_id, w.deadline_ms))
                .collect();
            out.push(format!("grant {}", grant(&g)));
            if !waiters.is_empty() {
                out.push(format!("  waiters: {}", waiters.join(" ")));
            }
        }
        for (id, s) in self.table.sessions() {
            let locks: Vec<&str> = s.locks().iter().collect();
            let waits: Vec<String> = s.waits().map(|(k, r)| format!("{k}#{r}")).collect();
            out.push(format!(
                "session {id} owner={} ttl={} expires={} locks=[{}] waits=[{}]",
                s.owner_id,
                s.ttl_ms,
                s.expires_at_ms,
                locks.join(","),
                waits.join(",")
            ));
        }
    }
}

/// `a*3` → `aaa`.
fn expand(value: &str) -> String {
    match value.rsplit_once('*') {
        Some((text, n)) if n.parse::<usize>().is_ok() => text.repeat(n.parse().unwrap_or(0)),
        _ => value.to_owned(),
    }
}

fn parse(line: &str, at: &str) -> Command {
    let line = line.trim();
    if let Some(rest) = line.strip_prefix("batch:") {
        let commands = rest
            .split(';')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(|c| {
                if c == "batch" {
                    Command::Batch(vec![])
                } else {
                    parse(c, at)
                }
            })
            .collect();
        return Command::Batch(commands);
    }
    let mut words = line.split_whitespace();
    let verb = words.next().unwrap_or("");
    let mut positional = Vec::new();
    let mut args = BTreeMap::new();
    for word in words {
        match word.split_once('=') {
            Some((k, v)) => {
                args.insert(k.to_owned(), expand(v));
            }
            None => positional.push(word.to_owned()),
        }
    }
    let s = |name: &str| -> String {
        args.get(name)
            .cloned()
            .unwrap_or_else(|| panic!("{at}: `{verb}` needs {name}="))
    };
    let n = |name: &str, default: Option<u64>| -> u64 {
        match args.get(name) {
            Some(v) => v
                .parse()
                .unwrap_or_else(|_| panic!("{at}: {name}= is not a number")),
            None => default.unwrap_or_else(|| panic!("{at}: `{verb}` needs {name}=")),
        }
    };
    let session = || -> String {
        positional
            .first()
            .map(|s| expand(s))
            .unwrap_or_else(|| panic!("{at}: `{verb}` needs a session"))
    };
    match verb {
        "open" => Command::OpenSession {
            session_id: session(),
            owner_id: s("owner"),
            ttl_ms: n("ttl", Some(10_000)),
        },
        "close" => Command::CloseSession {
            session_id: session(),
        },
        "expire-session" => Command::ExpireSession {
            session_id: session(),
        },
        "acquire" => Command::Acquire {
            session_id: session(),
            request_id: n("id", None),
            key: s("key"),
            ttl_ms: n("ttl", Some(5_000)),
            wait_ms: n("wait", Some(0)),
        },
        "release" => Command::Release {
            session_id: session(),
            request_id: n("id", None),
            key: s("key"),
            token: n("token", None),
        },
        "renew" => Command::Renew {
            session_id: session(),
            request_id: n("id", None),
            key: s("key"),
            token: n("token", None),
            ttl_ms: n("ttl", Some(5_000)),
        },
        "cancel" => Command::CancelWait {
            session_id: session(),
            request_id: n("id", None),
            key: s("key"),
            release_if_granted: positional.iter().any(|p| p == "release"),
        },
        "revoke" => Command::ForceRevoke {
            key: s("key"),
            operator: s("operator"),
            reason: s("reason"),
            request_id: n("id", Some(0)),
        },
        "expire-lock" => Command::ExpireLock {
            key: s("key"),
            token: n("token", None),
        },
        "promote" => Command::Promote,
        other => panic!("{at}: unknown command `{other}`"),
    }
}

fn grant(g: &Grant) -> String {
    format!(
        "key={} token={} owner={} session={} req={} ttl={} acquired={} expires={}",
        g.key,
        g.token,
        g.owner_id,
        g.session_id,
        g.request_id,
        g.ttl_ms,
        g.acquired_at_ms,
        g.expires_at_ms
    )
}

fn revocation(r: &lock_raft_store::Revocation) -> String {
    format!(
        "key={} previous_owner={} previous_token={} floor={} operator={} reason={} at={} id={}",
        r.key,
        r.previous_owner_id.as_deref().unwrap_or("-"),
        r.previous_token.map_or("-".to_owned(), |t| t.to_string()),
        r.new_token_floor,
        r.operator,
        r.reason,
        r.at_ms,
        r.request_id
    )
}

fn kind(r: &Response) -> String {
    match r {
        Response::Rejected(Rejection::LimitExceeded { .. }) => "limit-exceeded".into(),
        Response::Rejected(Rejection::InvalidArgument { .. }) => "invalid-argument".into(),
        Response::Rejected(Rejection::StaleRequest { .. }) => "stale-request".into(),
        Response::Rejected(Rejection::UnknownSession { .. }) => "unknown-session".into(),
        other => response(other)[0]
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_owned(),
    }
}

fn response(r: &Response) -> Vec<String> {
    let line = match r {
        Response::SessionOpened { session_id, ttl_ms } => {
            format!("session-opened {session_id} ttl={ttl_ms}")
        }
        Response::SessionClosed { locks_released } => {
            format!("session-closed locks_released={locks_released}")
        }
        Response::Granted(g) => format!("granted {}", grant(g)),
        Response::Queued { position } => format!("queued position={position}"),
        Response::NotGranted => "not-granted".into(),
        Response::Released { released } => format!("released={released}"),
        Response::Renewed(g) => format!("renewed {}", grant(g)),
        Response::Lost => "lost".into(),
        Response::WaitCancelled {
            removed,
            grant: g,
            released,
        } => format!(
            "wait-cancelled removed={removed} released={released} grant={}",
            g.as_ref().map_or("none".to_owned(), grant)
        ),
        Response::Revoked(r) => format!("revoked {}", revocation(r)),
        Response::LockExpired { expired } => format!("lock-expired expired={expired}"),
        Response::Promoted { grants, sessions } => {
            format!("promoted grants={grants} sessions={sessions}")
        }
        Response::Batch(rs) => {
            let mut lines = vec![format!("batch of {}", rs.len())];
            for (i, r) in rs.iter().enumerate() {
                for (j, l) in response(r).into_iter().enumerate() {
                    lines.push(if j == 0 {
                        format!("  [{i}] {l}")
                    } else {
                        format!("  {l}")
                    });
                }
            }
            return lines;
        }
        Response::Rejected(Rejection::UnknownSession { session_id }) => {
            format!("rejected unknown-session {session_id}")
        }
        Response::Rejected(Rejection::InvalidArgument { message }) => {
            format!("rejected invalid-argument: {message}")
        }
        Response::Rejected(Rejection::LimitExceeded { message }) => {
            format!("rejected limit-exceeded: {message}")
        }
        Response::Rejected(Rejection::StaleRequest {
            session_id,
            request_id,
        }) => format!("rejected stale-request session={session_id} id={request_id}"),
        Response::Rejected(Rejection::PermissionDenied {
            principal,
            session_id,
        }) => format!("rejected permission-denied principal={principal} session={session_id}"),
        Response::NoCommand => "no-command".into(),
        Response::LimitsSet { limits } => format!("limits-set {limits:?}"),
    };
    vec![line]
}

fn event(e: &Event) -> String {
    match e {
        Event::Granted {
            grant: g,
            shared_key,
            handed_off,
        } => {
            assert_eq!(&**shared_key, g.key, "an event's shared key is its grant's");
            let how = if *handed_off { "handed-off" } else { "granted" };
            format!("{how} {}", grant(g))
        }
        Event::Freed { key, token, cause } => {
            let cause = match cause {
                FreeCause::Released => "released",
                FreeCause::Expired => "expired",
                FreeCause::Revoked => "revoked",
                FreeCause::SessionEnded => "session-ended",
            };
            format!("freed key={key} token={token} cause={cause}")
        }
        Event::WaiterDropped {
            session_id,
            request_id,
            key,
        } => format!("waiter-dropped session={session_id} req={request_id} key={key}"),
        Event::SessionOpened {
            session_id,
            ttl_ms,
            principal: None,
        } => format!("session-opened {session_id} ttl={ttl_ms}"),
        Event::SessionOpened {
            session_id,
            ttl_ms,
            principal: Some(principal),
        } => format!("session-opened {session_id} ttl={ttl_ms} principal={principal}"),
        Event::SessionEnded {
            session_id,
            expired: false,
        } => format!("session-ended {session_id}"),
        Event::SessionEnded {
            session_id,
            expired: true,
        } => format!("session-expired {session_id}"),
        Event::Promoted { stamp_ms } => format!("promoted stamp={stamp_ms}"),
    }
}

/// One `commands ---- output` block, or a run of comment/blank lines kept as they are.
enum Item {
    Text(String),
    Block {
        line_no: usize,
        commands: Vec<String>,
        expected: Vec<String>,
    },
}

fn parse_script(text: &str, file: &str) -> Vec<Item> {
    let mut items = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        if line.trim().is_empty() || line.starts_with('#') {
            items.push(Item::Text(line.to_owned()));
            continue;
        }
        let mut commands = vec![line.to_owned()];
        loop {
            match lines.next() {
                Some((_, "----")) => break,
                Some((_, l)) => commands.push(l.to_owned()),
                None => panic!("{file}:{}: block without a ---- line", i + 1),
            }
        }
        let mut expected = Vec::new();
        while let Some((_, l)) = lines.peek() {
            if l.trim().is_empty() {
                break;
            }
            expected.push(l.to_string());
            lines.next();
        }
        items.push(Item::Block {
            line_no: i + 1,
            commands,
            expected,
        });
    }
    items
}

fn run_script(name: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata")
        .join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let update = std::env::var_os("UPDATE_SCRIPTS").is_some_and(|v| v == "1");
    let mut harness = Harness::new();
    let mut rewritten = String::new();
    let mut failures = String::new();
    for item in parse_script(&text, name) {
        match item {
            Item::Text(line) => {
                rewritten.push_str(&line);
                rewritten.push('\n');
            }
            Item::Block {
                line_no,
                commands,
                expected,
            } => {
                let mut actual = Vec::new();
                for (offset, command) in commands.iter().enumerate() {
                    let at = format!("{name}:{}", line_no + offset);
                    actual.extend(harness.run(command, &at));
                }
                if actual.is_empty() {
                    actual.push("ok".to_owned());
                }
                if actual != expected {
                    let _ = write!(
                        failures,
                        "\n{name}:{line_no}: {}\n--- expected\n{}\n--- actual\n{}\n",
                        commands.join(" / "),
                        expected.join("\n"),
                        actual.join("\n")
                    );
                }
                for c in &commands {
                    rewritten.push_str(c);
                    rewritten.push('\n');
                }
                rewritten.push_str("----\n");
                for l in &actual {
                    rewritten.push_str(l);
                    rewritten.push('\n');
                }
            }
        }
    }
    if update {
        std::fs::write(&path, rewritten)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    } else if !failures.is_empty() {
        panic!("script output differs (rerun with UPDATE_SCRIPTS=1 to accept):{failures}");
    }
}

macro_rules! scripts {
    ($($test:ident => $file:literal),+ $(,)?) => {
        $( #[test] fn $test() { run_script($file); } )+

        /// Every file in testdata/ has a test above, so a new script cannot be silently skipped.
        #[test]
        fn every_script_is_run() {
            let listed = [$($file),+];
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata");
            for entry in std::fs::read_dir(&dir).expect("tests/testdata exists") {
                let name = entry.expect("readable dir entry").file_name();
                let name = name.to_string_lossy();
                assert!(listed.contains(&name.as_ref()), "tests/testdata/{name} is not listed in scripts!");
            }
        }
    };
}

scripts! {
    sessions => "sessions.txt",
    acquire_release => "acquire_release.txt",
    handoff => "handoff.txt",
    idempotency => "idempotency.txt",
    cancel_wait => "cancel_wait.txt",
    revoke => "revoke.txt",
    expiry => "expiry.txt",
    renew => "renew.txt",
    promote => "promote.txt",
    batch => "batch.txt",
    validation => "validation.txt",
    limits => "limits.txt",
    limit_sessions => "limit_sessions.txt",
}
