//! The corrupt nemesis: stop a node, damage what it keeps on disk, restart it.
//!
//! The damage goes to the node's newest WAL segment (`<data-dir>/raft/wal/<seq>.wal`, format
//! in raft-store/src/storage/engine/wal.rs: a 16-byte header, then frames of body length u32,
//! crc32 u32 and body, then preallocated zeros) or, a third of the time when there is one, its
//! snapshot file (`<data-dir>/raft/snapshots/*.snap`, one checksummed record):
//!
//! - `flip`: 1–8 random bits flipped inside the written frames (or the snapshot file);
//! - `truncate`: the segment cut inside its last frame — a torn write, as a power cut leaves.
//!
//! Truncation stays inside the last frame on purpose: a cut before it removes whole frames
//! that were synced and acknowledged, which no checksum can notice and no disk that honours
//! `fdatasync` does; that is the power-cut nemesis's territory ([`super::power_cut`]).
//!
//! The restart then has two acceptable outcomes, and the heal records which (`result`):
//!
//! - `recovered`: the node starts (the damage was a torn tail and was cut, or it was in a
//!   snapshot lockd could do without) and catches up from its peers;
//! - `refused-rebuilt`: the node exits before it is ready, and its log names the damaged file
//!   (`named_file`); it is then rebuilt as docs/NODE_CLI.md says for a lost data dir: its id is
//!   removed from the voters, its data wiped and never used again, and a new node (the next
//!   spare id) on an empty data dir is added as a learner and promoted.
//!
//! A refusal that does not name the file is a finding (the checker's `damage_detected`). Which
//! damage lockd must cut and which it must refuse is the WAL's own rule, and that rule is
//! being changed (damage after the last sync boundary cut, before it refused naming file and
//! offset); this nemesis accepts both outcomes and only records them. Whether the node kept
//! what was acknowledged is judged at the cluster's level, by every other property.
//!
//! A rebuild needs a spare node id; with none left the nemesis does not damage anything
//! (skipped).

use std::path::{Path, PathBuf};

use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

use super::Ctx;
use crate::admin;
use crate::cluster::StartOutcome;
use crate::history::{F, Outcome, Phase};

/// Where the node keeps its Raft storage inside its data dir (node/src/identity.rs
/// `STORAGE_SUBDIR`), and the WAL's and snapshots' folders in it.
pub const STORAGE_SUBDIR: &str = "raft";
/// See [`STORAGE_SUBDIR`].
pub const WAL_SUBDIR: &str = "wal";
/// See [`STORAGE_SUBDIR`].
pub const SNAPSHOT_SUBDIR: &str = "snapshots";

/// WAL segment header length (magic 8 bytes, format version u32 LE, crc).
const WAL_HEADER_LEN: u64 = 16;
/// Where the segment header keeps its format version.
const WAL_VERSION_AT: usize = 8;
/// WAL frame header length in format 1 (body length, crc).
const WAL_FRAME_HEADER_LEN_V1: u64 = 8;
/// WAL frame header length in format 2 (body length, crc, the frame's own offset, the sync
/// boundary); a format-2 frame may have an empty body (the mark written after each sync), so
/// its end is where a header stops holding its own offset, not where a length is zero.
const WAL_FRAME_HEADER_LEN_V2: u64 = 24;

/// Most bits flipped by one fault.
pub const FLIP_BITS_MAX: u32 = 8;

/// Most bytes of a refusing node's log kept in the history.
const LOG_EXCERPT_BYTES: usize = 600;

/// A stopped node and what was done to its disk, to restart.
#[derive(Debug)]
pub struct Damaged {
    node: Option<u64>,
    file_name: String,
}

