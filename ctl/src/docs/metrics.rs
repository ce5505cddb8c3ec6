//! reference/metrics.md: every Prometheus metric of ringd and of the backup
//! sidecar, read from their real registries' text exposition, so a metric
//! registered there shows up here without editing the page.

use std::collections::BTreeSet;

use super::{cell, GENERATED};

/// One metric family of an exposition.
#[derive(Debug, PartialEq)]
pub(super) struct Family {
    /// As in the `# TYPE` line; counters' samples add `_total`.
    pub(super) name: String,
    pub(super) kind: String,
    pub(super) help: String,
    /// Label names of its samples, in order of first appearance (`le` of
    /// histogram buckets left out).
    pub(super) labels: Vec<String>,
    /// Whether any sample was exposed (without one, labels are unknown).
    pub(super) sampled: bool,
}

/// ringd's metrics with a sample in every family: each labelled family gets
/// an example value through the same calls ringd makes.
pub(super) fn ringd_exposition() -> String {
    let m = ringd::metrics::Metrics::new("m1");
    m.step("failover", "target", "Restoring", 1.0);
    m.finished("failover", "done");
    m.rpo("s1", 0, 1.0);
    m.may_lose("s1", Some(0), Some(1.0), Some(5.0));
    m.certificates(&[ringd::certs::CertificateStatus {
        owner: "ring".into(),
        name: "ca".into(),
        source: String::new(),
        not_after_unix: Some(0),
        serial: None,
        error: None,
    }]);
    m.encode()
}

/// The backup sidecar's metrics with a sample in every family.
pub(super) fn backup_exposition() -> String {
    let m = backup::metrics::Metrics::new("s1");
    m.full_stored(1, 1, 1);
    m.delta_stored(2, 1, 2);
    m.upload_failed("delta");
    m.encode(3)
}

/// The families of a Prometheus text exposition, in its order.
pub(super) fn parse(text: &str) -> Vec<Family> {
    let mut out: Vec<Family> = Vec::new();
    let mut help = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = rest
                .split_once(' ')
                .map(|(_, h)| h.to_string())
                .unwrap_or_default();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            out.push(Family {
                name: name.to_string(),
                kind: kind.to_string(),
                help: std::mem::take(&mut help),
                labels: Vec::new(),
                sampled: false,
            });
        } else if !line.starts_with('#') && !line.is_empty() {
            let Some(f) = out.last_mut() else { continue };
            f.sampled = true;
            let mut seen: BTreeSet<String> = f.labels.iter().cloned().collect();
            for l in label_names(line) {
                if l != "le" && seen.insert(l.clone()) {
                    f.labels.push(l);
                }
            }
        }
    }
    out
}

/// The label names of one sample line (`name{a="x",b="y"} 1`).
fn label_names(line: &str) -> Vec<String> {
    let Some((_, rest)) = line.split_once('{') else {
        return Vec::new();
    };
    let mut names = Vec::new();
    let mut in_value = false;
    let mut escaped = false;
    let mut name = String::new();
    for c in rest.chars() {
        if in_value {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_value = false,
                _ => {}
            }
            continue;
        }
        match c {
            '}' => break,
            '=' => names.push(std::mem::take(&mut name)),
            '"' => in_value = true,
            ',' | ' ' => {}
            _ => name.push(c),
        }
    }
    names
}

/// The sample names a family exposes.
fn sample_name(f: &Family) -> String {
    match f.kind.as_str() {
        "counter" => format!("`{}_total`", f.name),
        "histogram" => format!("`{0}_bucket`, `{0}_sum`, `{0}_count`", f.name),
        _ => format!("`{}`", f.name),
    }
}

fn table(out: &mut String, families: &[Family]) {
    out.push_str("| Metric | Type | Labels | Meaning |\n| --- | --- | --- | --- |\n");
    for f in families {
        let labels = f
            .labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ");
        out.push_str(&format!(
            "| {} | {} | {labels} | {} |\n",
            sample_name(f),
            f.kind,
            cell(&f.help)
        ));
    }
}

/// The page.
pub(super) fn page() -> anyhow::Result<String> {
    let mut out = format!(
        "# Metrics\n\n{GENERATED}\n\n\
         ## ringd\n\n\
         Every ringd serves these at `/metrics` on its `metricsListen` address \
         (a local ring: port `ports.base + 101 + i` for member i). Every sample \
         carries the label `member`.\n\n"
    );
    table(&mut out, &parse(&ringd_exposition()));
    out.push_str(
        "\n## Backup sidecar\n\n\
         `ringctl backup start --metrics-listen ADDR`, the continuous backup \
         of one shoot, serves these at `/metrics`; every sample carries the \
         label `shoot`.\n\n",
    );
    table(&mut out, &parse(&backup_exposition()));
    Ok(out)
}
