//! The chart AgentX and InferenceMAX report on: total tokens per GPU-second
//! against interactivity (output tokens per second per stream), one labelled
//! point per run, as a self-contained SVG (a few lines of markup; no plotting
//! crate needed for one scatter).

use std::fmt::Write;

/// One point.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Label next to the point.
    pub label: String,
    /// Interactivity, output tokens/s per stream.
    pub x: f64,
    /// Total tokens per GPU-second.
    pub y: f64,
}

fn nice_max(v: f64) -> f64 {
    if v.is_nan() || v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= v {
            return m * mag;
        }
    }
    10.0 * mag
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// An SVG scatter of `points` titled `title`.
pub fn svg(title: &str, points: &[Point]) -> String {
    let (w, h) = (760.0, 480.0);
    let (left, right, top, bottom) = (80.0, 200.0, 40.0, 60.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let xmax = nice_max(points.iter().map(|p| p.x).fold(0.0, f64::max) * 1.05);
    let ymax = nice_max(points.iter().map(|p| p.y).fold(0.0, f64::max) * 1.05);
    let sx = |x: f64| left + pw * (x / xmax).clamp(0.0, 1.0);
    let sy = |y: f64| top + ph * (1.0 - (y / ymax).clamp(0.0, 1.0));
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        left + pw / 2.0,
        escape(title)
    );
    for i in 0..=5 {
        let f = f64::from(i) / 5.0;
        let (x, y) = (sx(f * xmax), sy(f * ymax));
        let _ = writeln!(
            s,
            r##"<line x1="{x}" y1="{top}" x2="{x}" y2="{}" stroke="#eee"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            top + ph,
            top + ph + 16.0,
            trim(f * xmax)
        );
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y}" x2="{}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            y + 4.0,
            trim(f * ymax)
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">interactivity: output tokens/s per stream (1000 / TPOT ms)</text>"#,
        left + pw / 2.0,
        h - 18.0
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">total tokens / GPU-second</text>"#,
        top + ph / 2.0,
        top + ph / 2.0
    );
    const COLORS: [&str; 9] = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
        "#17becf",
    ];
    for (i, p) in points.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let (x, y) = (sx(p.x), sy(p.y));
        let _ = writeln!(
            s,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="5" fill="{c}"><title>{}: {:.1} tok/s/stream, {:.0} tok/GPU·s</title></circle>"#,
            escape(&p.label),
            p.x,
            p.y
        );
        let ly = top + 14.0 + 16.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<circle cx="{}" cy="{}" r="5" fill="{c}"/><text x="{}" y="{}">{}</text>"#,
            left + pw + 16.0,
            ly - 4.0,
            left + pw + 26.0,
            ly,
            escape(&p.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn trim(v: f64) -> String {
    if v >= 100.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_and_label_is_drawn_and_text_is_escaped() {
        let pts = vec![
            Point {
                label: "tether / retention".into(),
                x: 80.0,
                y: 1200.0,
            },
            Point {
                label: "a<b & c".into(),
                x: 40.0,
                y: 3000.0,
            },
        ];
        let s = svg("t", &pts);
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert_eq!(s.matches("<circle").count(), 4);
        assert!(s.contains("a&lt;b &amp; c") && !s.contains("a<b"));
        // Nothing plotted outside the frame, even for no points or zeros.
        let empty = svg("none", &[]);
        assert!(empty.contains("</svg>"));
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(730.0), 1000.0);
        assert_eq!(nice_max(1.9), 2.0);
    }
}
