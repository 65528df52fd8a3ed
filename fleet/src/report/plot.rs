//! SVG plots of one or more reports (plotters, SVG backend): TTFT CDF, hit
//! ratio over time (beside the trace's ceilings), per-engine load, the hit
//! ratio per session. Several
//! reports of one trace draw as one series each, so a comparison reads at a glance.

use super::model::Report;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

const W: u32 = 720;
const H: u32 = 420;
const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// A plot that could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("plot {path}: {why}")]
pub struct PlotError {
    /// The file.
    pub path: String,
    /// Why.
    pub why: String,
}

fn err(path: &Path) -> impl Fn(String) -> PlotError + '_ {
    move |why| PlotError {
        path: path.display().to_string(),
        why,
    }
}

/// Writes `ttft_cdf.svg`, `hit_over_time.svg`, `load.svg` and
/// `session_hits.svg` into `dir`; returns their paths.
pub fn write_all(reports: &[&Report], dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let files = [
        dir.join("ttft_cdf.svg"),
        dir.join("hit_over_time.svg"),
        dir.join("load.svg"),
        dir.join("session_hits.svg"),
    ];
    ttft_cdf(reports, &files[0]).map_err(err(&files[0]))?;
    hit_over_time(reports, &files[1]).map_err(err(&files[1]))?;
    load(reports, &files[2]).map_err(err(&files[2]))?;
    session_hits(reports, &files[3]).map_err(err(&files[3]))?;
    Ok(files.to_vec())
}

/// The CDF of the per-session hit ratio: how many sessions kept their cache
/// (a fleet's average hides the sessions it served badly).
fn session_hits(reports: &[&Report], path: &Path) -> Result<(), String> {
    let root = SVGBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Hit ratio per session (CDF over sessions)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0f64..100f64, 0f64..1f64)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("session's cached / prompt tokens, %")
        .y_desc("fraction of sessions")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, r) in reports.iter().enumerate() {
        let v = &r.series.session_hit_ratios;
        let n = v.len().max(1) as f64;
        // A step per session: at its ratio the fraction rises by 1 / n.
        let mut pts = vec![(0.0, 0.0)];
        for (k, &h) in v.iter().enumerate() {
            pts.push((100.0 * h, k as f64 / n));
            pts.push((100.0 * h, (k + 1) as f64 / n));
        }
        pts.push((100.0, if v.is_empty() { 0.0 } else { 1.0 }));
        line(&mut chart, pts, color(i), 2, label(r))?;
    }
    draw_labels(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(|e| e.to_string())
}

fn label(r: &Report) -> String {
    if r.run.label.is_empty() {
        r.config.hash.clone()
    } else {
        r.run.label.clone()
    }
}

type Chart<'a, X, Y> = ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>;

/// A line with its legend entry.
fn line<X, Y>(
    chart: &mut Chart<'_, X, Y>,
    pts: Vec<(f64, f64)>,
    c: RGBColor,
    width: u32,
    name: String,
) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .draw_series(LineSeries::new(pts, c.stroke_width(width)))
        .map_err(|e| e.to_string())?
        .label(name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(width)));
    Ok(())
}

