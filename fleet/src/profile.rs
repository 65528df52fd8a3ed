//! GPU profiles as the fleet tools read them: tether's JSON
//! (`tether_rank::profile`, `docs/profile.md`), chosen by file name.

use std::path::Path;
use tether_rank::profile::{Profile, ProfileError};

/// Reads the profile at `path`.
pub fn load(path: &Path) -> Result<Profile, ProfileError> {
    Profile::from_file(path)
}
