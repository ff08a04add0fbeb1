//! What the CEL and policy harnesses share: a crate that includes either
//! declares this file as its module `common`.

/// Cost budget of one evaluation: smaller than the daemon's (10,000,000)
/// so a costly input stays one quick test; exhausting it is the same path,
/// reached sooner.
pub const BUDGET: u64 = 200_000;

/// An internal's word, without the punctuation a message puts around it
/// (`Context` of "Context`!"): an input spelling the word may see it quoted.
pub fn core(internal: &str) -> &str {
    internal.trim_matches(|c: char| !c.is_alphanumeric())
}
