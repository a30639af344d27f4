//! `docs/NODE_CLI.md` documents every flag and environment variable the `lockd` binary offers:
//! each `--flag` that `lockd --help`, `lockd run --help` or `lockd dev --help` prints, and each
//! `LOCKD_*` variable clap lists as `[env: …]`, must occur in the document as a whole word.
//! Other engineers' harnesses start nodes from that page, so a flag added without documenting
//! it fails here, naming every missing one.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const LOCKD: &str = env!("CARGO_BIN_EXE_lockd");

/// The page, relative to this crate (`node/`).
const DOC: &str = "../docs/NODE_CLI.md";

/// The help text of `lockd <args>`, run with an empty environment so that no `LOCKD_*` value
/// of the caller's shell shows up in it (clap prints `[env: NAME=value]`).
fn help(args: &[&str]) -> String {
    let out = Command::new(LOCKD)
        .args(args)
        .env_clear()
        .output()
        .expect("lockd runs");
    assert!(
        out.status.success(),
        "lockd {args:?} exited with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

fn doc() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DOC);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// Every maximal run of word characters in `text` that starts with `prefix` and has at least
/// one character after it, e.g. `--node-id` for prefix `--`.
fn words_with_prefix(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        let after = &rest[at..];
        let len = after
            .find(|c: char| !is_word_char(c))
            .unwrap_or(after.len());
        let word = &after[..len];
        // `---` or a prefix inside a longer word is not a flag or variable name.
        let starts_a_word = before.is_none_or(|c| !is_word_char(c));
        if starts_a_word && word.len() > prefix.len() && !word[prefix.len()..].starts_with('-') {
            found.insert(word.trim_end_matches(['-', '_']).to_owned());
        }
        rest = &after[len.max(prefix.len())..];
    }
    found
}

/// The flags (`--name`) printed by the help of `lockd <args>`.
fn flags(args: &[&str]) -> BTreeSet<String> {
    words_with_prefix(&help(args), "--")
}

/// The environment variables clap lists as `[env: LOCKD_NAME=…]` in the help of `lockd <args>`.
fn env_vars(args: &[&str]) -> BTreeSet<String> {
    let text = help(args);
    let mut found = BTreeSet::new();
    for part in text.split("[env: ").skip(1) {
        let name: String = part
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        found.insert(name);
    }
    found
}

/// The names of `wanted` that do not occur in `doc` as a whole word.
fn missing(doc: &str, wanted: &BTreeSet<String>) -> Vec<String> {
    let prefix_of = |name: &str| {
        if name.starts_with("--") {
            "--"
        } else {
            "LOCKD_"
        }
    };
    wanted
        .iter()
        .filter(|name| !words_with_prefix(doc, prefix_of(name)).contains(*name))
        .cloned()
        .collect()
}

#[test]
fn the_word_scanner_finds_whole_flags_only() {
    let text = "Use --node-id <ID>, `--peers` and --bootstrap[=true]; not a---b, x--y or ---.";
    let found: Vec<String> = words_with_prefix(text, "--").into_iter().collect();
    assert_eq!(found, ["--bootstrap", "--node-id", "--peers"]);
    let found: Vec<String> = words_with_prefix("[env: LOCKD_NODE_ID=] XLOCKD_NO", "LOCKD_")
        .into_iter()
        .collect();
    assert_eq!(found, ["LOCKD_NODE_ID"]);
    // A documented longer flag does not count for a shorter one.
    let wanted: BTreeSet<String> = ["--log".to_owned()].into();
    assert_eq!(missing("--log-format", &wanted), ["--log"]);
}

#[test]
fn the_help_lists_what_this_test_expects_to_check() {
    // If clap's help format changed so that nothing is found, every other check here would
    // pass vacuously; these few flags and variables must be seen.
    let run = flags(&["run", "--help"]);
    for flag in [
        "--node-id",
        "--listen",
        "--data-dir",
        "--peers",
        "--bootstrap",
    ] {
        assert!(
            run.contains(flag),
            "`lockd run --help` lost {flag}: {run:?}"
        );
    }
    assert!(env_vars(&["run", "--help"]).contains("LOCKD_NODE_ID"));
    assert!(flags(&["dev", "--help"]).contains("--base-port"));
}

#[test]
fn every_flag_of_the_help_is_in_node_cli_md() {
    let doc = doc();
    let mut report = Vec::new();
    for args in [&["--help"][..], &["run", "--help"], &["dev", "--help"]] {
        let gaps = missing(&doc, &flags(args));
        if !gaps.is_empty() {
            report.push(format!("`lockd {}`: {}", args.join(" "), gaps.join(", ")));
        }
    }
    assert!(
        report.is_empty(),
        "flags missing from docs/NODE_CLI.md:\n{}",
        report.join("\n")
    );
}

#[test]
fn every_environment_variable_of_the_help_is_in_node_cli_md() {
    let doc = doc();
    let mut report = Vec::new();
    for args in [&["run", "--help"][..], &["dev", "--help"]] {
        let gaps = missing(&doc, &env_vars(args));
        if !gaps.is_empty() {
            report.push(format!("`lockd {}`: {}", args.join(" "), gaps.join(", ")));
        }
    }
    assert!(
        report.is_empty(),
        "environment variables missing from docs/NODE_CLI.md:\n{}",
        report.join("\n")
    );
}
