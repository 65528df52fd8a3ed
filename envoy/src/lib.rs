//! tether's Envoy bootstraps and their rendering.
//!
//! The YAML files beside this crate (`envoy/*.yaml`) are real Envoy
//! bootstraps with `${NAME}` / `${NAME:-default}` placeholders
//! (`docs/e2e.md`). This crate embeds them ([`bootstraps`]), fills
//! placeholders ([`template`], used by the end-to-end harness) and renders a
//! ready bootstrap for any list of ranks ([`render`], used by
//! `tether gateway`), so nobody fills placeholders by hand; and holds the
//! chain around the filter to the filter's `outputs` ([`outputs`]: check and
//! align the `header_mutation` entries and the header-path route); and writes
//! the filter module as an OCI image for Istio ([`oci`], `make oci`).

pub mod bootstraps;
pub mod oci;
pub mod outputs;
pub mod render;
pub mod template;

pub use render::{GatewaySpec, Mode, RenderError, Timeouts, render};
