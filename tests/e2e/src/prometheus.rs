//! Envoy's `/stats/prometheus` text, parsed into samples for assertions.

use std::collections::BTreeMap;

/// One sample line: `name{label="v",…} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// All samples of one scrape.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub samples: Vec<Sample>,
}

impl Metrics {
    /// Parses the Prometheus text format (comments and malformed lines skipped).
    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(parse_line)
            .collect();
        Self { samples }
    }

    /// Samples whose metric name contains `needle`.
    pub fn matching<'a>(&'a self, needle: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name.contains(needle))
    }

    /// Sum of every sample whose name contains `needle` (0 if none).
    pub fn sum(&self, needle: &str) -> f64 {
        self.matching(needle).map(|s| s.value).sum()
    }

    /// The value of the sample named exactly `name` with exactly these labels.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
    }

    /// Distinct metric names, for error messages.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.samples.iter().map(|s| s.name.as_str()).collect();
        v.dedup();
        v
    }
}

fn parse_line(line: &str) -> Option<Sample> {
    let (series, value) = line.rsplit_once(' ')?;
    let value = value.trim().parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((n, rest)) => (n, parse_labels(rest.strip_suffix('}')?)),
        None => (series, BTreeMap::new()),
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

fn parse_labels(mut s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    while let Some((k, rest)) = s.split_once("=\"") {
        let mut val = String::new();
        let mut chars = rest.char_indices();
        let mut end = rest.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        val.push(if n == 'n' { '\n' } else { n });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => val.push(c),
            }
        }
        out.insert(k.trim_start_matches(',').trim().to_owned(), val);
        s = &rest[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_envoy_style_lines() {
        let text = "# TYPE envoy_x counter\nenvoy_x{envoy_cluster_name=\"ranks\",r=\"a\\\"b\"} 7\nenvoy_y 3.5\nbad line\n";
        let m = Metrics::parse(text);
        assert_eq!(m.samples.len(), 2);
        assert_eq!(
            m.get("envoy_x", &[("envoy_cluster_name", "ranks"), ("r", "a\"b")]),
            Some(7.0)
        );
        assert_eq!(m.get("envoy_y", &[]), Some(3.5));
        assert_eq!(m.sum("envoy_"), 10.5);
    }
}