/// Where the written frames of a WAL segment end (the preallocated zeros after them are not
/// data), and where its last frame starts. `None` if the file has no frame or cannot be read.
fn wal_frames(bytes: &[u8]) -> Option<(u64, u64)> {
    let version = u32::from_le_bytes(
        bytes
            .get(WAL_VERSION_AT..WAL_VERSION_AT + 4)?
            .try_into()
            .ok()?,
    );
    let frame_header = match version {
        1 => WAL_FRAME_HEADER_LEN_V1,
        2 => WAL_FRAME_HEADER_LEN_V2,
        _ => return None,
    };
    let mut at = WAL_HEADER_LEN;
    let mut last = None;
    let len = bytes.len() as u64;
    while at + frame_header <= len {
        let i = usize::try_from(at).ok()?;
        let body = u32::from_le_bytes(bytes.get(i..i + 4)?.try_into().ok()?) as u64;
        let ended = if version == 1 {
            body == 0
        } else {
            u64::from_le_bytes(bytes.get(i + 8..i + 16)?.try_into().ok()?) != at
        };
        if ended {
            break;
        }
        let end = at + frame_header + body;
        if end > len {
            break;
        }
        last = Some(at);
        at = end;
    }
    last.map(|last| (at, last))
}

/// The newest WAL segment and the current snapshot file of the node with data dir `dir`.
fn files(dir: &Path) -> (Option<PathBuf>, Option<PathBuf>) {
    let newest = |sub: &str, ext: &str| {
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir.join(STORAGE_SUBDIR).join(sub))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .collect();
        found.sort();
        found.pop()
    };
    (newest(WAL_SUBDIR, "wal"), newest(SNAPSHOT_SUBDIR, "snap"))
}

/// Damages `path` (a WAL segment if `wal`, else a snapshot file); returns what was done.
fn damage(path: &Path, wal: bool, rng: &mut StdRng) -> anyhow::Result<Value> {
    let mut bytes = std::fs::read(path)?;
    let (data_end, last_frame) = if wal {
        wal_frames(&bytes).ok_or_else(|| anyhow::anyhow!("{} has no frame", path.display()))?
    } else {
        (bytes.len() as u64, 0)
    };
    if data_end == 0 {
        anyhow::bail!("{} is empty", path.display());
    }
    if wal && rng.gen_bool(0.5) {
        // A torn write: cut inside the last frame (never at its very start: that is a clean
        // end, not damage).
        let cut = rng.gen_range(last_frame + 1..data_end);
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        file.set_len(cut)?;
        file.sync_all()?;
        return Ok(
            json!({"damage": "truncate", "at": cut, "was": data_end, "last_frame": last_frame}),
        );
    }
    let from = if wal { WAL_HEADER_LEN } else { 0 };
    let bits = rng.gen_range(1..=FLIP_BITS_MAX);
    let mut flipped = Vec::new();
    for _ in 0..bits {
        let at = rng.gen_range(from..data_end);
        let bit = rng.gen_range(0..8u8);
        if let Some(byte) = usize::try_from(at).ok().and_then(|i| bytes.get_mut(i)) {
            *byte ^= 1 << bit;
            flipped.push(json!([at, bit]));
        }
    }
    std::fs::write(path, &bytes)?;
    std::fs::File::open(path)?.sync_all()?;
    Ok(json!({"damage": "flip", "bits": flipped, "data_end": data_end}))
}

/// Stops a node and damages its newest WAL segment or its snapshot.
pub async fn start(ctx: &Ctx, rng: &mut StdRng) -> Damaged {
    let skipped = |value: Value| {
        ctx.record(F::Corrupt, Phase::Start, Outcome::Skipped, value);
        Damaged {
            node: None,
            file_name: String::new(),
        }
    };
    if !ctx.has_spare() {
        return skipped(json!({"reason": "no spare node id left for a rebuild"}));
    }
    let (node, leader) = ctx.pick_node(rng).await;
    let mut cluster = ctx.cluster.lock().await;
    if !cluster.is_running(node) {
        return skipped(json!({"node": node, "reason": "not running"}));
    }
    let Some(dir) = cluster.data_dir(node).map(Path::to_path_buf) else {
        return skipped(json!({"node": node, "reason": "no data dir"}));
    };
    if let Err(e) = cluster.kill(node).await {
        ctx.record(
            F::Corrupt,
            Phase::Start,
            Outcome::Indeterminate,
            json!({"node": node, "error": format!("{e:#}")}),
        );
        return Damaged {
            node: Some(node),
            file_name: String::new(),
        };
    }
    let (wal, snapshot) = files(&dir);
    let target = match (wal, snapshot) {
        (Some(_), Some(snap)) if rng.gen_ratio(1, 3) => Some((snap, false)),
        (Some(wal), _) => Some((wal, true)),
        (None, Some(snap)) => Some((snap, false)),
        (None, None) => None,
    };
    let Some((path, is_wal)) = target else {
        ctx.record(
            F::Corrupt,
            Phase::Start,
            Outcome::Skipped,
            json!({"node": node, "reason": "no WAL segment or snapshot file", "stopped": true}),
        );
        return Damaged {
            node: Some(node),
            file_name: String::new(),
        };
    };
    let file_name = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut value = json!({
        "node": node,
        "leader": leader,
        "file": file_name,
        "kind": if is_wal { "wal" } else { "snapshot" },
    });
    match damage(&path, is_wal, rng) {
        Ok(what) => {
            value["what"] = what;
            ctx.record(F::Corrupt, Phase::Start, Outcome::Installed, value);
        }
        Err(e) => {
            value["error"] = json!(format!("{e:#}"));
            ctx.record(F::Corrupt, Phase::Start, Outcome::Indeterminate, value);
        }
    }
    Damaged {
        node: Some(node),
        file_name,
    }
}