/// The legend box.
fn draw_labels<X, Y>(chart: &mut Chart<'_, X, Y>, pos: SeriesLabelPosition) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

fn ttft_cdf(reports: &[&Report], path: &Path) -> Result<(), String> {
    let root = SVGBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let max = reports
        .iter()
        .flat_map(|r| r.series.ttft_cdf.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let clock = reports.first().map_or("", |r| r.run.clock.as_str());
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("TTFT CDF ({clock} ms)"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d((0.01f64..max * 1.05).log_scale(), 0f64..1f64)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("time to first token, ms (log)")
        .y_desc("fraction of requests")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, r) in reports.iter().enumerate() {
        let c = color(i);
        let pts: Vec<(f64, f64)> = r
            .series
            .ttft_cdf
            .iter()
            .map(|&(x, y)| (x.max(0.01), y))
            .collect();
        line(&mut chart, pts, c, 2, label(r))?;
    }
    draw_labels(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(|e| e.to_string())
}

/// Buckets in the hit-over-time window: a single bucket swings with the few
/// long prompts that land in it; five read as a trend.
const WINDOW: usize = 5;

/// Hit ratio over a centred window of `w` buckets, token-weighted (Σ cached ÷
/// Σ prompt), at each bucket that holds prompts.
fn windowed_hits(buckets: &[super::model::Bucket], bucket_s: f64, w: usize) -> Vec<(f64, f64)> {
    let half = w / 2;
    buckets
        .iter()
        .enumerate()
        .filter(|(_, b)| b.prompt_tokens > 0)
        .map(|(i, b)| {
            let lo = i.saturating_sub(half);
            let hi = (i + half + 1).min(buckets.len());
            let (c, p) = buckets
                .get(lo..hi)
                .unwrap_or_default()
                .iter()
                .fold((0u64, 0u64), |(c, p), b| {
                    (c + b.cached_tokens, p + b.prompt_tokens)
                });
            (b.t_s + bucket_s / 2.0, 100.0 * c as f64 / p.max(1) as f64)
        })
        .collect()
}

fn hit_over_time(reports: &[&Report], path: &Path) -> Result<(), String> {
    let root = SVGBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let max_t = reports
        .iter()
        .flat_map(|r| {
            r.series
                .hit_over_time
                .iter()
                .map(|b| b.t_s + r.series.bucket_s)
        })
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Prefix-cache hit ratio over time ({WINDOW}-bucket window)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0f64..max_t, 0f64..100f64)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("trace time, s")
        .y_desc("cached / prompt tokens, %")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, r) in reports.iter().enumerate() {
        let c = color(i);
        let pts = windowed_hits(&r.series.hit_over_time, r.series.bucket_s, WINDOW);
        line(&mut chart, pts, c, 2, label(r))?;
    }
    if let Some(r) = reports.first() {
        let shared = 100.0 * r.hit_ratio.ideal_global;
        line(
            &mut chart,
            vec![(0.0, shared), (max_t, shared)],
            BLACK,
            2,
            format!("shared-cache ceiling {shared:.1} % over the run (no placement serves more)"),
        )?;
        let session = 100.0 * r.hit_ratio.ideal_session;
        line(
            &mut chart,
            vec![(0.0, session), (max_t, session)],
            RGBColor(110, 110, 110),
            2,
            format!("session-affinity ceiling {session:.1} % over the run"),
        )?;
    }
    draw_labels(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(|e| e.to_string())
}

fn load(reports: &[&Report], path: &Path) -> Result<(), String> {
    let root = SVGBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    // Engines by name across the reports (a run may miss one the other used).
    let mut names: Vec<String> = reports
        .iter()
        .flat_map(|r| r.load.engines.iter().map(|e| e.engine.clone()))
        .collect();
    names.sort();
    names.dedup();
    let engines = names.len().max(1);
    let shares: Vec<Vec<f64>> = reports
        .iter()
        .map(|r| {
            let total: u64 = r.load.engines.iter().map(|e| e.prompt_tokens).sum();
            names
                .iter()
                .map(|n| {
                    let t = r.load.engines.iter().find(|e| &e.engine == n);
                    100.0 * t.map_or(0, |e| e.prompt_tokens) as f64 / total.max(1) as f64
                })
                .collect()
        })
        .collect();
    // One segment per bar and a spacer per engine; headroom above the tallest
    // bar for the legend (one line per report plus the even share).
    let per = reports.len().max(1) + 1;
    let legend_lines = reports.len() + 1;
    let tallest = shares.iter().flatten().fold(1.0f64, |a, &b| a.max(b));
    let max = tallest * (1.1 + 0.09 * legend_lines as f64);
    // No spacer after the last group.
    let segments = (engines * per - 1) as i32;
    let label_of = |v: &SegmentValue<i32>| -> String {
        match v {
            SegmentValue::CenterOf(x) | SegmentValue::Exact(x) => {
                let x = *x as usize;
                // Under the middle bar of each engine's group.
                if x % per == (per - 1) / 2 {
                    short_engine(names.get(x / per).map_or("", String::as_str))
                } else {
                    String::new()
                }
            }
            SegmentValue::Last => String::new(),
        }
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Prompt tokens per engine (share of the run)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(48)
        .build_cartesian_2d((0..segments).into_segmented(), 0f64..max)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(segments as usize)
        .x_desc("engine")
        .y_desc("% of prompt tokens")
        .x_label_formatter(&label_of)
        .x_label_style(("sans-serif", 11))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (r, s)) in reports.iter().zip(&shares).enumerate() {
        let c = color(i);
        chart
            .draw_series(s.iter().enumerate().map(|(e, &v)| {
                let x = (e * per + i) as i32;
                Rectangle::new(
                    [
                        (SegmentValue::Exact(x), 0.0),
                        (SegmentValue::Exact(x + 1), v),
                    ],
                    c.filled(),
                )
            }))
            .map_err(|e| e.to_string())?
            .label(format!(
                "{} (max/mean {})",
                label(r),
                r.load
                    .max_over_mean_prompt_tokens
                    .map_or("-".to_owned(), |v| format!("{v:.2}"))
            ))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
    }
    let even = 100.0 / engines as f64;
    chart
        .draw_series(LineSeries::new(
            [
                (SegmentValue::Exact(0), even),
                (SegmentValue::Exact(segments), even),
            ],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| e.to_string())?
        .label("even share".to_owned())
        .legend(|(x, y)| PathElement::new([(x, y), (x + 14, y)], BLACK));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// An engine's name as an axis label: `127.x.x.x:port#dp` loses the loopback
/// IP, which every test and demo rank shares (the port and DP rank tell them apart).
fn short_engine(name: &str) -> String {
    match name.rsplit_once(':') {
        Some((host, rest)) if host.starts_with("127.") || host == "localhost" => format!(":{rest}"),
        _ => name.to_owned(),
    }
}
