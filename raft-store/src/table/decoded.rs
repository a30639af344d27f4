//! Strings as a snapshot's decode reads them, with as few allocations as the table needs:
//! [`InlineStr`], a transient copy on the stack for a string only compared or looked up
//! (a map's key, a grant's session and owner ids), and [`SharedStr`], a string kept as the
//! `Arc<str>` the table stores, allocated once.
//!
//! Both read through `deserialize_string`, which hands the visitor a transient `&str`:
//! decoding from a stream (a snapshot read from its file, docs/DESIGN.md §3.2) must not borrow
//! from the input, which is gone once read. Serde's own `String` and `Arc<str>` cost one
//! allocation and two respectively for every string; at a million held locks the decode met
//! four million of them (bench/PERFORMANCE.md, session 15).

use std::fmt;
use std::sync::Arc;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer};

/// A decoded string, copied into a buffer on the stack when it is short (every key and id
/// within the default limits is), so that reading it costs no allocation.
// It lives on the decoder's stack for one entry: its size is the point.
#[allow(clippy::large_enum_variant)]
pub(crate) enum InlineStr {
    Inline { bytes: [u8; INLINE_MAX], len: usize },
    Owned(String),
}

/// The longest string an [`InlineStr`] holds without an allocation.
const INLINE_MAX: usize = 256;

impl InlineStr {
    /// The string.
    pub(crate) fn as_str(&self) -> &str {
        match self {
            // Only ever filled from a `&str` of `len` bytes.
            InlineStr::Inline { bytes, len } => {
                std::str::from_utf8(&bytes[..*len]).unwrap_or_default()
            }
            InlineStr::Owned(s) => s,
        }
    }
}

impl<'de> Deserialize<'de> for InlineStr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InlineVisitor;
        impl<'de> Visitor<'de> for InlineVisitor {
            type Value = InlineStr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<InlineStr, E> {
                if s.len() > INLINE_MAX {
                    return Ok(InlineStr::Owned(s.to_owned()));
                }
                let mut bytes = [0u8; INLINE_MAX];
                bytes[..s.len()].copy_from_slice(s.as_bytes());
                Ok(InlineStr::Inline {
                    bytes,
                    len: s.len(),
                })
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<InlineStr, E> {
                Ok(InlineStr::Owned(s))
            }
        }
        deserializer.deserialize_string(InlineVisitor)
    }
}

/// A decoded string as the `Arc<str>` the table keeps, allocated once: read as an
/// [`InlineStr`], then copied into its `Arc` (serde's `Arc<str>` reads a `String` first, then
/// copies it).
pub(crate) struct SharedStr(pub(crate) Arc<str>);

impl<'de> Deserialize<'de> for SharedStr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        InlineStr::deserialize(deserializer).map(|s| SharedStr(Arc::from(s.as_str())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both read what a `String` wrote, short or long, from bytes and from a stream.
    #[test]
    fn each_reads_what_a_string_wrote_from_bytes_and_from_a_stream() {
        for s in [
            "",
            "w5/held/0001/0002",
            &"k".repeat(INLINE_MAX),
            &"x".repeat(INLINE_MAX + 1),
        ] {
            let bytes = postcard::to_allocvec(&s.to_owned()).expect("encodes");
            let inline: InlineStr = postcard::from_bytes(&bytes).expect("decodes");
            assert_eq!(inline.as_str(), s);
            assert_eq!(
                matches!(inline, InlineStr::Inline { .. }),
                s.len() <= INLINE_MAX
            );
            let shared: SharedStr = postcard::from_bytes(&bytes).expect("decodes");
            assert_eq!(&*shared.0, s);
            let mut scratch = [0u8; 1024];
            let (streamed, _): (SharedStr, _) =
                postcard::from_io((bytes.as_slice(), &mut scratch)).expect("decodes");
            assert_eq!(&*streamed.0, s);
        }
    }

    /// A string cut short is an error, not a panic nor a shorter string.
    #[test]
    fn a_string_cut_short_is_an_error() {
        let bytes = postcard::to_allocvec(&7u64).expect("encodes");
        // Postcard's string is its length then the bytes: 7 announces bytes that are missing.
        assert!(postcard::from_bytes::<SharedStr>(&bytes).is_err());
        assert!(postcard::from_bytes::<InlineStr>(&bytes).is_err());
    }
}
