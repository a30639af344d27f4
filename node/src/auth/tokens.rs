//! Bearer tokens: the file of hashed tokens (`--tokens-file`) and the lookup of a presented
//! token's principal (docs/SECURITY.md §2).
//!
//! The file holds one `<principal> sha256:<64 hex digits>` per line, the SHA-256 of the token;
//! blank lines and lines starting with `#` are skipped. The node never holds a token itself,
//! only its hash, so a copied file or a memory dump gives nobody a usable credential. A
//! presented token is hashed and compared with every entry in constant time, all entries every
//! time, so neither a match's position nor a near miss shows in the answer's timing.
//!
//! Owns parsing (with limits on the file's size, its lines and their count, and errors naming
//! `file:line`) and the lookup. Never logs or returns a token, nor a hash.

use std::path::Path;

use sha2::{Digest, Sha256};

use super::roles::check_principal;

/// Largest tokens file, in bytes: a line is at most a principal and 71 characters of hash, so
/// 1 MiB holds thousands of entries; a larger file is not a tokens file.
pub const TOKENS_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// Most entries in the tokens file. Every call with a token compares against all of them.
pub const TOKENS_MAX: usize = 4096;

/// Longest line of the tokens file, in bytes (a comment included): a principal at its limit
/// plus the hash, with room.
pub const TOKEN_LINE_BYTES_MAX: usize = lock_api::limits::PRINCIPAL_LEN_MAX + 128;

/// Longest token a client may present, in bytes. The node only hashes it, but an unbounded
/// header is still an unbounded hash per call; 4 KiB is far above any generated secret.
pub const TOKEN_BYTES_MAX: usize = 4096;

/// The prefix of a hash in the file: the algorithm is named so a later one can be added.
const HASH_PREFIX: &str = "sha256:";

/// A SHA-256 digest.
type Hash = [u8; 32];

/// The parsed tokens file: principal and token hash of every entry, in file order.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Tokens {
    entries: Vec<(String, Hash)>,
}

impl std::fmt::Debug for Tokens {
    /// Principals only: a hash is no one's business in a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("principals", &self.entries.len())
            .finish_non_exhaustive()
    }
}

impl Tokens {
    /// Reads and parses the tokens file at `path`. The error names the file and, for a bad
    /// entry, the line.
    pub fn load(path: &Path) -> Result<Tokens, String> {
        let shown = path.display();
        let size = std::fs::metadata(path)
            .map_err(|e| format!("tokens file {shown}: {e}"))?
            .len();
        if size > TOKENS_FILE_BYTES_MAX {
            return Err(format!(
                "tokens file {shown}: {size} bytes; the limit TOKENS_FILE_BYTES_MAX is \
                 {TOKENS_FILE_BYTES_MAX}"
            ));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("tokens file {shown}: {e}"))?;
        Tokens::parse(&text).map_err(|(line, reason)| format!("{shown}:{line}: {reason}"))
    }

    /// Parses the file's text; an error is `(line number, reason)`.
    pub fn parse(text: &str) -> Result<Tokens, (usize, String)> {
        let mut entries: Vec<(String, Hash)> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            if line.len() > TOKEN_LINE_BYTES_MAX {
                return Err((
                    number,
                    format!(
                        "the line is {} bytes; the limit TOKEN_LINE_BYTES_MAX is \
                         {TOKEN_LINE_BYTES_MAX}",
                        line.len()
                    ),
                ));
            }
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split_whitespace();
            let (Some(principal), Some(hash), None) = (fields.next(), fields.next(), fields.next())
            else {
                return Err((
                    number,
                    "expected `<principal> sha256:<64 hex digits>`".to_owned(),
                ));
            };
            check_principal(principal).map_err(|e| (number, e))?;
            let hash = parse_hash(hash).map_err(|e| (number, e))?;
            if entries.iter().any(|(_, h)| *h == hash) {
                // Two principals with one token: whoever presents it would be either.
                return Err((
                    number,
                    "this token hash is listed on an earlier line".to_owned(),
                ));
            }
            if entries.len() == TOKENS_MAX {
                return Err((
                    number,
                    format!("more than TOKENS_MAX = {TOKENS_MAX} entries"),
                ));
            }
            entries.push((principal.to_owned(), hash));
        }
        Ok(Tokens { entries })
    }

    /// The principal whose token `token` is, if any. Compares the token's hash with every
    /// entry, in constant time per entry and without stopping at a match.
    pub fn principal_of(&self, token: &str) -> Option<&str> {
        if token.len() > TOKEN_BYTES_MAX {
            return None;
        }
        let presented: Hash = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (principal, hash) in &self.entries {
            if equal_in_constant_time(&presented, hash) {
                found = Some(principal.as_str());
            }
        }
        found
    }

    /// How many entries the file holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the file holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The hash of `token` as a tokens-file line writes it: `sha256:<hex>` (for `lockd` users'
