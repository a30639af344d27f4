//! Finding a line, and a field of it, in a node's log text ([`crate::Cluster::log_since`]):
//! lockd logs one event a line, `message key=value …` in its human format.

/// The first line of `log` that contains every one of `parts`.
pub fn line_with<'l>(log: &'l str, parts: &[&str]) -> Option<&'l str> {
    log.lines()
        .find(|line| parts.iter().all(|p| line.contains(p)))
}

/// The value of field `name` in a log `line` (`name=value`, up to the next space), if it has it.
pub fn field<'l>(line: &'l str, name: &str) -> Option<&'l str> {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_found_by_all_its_parts_and_a_field_by_its_whole_name() {
        let log = "INFO a: started index=1\nINFO b: snapshot built index=42 took_ms=3\n";
        let line = line_with(log, &["snapshot", "built"]).expect("the second line");
        assert!(line.starts_with("INFO b"));
        assert_eq!(line_with(log, &["snapshot", "started"]), None);
        assert_eq!(field(line, "index"), Some("42"));
        assert_eq!(field(line, "took_ms"), Some("3"));
        assert_eq!(
            field(line, "took"),
            None,
            "a prefix of a name is not the name"
        );
        assert_eq!(field(line, "term"), None);
    }
}
