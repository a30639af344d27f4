//! The paging of `AdminService.ListRevocations`: the page-size bounds and the page token,
//! shared by the server that issues and checks tokens and the client that follows them (and
//! treats them as opaque). Owns the numbers and the token's encoding only; it reads no log.
//!
//! # The page token
//!
//! A page ends at a record; the next page is every older record, newest first. "Older" is by
//! the record's `new_token_floor`, which is unique per revoke and only grows from one revoke to
//! the next, so the token names a position that no later revoke can shift: a revoke made while
//! a client pages has a higher floor than every record still to come, and neither repeats nor
//! hides one of them (an index into the log would shift by one on every new revoke).
//!
//! The token is 34 lowercase hex digits: a format byte, the last record's floor and a
//! fingerprint of the `key` filter it was issued for, so a token replayed with another filter
//! (whose position would mean something else) is refused, not silently misread. It is not a
//! secret and not signed: a forged token can only ask for a page the caller may read anyway.

use lock_api::LockError;
use lock_api::limits::{KEY_LEN_MAX, OPERATOR_LEN_MAX, OWNER_ID_LEN_MAX, REASON_LEN_MAX};

/// Records in a page when the request asks for none (`page_size == 0`).
pub const REVOCATIONS_PAGE_SIZE_DEFAULT: usize = 100;

/// Most records in one page; a larger `page_size` is served as this many (AIP-158's rule: a
/// size is a wish, not a contract).
///
/// The bound is the answer's size: a full page of records with every text at its limit must
/// stay well inside the client API's message limit (the node's `CLIENT_MESSAGE_BYTES_MAX`,
/// 1 MiB) — 256 of them are about 400 KiB.
pub const REVOCATIONS_PAGE_SIZE_MAX: usize = 256;

/// Upper bound of one encoded `RevocationRecord`: its texts at their limits, five varints of at
/// most 10 bytes, and at most 3 bytes of tag and length for each of the eight fields and the
/// record itself.
pub const REVOCATION_RECORD_BYTES_MAX: usize =
    KEY_LEN_MAX + OPERATOR_LEN_MAX + REASON_LEN_MAX + OWNER_ID_LEN_MAX + 5 * 10 + 9 * 3;

/// Upper bound of one full `ListRevocationsResponse` (the records and a page token).
pub const REVOCATIONS_PAGE_BYTES_MAX: usize =
    REVOCATIONS_PAGE_SIZE_MAX * REVOCATION_RECORD_BYTES_MAX + PAGE_TOKEN_LEN + 3;

const _: () = assert!(
    REVOCATIONS_PAGE_SIZE_DEFAULT > 0 && REVOCATIONS_PAGE_SIZE_DEFAULT <= REVOCATIONS_PAGE_SIZE_MAX
);

/// The format byte of the only token layout so far.
const PAGE_TOKEN_FORMAT: u8 = 1;

/// Bytes of a decoded token: format, floor (8), filter fingerprint (8).
const PAGE_TOKEN_BYTES: usize = 17;

/// Length of an encoded token: two hex digits per byte.
pub const PAGE_TOKEN_LEN: usize = 2 * PAGE_TOKEN_BYTES;

/// The page size to serve for a request's `page_size`: 0 is the default, anything above the
/// maximum is the maximum.
pub fn page_size(requested: u32) -> usize {
    match usize::try_from(requested) {
        Ok(0) => REVOCATIONS_PAGE_SIZE_DEFAULT,
        Ok(n) => n.min(REVOCATIONS_PAGE_SIZE_MAX),
        Err(_) => REVOCATIONS_PAGE_SIZE_MAX,
    }
}

/// A position in the audit log: the next page holds the records whose floor is below
/// `before_floor`, of the filter the token was issued for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageToken {
    /// The floor of the last record of the page before.
    pub before_floor: u64,
}

