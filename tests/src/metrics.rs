//! Reading a node's metrics endpoint (issue 20): an HTTP/1.0 GET of `/metrics`, `/healthz` or
//! `/readyz`, and the scrape parsed by a real Prometheus text-format parser
//! (`prometheus-parse`), so tests ask for a sample by name and labels instead of matching
//! strings.
//!
//! Owns the request and the lookups; knows no family's meaning.

use std::time::Duration;

use prometheus_parse::{Sample, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one request to a metrics endpoint may take, connect to last byte.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest answer read: a scrape of a node is tens of KiB.
const ANSWER_BYTES_MAX: u64 = 8 * 1024 * 1024;

/// `GET base + path` over HTTP/1.0 (the server closes the connection after the answer):
/// the status code and the body. `base` is `http://host:port`.
pub async fn http_get(base: &str, path: &str) -> Result<(u16, String), String> {
    let host = base
        .strip_prefix("http://")
        .ok_or_else(|| format!("{base} is not an http:// URL"))?;
    let exchange = async {
        let mut stream = TcpStream::connect(host)
            .await
            .map_err(|e| format!("connect {host}: {e}"))?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
            .await
            .map_err(|e| format!("send to {host}: {e}"))?;
        let mut answer = Vec::new();
        stream
            .take(ANSWER_BYTES_MAX)
            .read_to_end(&mut answer)
            .await
            .map_err(|e| format!("read from {host}: {e}"))?;
        Ok::<_, String>(answer)
    };
    let answer = tokio::time::timeout(HTTP_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("GET {base}{path}: no answer within {HTTP_TIMEOUT:?}"))??;
    let text =
        String::from_utf8(answer).map_err(|e| format!("GET {base}{path}: not UTF-8: {e}"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("GET {base}{path}: no end of headers in {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("GET {base}{path}: no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// One parsed scrape of a node's `/metrics`.
#[derive(Debug)]
pub struct Scrape {
    parsed: prometheus_parse::Scrape,
    text: String,
}

impl Scrape {
    /// Scrapes `base` (`http://host:port`); an answer other than 200 is an error.
    pub async fn fetch(base: &str) -> Result<Scrape, String> {
        let (status, body) = http_get(base, "/metrics").await?;
        if status != 200 {
            return Err(format!("GET {base}/metrics answered {status}: {body}"));
        }
        Scrape::parse(body)
    }

    /// Parses a scrape's text.
    pub fn parse(text: String) -> Result<Scrape, String> {
        let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
            .map_err(|e| format!("the scrape does not parse: {e}"))?;
        Ok(Scrape { parsed, text })
    }

    /// The scrape as served.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The HELP text of `family` (the name in its `# HELP` line: a counter's without
    /// `_total`), if the scrape lists it.
    pub fn help(&self, family: &str) -> Option<&str> {
        self.parsed.docs.get(family).map(String::as_str)
    }

    /// Every sample named `name`.
    pub fn samples(&self, name: &str) -> impl Iterator<Item = &Sample> {
        self.parsed.samples.iter().filter(move |s| s.metric == name)
    }

    /// The value of the sample `name` whose labels include every `(label, value)` of `labels`
    /// (a histogram's `_count`, `_sum` are samples of their own). `None` if there is none.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples(name)
            .find(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .and_then(|s| match &s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(*v),
                Value::Histogram(_) | Value::Summary(_) => None,
            })
    }

    /// [`Scrape::value`], 0 when the sample is absent (a labelled counter not yet incremented).
    pub fn value_or_zero(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels).unwrap_or(0.0)
    }

    /// Whether any sample is named `name`.
    pub fn has_sample(&self, name: &str) -> bool {
        self.samples(name).next().is_some()
    }
}

/// `/readyz` of `base`: `Ok` on 200, else the status and the reason the node gave.
pub async fn readyz(base: &str) -> Result<(), String> {
    match http_get(base, "/readyz").await? {
        (200, _) => Ok(()),
        (status, body) => Err(format!("{status}: {}", body.trim())),
    }
}
