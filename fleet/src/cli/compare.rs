//! `tether compare`: replay reports of one trace side by side — the
//! configuration keys that changed next to what each metric did.

use crate::report::compare::compare;
use crate::report::{Report, plot};
use anyhow::{Context, Result};
use clap::Args as ClapArgs;
use std::path::PathBuf;

/// `tether compare`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Reports (`report.json`, or the directory holding it); the first is the baseline.
    #[arg(required = true, num_args = 2..)]
    pub reports: Vec<PathBuf>,
    /// Also write the comparison (`compare.md`) and overlaid plots into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `report.json` itself, or inside a directory.
pub fn report_path(p: &std::path::Path) -> PathBuf {
    if p.is_dir() {
        p.join("report.json")
    } else {
        p.to_path_buf()
    }
}

/// Runs it.
pub fn run(a: Args) -> Result<()> {
    let reports: Vec<Report> = a
        .reports
        .iter()
        .map(|p| Report::read(&report_path(p)))
        .collect::<Result<_, _>>()?;
    let c = compare(&reports)?;
    let mut md = c.to_markdown();
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--out {}: cannot create", dir.display()))?;
        let refs: Vec<&Report> = reports.iter().collect();
        let plots = plot::write_all(&refs, dir)?;
        md.push_str("\nPlots:\n\n");
        for p in &plots {
            if let Some(n) = p.file_name() {
                md.push_str(&format!("![{0}]({0})\n", n.to_string_lossy()));
            }
        }
        std::fs::write(dir.join("compare.md"), &md)
            .with_context(|| format!("writing {}", dir.join("compare.md").display()))?;
    }
    print!("{md}");
    Ok(())
}
