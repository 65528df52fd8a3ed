//! A name picked from a closed list — trace formats, routing policies, cache
//! modes, identity modes, APIs: one parser, one typed error that says what was
//! asked for and lists what is known.

/// A name that is none of the known ones.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{given}` (known: {known})")]
pub struct UnknownName {
    /// What kind of name (`trace format`, `policy`, …).
    pub what: &'static str,
    /// The name as given.
    pub given: String,
    /// The known names, comma-separated.
    pub known: String,
}

/// The member of `all` whose `name` is `given` (exactly).
pub fn pick<T: Copy>(
    all: &[T],
    name: impl Fn(T) -> &'static str,
    given: &str,
    what: &'static str,
) -> Result<T, UnknownName> {
    all.iter()
        .copied()
        .find(|&x| name(x) == given)
        .ok_or_else(|| UnknownName {
            what,
            given: given.to_owned(),
            known: all.iter().map(|&x| name(x)).collect::<Vec<_>>().join(", "),
        })
}

#[cfg(test)]
mod tests;