/// tooling and the tests).
pub fn hash_line(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{HASH_PREFIX}{hex}")
}

/// Parses `sha256:<64 hex digits>` (either case).
fn parse_hash(text: &str) -> Result<Hash, String> {
    let hex = text.strip_prefix(HASH_PREFIX).ok_or_else(|| {
        "the hash must start with `sha256:` (the SHA-256 of the token, in hex)".to_owned()
    })?;
    if hex.len() != 64 {
        return Err(format!(
            "the hash has {} hex digits; a SHA-256 has 64",
            hex.len()
        ));
    }
    let mut hash = [0u8; 32];
    for (i, pair) in hex.as_bytes().chunks_exact(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        match (digit(pair[0]), digit(pair[1])) {
            (Some(high), Some(low)) => hash[i] = (high << 4) | low,
            _ => return Err("the hash holds a character that is not a hex digit".to_owned()),
        }
    }
    Ok(hash)
}

/// `a == b`, taking the same time wherever they differ: every byte is looked at and the
/// differences are folded without a branch.
fn equal_in_constant_time(a: &Hash, b: &Hash) -> bool {
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // `black_box` keeps the optimiser from turning the fold back into an early exit.
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_maps_to_its_principal_and_nothing_else_does() {
        let text = format!(
            "# service accounts\n\nbilling {}\n  reports   {}  \n",
            hash_line("s3cret-billing"),
            hash_line("s3cret-reports")
                .to_uppercase()
                .replace("SHA256:", "sha256:")
        );
        let tokens = Tokens::parse(&text).expect("parses");
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens.principal_of("s3cret-billing"), Some("billing"));
        assert_eq!(tokens.principal_of("s3cret-reports"), Some("reports"));
        assert_eq!(tokens.principal_of("s3cret-billinG"), None);
        assert_eq!(tokens.principal_of(""), None);
        assert_eq!(tokens.principal_of(&"x".repeat(TOKEN_BYTES_MAX + 1)), None);
    }

    #[test]
    fn the_known_sha256_of_abc_is_what_a_line_holds() {
        assert_eq!(
            hash_line("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn bad_lines_are_refused_naming_the_line() {
        let good = hash_line("t");
        let cases = [
            ("alice\n".to_owned(), 1, "expected"),
            (format!("# c\nalice {good} extra\n"), 2, "expected"),
            (format!("alice md5:{}\n", "0".repeat(32)), 1, "sha256:"),
            ("alice sha256:abc\n".to_owned(), 1, "64"),
            (format!("alice sha256:{}\n", "g".repeat(64)), 1, "hex digit"),
            (format!("alice {good}\nbob {good}\n"), 2, "earlier line"),
            (
                format!("{} {good}\n", "p".repeat(300)),
                1,
                "PRINCIPAL_LEN_MAX",
            ),
            (
                format!("#{}\n", "c".repeat(TOKEN_LINE_BYTES_MAX)),
                1,
                "TOKEN_LINE_BYTES_MAX",
            ),
        ];
        for (text, line, says) in cases {
            let (at, reason) = Tokens::parse(&text).expect_err(&text);
            assert_eq!(at, line, "{text}: {reason}");
            assert!(reason.contains(says), "{text}: {reason}");
        }
    }

    #[test]
    fn the_file_is_bounded_in_entries_and_bytes() {
        let many: String = (0..=TOKENS_MAX)
            .map(|i| format!("p{i} {}\n", hash_line(&i.to_string())))
            .collect();
        let (line, reason) = Tokens::parse(&many).unwrap_err();
        assert_eq!(line, TOKENS_MAX + 1);
        assert!(reason.contains("TOKENS_MAX"), "{reason}");

        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("tokens");
        std::fs::write(&path, vec![b'#'; TOKENS_FILE_BYTES_MAX as usize + 1]).expect("write");
        let err = Tokens::load(&path).unwrap_err();
        assert!(err.contains("TOKENS_FILE_BYTES_MAX"), "{err}");
        std::fs::write(&path, format!("ok {}\nbad\n", hash_line("t"))).expect("write");
        let err = Tokens::load(&path).unwrap_err();
        assert!(
            err.ends_with("expected `<principal> sha256:<64 hex digits>`"),
            "{err}"
        );
        assert!(err.contains(&format!("{}:2:", path.display())), "{err}");
    }
}