/// Restarts the node: recovered, or refused and rebuilt under a new id.
pub async fn heal(ctx: &Ctx, damaged: Damaged) -> anyhow::Result<()> {
    let Damaged {
        node: Some(node),
        file_name,
    } = damaged
    else {
        return Ok(());
    };
    let outcome = ctx.cluster.lock().await.restart_or_refuse(node).await;
    let mut value = json!({"node": node, "file": file_name});
    match outcome {
        Ok(StartOutcome::Ready) => {
            value["result"] = json!("recovered");
            ctx.record(F::Corrupt, Phase::Heal, Outcome::Installed, value);
        }
        Ok(StartOutcome::Refused { status, log_tail }) => {
            let named = !file_name.is_empty() && log_tail.contains(&file_name);
            value["named_file"] = json!(named);
            value["status"] = json!(status);
            value["log"] = json!(excerpt(&log_tail, &file_name));
            match rebuild(ctx, node).await {
                Ok(new_id) => {
                    value["result"] = json!("refused-rebuilt");
                    value["new_id"] = json!(new_id);
                    ctx.record(F::Corrupt, Phase::Heal, Outcome::Installed, value);
                }
                Err(e) => {
                    value["result"] = json!("refused-not-rebuilt");
                    value["error"] = json!(format!("{e:#}"));
                    super::membership::refresh_members(ctx).await;
                    ctx.record(F::Corrupt, Phase::Heal, Outcome::Indeterminate, value);
                }
            }
        }
        Err(e) => {
            value["result"] = json!("no-answer");
            value["error"] = json!(format!("{e:#}"));
            ctx.record(F::Corrupt, Phase::Heal, Outcome::Indeterminate, value);
        }
    }
    Ok(())
}

/// The part of a refusing node's log that says why: from the last line naming `file` (its
/// final error), or the last lines, at most [`LOG_EXCERPT_BYTES`].
pub(super) fn excerpt(log: &str, file: &str) -> String {
    let from = (!file.is_empty())
        .then(|| log.rfind(file))
        .flatten()
        .and_then(|i| log[..i].rfind('\n').map(|n| n + 1).or(Some(0)))
        .unwrap_or_else(|| log.len().saturating_sub(LOG_EXCERPT_BYTES));
    let mut start = from.min(log.len());
    while !log.is_char_boundary(start) {
        start += 1;
    }
    let mut end = (start + LOG_EXCERPT_BYTES).min(log.len());
    while !log.is_char_boundary(end) {
        end -= 1;
    }
    log[start..end].to_owned()
}