impl PageToken {
    /// The token that continues after the record with floor `before_floor`, for the listing
    /// filtered by `key` (empty: every key).
    pub fn encode(self, key: &str) -> String {
        let mut bytes = Vec::with_capacity(PAGE_TOKEN_BYTES);
        bytes.push(PAGE_TOKEN_FORMAT);
        bytes.extend_from_slice(&self.before_floor.to_be_bytes());
        bytes.extend_from_slice(&fingerprint(key).to_be_bytes());
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The position `token` names, if it is one [`PageToken::encode`] made for the filter
    /// `key`. An empty token is the first page (`Ok(None)`); anything else that is not such a
    /// token is `InvalidArgument`.
    pub fn decode(token: &str, key: &str) -> Result<Option<Self>, LockError> {
        if token.is_empty() {
            return Ok(None);
        }
        let invalid = || {
            LockError::invalid(
                "page_token is not a next_page_token this service issued for this key filter: \
                 pass the token of the page before with the same key, or none for the first page",
            )
        };
        if token.len() != PAGE_TOKEN_LEN || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid());
        }
        let bytes: Vec<u8> = (0..PAGE_TOKEN_BYTES)
            .map(|i| u8::from_str_radix(&token[2 * i..2 * i + 2], 16))
            .collect::<Result<_, _>>()
            .map_err(|_| invalid())?;
        let (format, rest) = bytes.split_first().ok_or_else(invalid)?;
        let (floor, print) = rest.split_at(8);
        let floor = u64::from_be_bytes(floor.try_into().map_err(|_| invalid())?);
        let print = u64::from_be_bytes(print.try_into().map_err(|_| invalid())?);
        // A floor of 0 is never a record's (every revoke burns a token first).
        if *format != PAGE_TOKEN_FORMAT || floor == 0 || print != fingerprint(key) {
            return Err(invalid());
        }
        Ok(Some(Self {
            before_floor: floor,
        }))
    }
}

/// FNV-1a (64-bit) of the filter: enough to tell one filter from another a client mixed up,
/// with no dependency (lock-proto stays on lock-api and the gRPC stack).
fn fingerprint(key: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    key.bytes()
        .fold(OFFSET, |hash, b| (hash ^ u64::from(b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_size_defaults_and_is_capped() {
        assert_eq!(page_size(0), REVOCATIONS_PAGE_SIZE_DEFAULT);
        assert_eq!(page_size(1), 1);
        assert_eq!(
            page_size(REVOCATIONS_PAGE_SIZE_MAX as u32),
            REVOCATIONS_PAGE_SIZE_MAX
        );
        assert_eq!(page_size(u32::MAX), REVOCATIONS_PAGE_SIZE_MAX);
    }

    #[test]
    fn a_token_round_trips_for_its_own_filter_only() {
        for key in ["", "payout/2026-11-30"] {
            let token = PageToken { before_floor: 42 }.encode(key);
            assert_eq!(token.len(), PAGE_TOKEN_LEN);
            assert_eq!(
                PageToken::decode(&token, key),
                Ok(Some(PageToken { before_floor: 42 }))
            );
        }
        let token = PageToken { before_floor: 42 }.encode("a");
        assert!(matches!(
            PageToken::decode(&token, "b"),
            Err(LockError::InvalidArgument { .. })
        ));
        assert!(matches!(
            PageToken::decode(&token, ""),
            Err(LockError::InvalidArgument { .. })
        ));
    }

    #[test]
    fn an_empty_token_is_the_first_page() {
        assert_eq!(PageToken::decode("", "k"), Ok(None));
    }

    #[test]
    fn a_malformed_token_is_invalid_argument_never_a_panic() {
        let good = PageToken { before_floor: 7 }.encode("");
        let mut wrong_format = good.clone();
        wrong_format.replace_range(0..2, "02");
        let zero_floor = PageToken { before_floor: 0 }.encode("");
        let bad = [
            "x".to_owned(),
            "not a token".to_owned(),
            good[..good.len() - 1].to_owned(),
            format!("{good}00"),
            good.replace(|c: char| c.is_ascii_digit(), "g"),
            // Multi-byte UTF-8 of the right byte length must not split a character.
            "é".repeat(PAGE_TOKEN_LEN / 2),
            wrong_format,
            zero_floor,
        ];
        for token in bad {
            assert!(
                matches!(
                    PageToken::decode(&token, ""),
                    Err(LockError::InvalidArgument { .. })
                ),
                "{token:?}"
            );
        }
    }
}
