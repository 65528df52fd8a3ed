//! Bootstrap templates (`${NAME}` / `${NAME:-default}`): the code lives in
//! `tether_envoy::template`, shared with `tether gateway`; this keeps the
//! harness's error type.

use crate::HarnessError;
use std::collections::BTreeMap;
pub use tether_envoy::template::yaml_string;

/// [`tether_envoy::template::render`], failing with [`HarnessError::Unresolved`].
pub fn render(text: &str, vars: &BTreeMap<String, String>) -> Result<String, HarnessError> {
    tether_envoy::template::render(text, vars).map_err(|u| HarnessError::Unresolved(u.0))
}
