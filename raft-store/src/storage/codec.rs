//! The frame of every record the storage persists: log entries, the vote, the committed and
//! last-purged log ids, snapshot files and snapshot data.
//!
//! A record is `[format version: u8][crc32 of the payload: u32 little-endian][postcard payload]`.
//! The version byte lets a later release read (or refuse) an older layout; the checksum turns a
//! flipped bit on disk into an error instead of a silently different log. This module frames and
//! unframes bytes; it does no IO and must not panic on any input (bytes come off the disk or the
//! network).

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The format version this build writes for every record, and the only one it reads, except
/// snapshot data, which may also be a later version (see [`encode_as`]).
pub const FORMAT_VERSION: u8 = 1;

/// Bytes before the payload: version byte and checksum.
pub const HEADER_LEN: usize = 1 + 4;

/// Why a record could not be read. Carries no location: callers wrap it in
/// [`StorageError::Corrupt`](super::StorageError::Corrupt), which names the record and the file.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// Shorter than the header.
    #[error("record is {len} bytes, shorter than its {HEADER_LEN}-byte header")]
    Truncated {
        /// Bytes present.
        len: usize,
    },
    /// Written by a format this build does not read.
    #[error("format version {found}, which this build does not read for this record")]
    Version {
        /// The version byte found.
        found: u8,
    },
    /// The payload does not match its checksum.
    #[error("checksum mismatch: stored {stored:#010x}, payload hashes to {computed:#010x}")]
    Checksum {
        /// The checksum in the header.
        stored: u32,
        /// The checksum of the payload as read.
        computed: u32,
    },
    /// The checksum matched but the payload is not a value of the expected type.
    #[error("undecodable payload: {0}")]
    Payload(postcard::Error),
}

/// Frames `value` as a record of the current format version.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, postcard::Error> {
    encode_as(FORMAT_VERSION, value)
}

/// Frames `value` as a record of format `version`, for a record type whose payload changed
/// (snapshot data carrying its apply limits), so that a reader can tell the layouts apart and an
/// older build refuses the new one by its version instead of misreading it. A snapshot build
/// does not come here: it streams the same frame into its file (`SnapshotDir::write_table`).
pub fn encode_as<T: Serialize + ?Sized>(
    version: u8,
    value: &T,
) -> Result<Vec<u8>, postcard::Error> {
    let mut out = postcard::to_extend(value, vec![version, 0, 0, 0, 0])?;
    let crc = crc32fast::hash(&out[HEADER_LEN..]);
    out[1..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Checks a record's version and checksum and returns its payload.
pub fn verify(record: &[u8]) -> Result<&[u8], CodecError> {
    verify_versions(record, &[FORMAT_VERSION]).map(|(_, payload)| payload)
}

/// Checks a record's checksum and that its version is one of `accepted`, and returns the
/// version and the payload.
pub fn verify_versions<'r>(
    record: &'r [u8],
    accepted: &[u8],
) -> Result<(u8, &'r [u8]), CodecError> {
    let Some((header, payload)) = record.split_first_chunk::<HEADER_LEN>() else {
        return Err(CodecError::Truncated { len: record.len() });
    };
    let [version, crc @ ..] = *header;
    if !accepted.contains(&version) {
        return Err(CodecError::Version { found: version });
    }
    let stored = u32::from_le_bytes(crc);
    let computed = crc32fast::hash(payload);
    if stored != computed {
        return Err(CodecError::Checksum { stored, computed });
    }
    Ok((version, payload))
}

/// Verifies a record and decodes its payload as a `T`. Trailing bytes after the value are an
/// error: a record holds exactly one value.
pub fn decode<T: DeserializeOwned>(record: &[u8]) -> Result<T, CodecError> {
    decode_payload(verify(record)?)
}

/// Decodes a verified payload as exactly one `T` (trailing bytes are an error).
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, CodecError> {
    let (value, rest) = postcard::take_from_bytes(payload).map_err(CodecError::Payload)?;
    if !rest.is_empty() {
        return Err(CodecError::Payload(postcard::Error::DeserializeBadEncoding));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_frames_with_version_and_crc() {
        let value = (42u64, String::from("lock/a"), vec![1u8, 2, 3]);
        let record = encode(&value).expect("encode");
        assert_eq!(record[0], FORMAT_VERSION);
        let crc = u32::from_le_bytes(record[1..5].try_into().expect("4 bytes"));
        assert_eq!(crc, crc32fast::hash(&record[HEADER_LEN..]));
        assert_eq!(decode::<(u64, String, Vec<u8>)>(&record), Ok(value));
    }

    #[test]
    fn every_single_bit_flip_is_an_error_not_a_panic() {
        let record = encode(&(7u64, "session-1", Some(3u32))).expect("encode");
        for byte in 0..record.len() {
            for bit in 0..8 {
                let mut bad = record.clone();
                bad[byte] ^= 1 << bit;
                let result = decode::<(u64, String, Option<u32>)>(&bad);
                assert!(
                    result.is_err(),
                    "flip of byte {byte} bit {bit} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn short_records_wrong_versions_and_trailing_bytes_are_errors() {
        assert_eq!(decode::<u64>(&[]), Err(CodecError::Truncated { len: 0 }));
        assert_eq!(
            decode::<u64>(&[1, 2, 3]),
            Err(CodecError::Truncated { len: 3 })
        );
        let mut record = encode(&5u64).expect("encode");
        record[0] = FORMAT_VERSION + 1;
        assert_eq!(
            decode::<u64>(&record),
            Err(CodecError::Version {
                found: FORMAT_VERSION + 1
            })
        );

        let mut two = encode(&5u8).expect("encode");
        two.push(9);
        let crc = crc32fast::hash(&two[HEADER_LEN..]);
        two[1..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(decode::<u8>(&two), Err(CodecError::Payload(_))));
    }
}
