//! Property tests: no trace reader or importer panics on any input; bad input
//! is an error naming its file (and line where there is one).

#[cfg(test)]
mod tests;
