//! The `tether` command line, one module per subcommand (each exposes its
//! clap `Args` and a `run`); `src/bin/tether.rs` only dispatches. Every flag
//! is documented in `docs/cli.md`.

pub mod compare;
pub mod gateway;
pub mod input;
pub mod plan;
pub mod replay;
pub mod simulate;
pub mod trace;
