//! The committed example traces are exactly what the commands in
//! `examples/traces/README.md` generate.

use anyhow::{Context, Result};
use clap::Parser;
use std::path::Path;
use tether_fleet::cli::trace::generate::Args;
use tether_fleet::generate::generate;
use tether_fleet::trace::{content_hash, read_trace};

#[derive(Parser)]
struct Cmd {
    #[command(flatten)]
    args: Args,
}

#[test]
fn examples_are_what_their_commands_generate() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("examples/traces/README.md"))?;
    let mut checked = 0;
    for line in readme.lines() {
        let Some(rest) = line.strip_prefix("tether trace generate ") else {
            continue;
        };
        let cmd = Cmd::try_parse_from(std::iter::once("generate").chain(rest.split_whitespace()))
            .with_context(|| format!("parsing `{line}`"))?;
        let want = content_hash(&generate(&cmd.args.options()?)?);
        let file = root.join(&cmd.args.output);
        let have = content_hash(&read_trace(&file)?);
        assert_eq!(
            have,
            want,
            "{} is not what `{line}` generates",
            file.display()
        );
        checked += 1;
    }
    assert_eq!(checked, 3);
    Ok(())
}
