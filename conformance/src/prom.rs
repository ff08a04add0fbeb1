//! Reading the daemon's /metrics (the Prometheus text format, as
//! prometheus-client writes it): enough to find a series by name and
//! labels and sum its samples.

use std::collections::BTreeMap;

/// One sample: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// The samples of an exposition; comment lines and lines that cannot be
/// read are left out.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(sample).collect()
}

fn sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        None => (series.to_string(), BTreeMap::new()),
        Some((name, rest)) => (name.to_string(), labels(rest.strip_suffix('}')?)?),
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// `a="x",b="y"` (values with `\"`, `\\` and `\n` escapes).
fn labels(mut s: &str) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    while !s.is_empty() {
        let (key, rest) = s.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => return None,
                },
                '"' => {
                    end = Some(i);
                    break;
                }
                other => value.push(other),
            }
        }
        let end = end?;
        out.insert(key.trim().to_string(), value);
        s = rest[end + 1..].trim_start_matches(',');
    }
    Some(out)
}

/// The sum of the samples named `name` whose labels include `want`, and
/// how many there were.
pub fn sum(samples: &[Sample], name: &str, want: &BTreeMap<String, String>) -> (f64, usize) {
    samples
        .iter()
        .filter(|s| s.name == name && want.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .fold((0.0, 0), |(total, n), s| (total + s.value, n + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_found_by_labels_and_summed() {
        let text = "# HELP nirmata_runtime_findings_emitted Findings\n\
                    # TYPE nirmata_runtime_findings_emitted counter\n\
                    nirmata_runtime_findings_emitted_total{policy=\"a\",behavior=\"dns\"} 3\n\
                    nirmata_runtime_findings_emitted_total{policy=\"a\",behavior=\"exec\"} 2\n\
                    nirmata_runtime_findings_emitted_total{policy=\"b\\\"q\",behavior=\"dns\"} 5\n\
                    nirmata_runtime_attribution_misses_total 0\n\
                    # EOF\n";
        let s = parse(text);
        assert_eq!(s.len(), 4);
        let want = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            sum(
                &s,
                "nirmata_runtime_findings_emitted_total",
                &want(&[("policy", "a")])
            ),
            (5.0, 2)
        );
        assert_eq!(
            sum(
                &s,
                "nirmata_runtime_findings_emitted_total",
                &want(&[("policy", "b\"q")])
            ),
            (5.0, 1)
        );
        assert_eq!(
            sum(&s, "nirmata_runtime_attribution_misses_total", &want(&[])),
            (0.0, 1)
        );
        assert_eq!(sum(&s, "nope", &want(&[])), (0.0, 0));
    }
}