/// Rebuilds refused node `old` as docs/NODE_CLI.md says: remove it from the voters, wipe it,
/// add a new node under a new id as a learner and promote it. Returns the new id.
pub(super) async fn rebuild(ctx: &Ctx, old: u64) -> anyhow::Result<u64> {
    let voters: Vec<u64> = ctx.nodes().into_iter().filter(|&n| n != old).collect();
    admin::set_voters(&ctx.probe, &voters).await?;
    ctx.set_members(voters.clone());
    let new_id = ctx
        .take_spare()
        .ok_or_else(|| anyhow::anyhow!("no spare node id left"))?;
    let addr = {
        let mut cluster = ctx.cluster.lock().await;
        cluster.wipe(old)?;
        cluster.start_new(new_id).await?;
        cluster
            .addr(new_id)
            .map(str::to_owned)
            .ok_or_else(|| anyhow::anyhow!("no address for node {new_id}"))?
    };
    admin::add_learner(&ctx.probe, new_id, &addr).await?;
    let mut voters = voters;
    voters.push(new_id);
    admin::set_voters(&ctx.probe, &voters).await?;
    ctx.set_members(voters);
    Ok(new_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// A segment: header, two frames, preallocated zeros.
    /// A format-2 segment: an entry, a sync mark (empty body), another entry, then zeros.
    fn segment_v2() -> Vec<u8> {
        let mut bytes = vec![7u8; WAL_HEADER_LEN as usize];
        bytes[WAL_VERSION_AT..WAL_VERSION_AT + 4].copy_from_slice(&2u32.to_le_bytes());
        for body in [&b"first"[..], &b""[..], &b"second!"[..]] {
            let at = bytes.len() as u64;
            bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&[0xAB; 4]);
            bytes.extend_from_slice(&at.to_le_bytes());
            bytes.extend_from_slice(&16u64.to_le_bytes());
            bytes.extend_from_slice(body);
        }
        bytes.extend_from_slice(&[0u8; 64]);
        bytes
    }

    #[test]
    fn format_2_frames_end_where_a_header_stops_holding_its_offset() {
        let bytes = segment_v2();
        let (end, last) = wal_frames(&bytes).unwrap();
        // 16 header + (24 + 5) + 24 (the mark) = 69: the last frame, then its 24 + 7 bytes.
        assert_eq!(last, 16 + 24 + 5 + 24);
        assert_eq!(end, last + 24 + 7);
        let mut unknown = bytes.clone();
        unknown[WAL_VERSION_AT] = 9;
        assert_eq!(wal_frames(&unknown), None);
    }

    fn segment() -> Vec<u8> {
        let mut bytes = vec![7u8; WAL_HEADER_LEN as usize];
        bytes[WAL_VERSION_AT..WAL_VERSION_AT + 4].copy_from_slice(&1u32.to_le_bytes());
        for body in [&b"first"[..], &b"second!"[..]] {
            bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&[0xAB; 4]);
            bytes.extend_from_slice(body);
        }
        bytes.extend_from_slice(&[0u8; 64]);
        bytes
    }

    #[test]
    fn frames_end_before_the_preallocated_zeros() {
        let bytes = segment();
        let (end, last) = wal_frames(&bytes).unwrap();
        assert_eq!(last, 16 + 8 + 5);
        assert_eq!(end, last + 8 + 7);
        assert_eq!(wal_frames(&bytes[..16]), None);
    }

    #[test]
    fn damage_changes_only_written_frames_or_cuts_inside_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0000000000000001.wal");
        let (end, last) = wal_frames(&segment()).unwrap();
        let mut rng = StdRng::seed_from_u64(3);
        let (mut flips, mut cuts) = (0, 0);
        for _ in 0..40 {
            std::fs::write(&path, segment()).unwrap();
            let what = damage(&path, true, &mut rng).unwrap();
            let after = std::fs::read(&path).unwrap();
            if what["damage"] == "truncate" {
                cuts += 1;
                let len = after.len() as u64;
                assert!(len > last && len < end, "{what}");
            } else {
                flips += 1;
                let original = segment();
                assert_eq!(after.len(), original.len());
                let changed: Vec<usize> = (0..after.len())
                    .filter(|&i| after[i] != original[i])
                    .collect();
                assert!(
                    changed
                        .iter()
                        .all(|&i| i as u64 >= WAL_HEADER_LEN && (i as u64) < end),
                    "{what} {changed:?}"
                );
            }
        }
        assert!(flips > 0 && cuts > 0);
        let log = "a 0000000000000001.wal cut\nb wal 0000000000000001.wal bad\nc";
        assert!(excerpt(log, "0000000000000001.wal").starts_with("b wal"));
    }
}
