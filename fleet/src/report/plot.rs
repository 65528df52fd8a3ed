//! SVG plots of one or more reports (plotters, SVG backend): TTFT CDF, hit
//! ratio over time (each beside its trace's ideal), per-engine load. Several
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

/// Writes `ttft_cdf.svg`, `hit_over_time.svg` and `load.svg` into `dir`; returns their paths.
pub fn write_all(reports: &[&Report], dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let files = [
        dir.join("ttft_cdf.svg"),
        dir.join("hit_over_time.svg"),
        dir.join("load.svg"),
    ];
    ttft_cdf(reports, &files[0]).map_err(err(&files[0]))?;
    hit_over_time(reports, &files[1]).map_err(err(&files[1]))?;
    load(reports, &files[2]).map_err(err(&files[2]))?;
    Ok(files.to_vec())
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
        .caption("Prefix-cache hit ratio over time", ("sans-serif", 18))
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
        let pts: Vec<(f64, f64)> = r
            .series
            .hit_over_time
            .iter()
            .filter(|b| b.prompt_tokens > 0)
            .map(|b| {
                (
                    b.t_s + r.series.bucket_s / 2.0,
                    100.0 * b.cached_tokens as f64 / b.prompt_tokens as f64,
                )
            })
            .collect();
        line(&mut chart, pts, c, 2, label(r))?;
    }
    if let Some(r) = reports.first() {
        let shared = 100.0 * r.hit_ratio.ideal_global;
        line(
            &mut chart,
            vec![(0.0, shared), (max_t, shared)],
            BLACK,
            2,
            format!("shared-cache ceiling {shared:.1} % (no placement serves more)"),
        )?;
        let session = 100.0 * r.hit_ratio.ideal_session;
        line(
            &mut chart,
            vec![(0.0, session), (max_t, session)],
            RGBColor(130, 130, 130),
            1,
            format!("session-affinity ceiling {session:.1} %"),
        )?;
    }
    draw_labels(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(|e| e.to_string())
}

fn load(reports: &[&Report], path: &Path) -> Result<(), String> {
    let root = SVGBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let engines = reports
        .iter()
        .map(|r| r.load.engines.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let shares: Vec<Vec<f64>> = reports
        .iter()
        .map(|r| {
            let total: u64 = r.load.engines.iter().map(|e| e.prompt_tokens).sum();
            r.load
                .engines
                .iter()
                .map(|e| 100.0 * e.prompt_tokens as f64 / total.max(1) as f64)
                .collect()
        })
        .collect();
    let max = shares.iter().flatten().fold(1.0f64, |a, &b| a.max(b)) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Prompt tokens per engine (share of the run)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0f64..engines as f64, 0f64..max)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("engine (sorted by name)")
        .y_desc("% of prompt tokens")
        .x_label_formatter(&|x| format!("{}", x.floor() as i64))
        .draw()
        .map_err(|e| e.to_string())?;
    let n = reports.len().max(1) as f64;
    for (i, (r, s)) in reports.iter().zip(&shares).enumerate() {
        let c = color(i);
        let w = 0.8 / n;
        chart
            .draw_series(s.iter().enumerate().map(|(e, &v)| {
                let x0 = e as f64 + 0.1 + w * i as f64;
                Rectangle::new([(x0, 0.0), (x0 + w, v)], c.filled())
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
    line(
        &mut chart,
        vec![(0.0, even), (engines as f64, even)],
        BLACK,
        1,
        "even share".to_owned(),
    )?;
    draw_labels(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(|e| e.to_string())
}
