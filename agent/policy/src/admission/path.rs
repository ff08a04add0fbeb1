//! Field paths as the API server writes them: `spec.behaviors[0].exec`.

use super::{ErrorKind, FieldError};
use serde_json::Value as Json;
use std::fmt;

#[derive(Clone, Debug)]
enum Segment {
    Key(String),
    Index(usize),
}

/// A path into the object being reviewed, built as the walk descends.
#[derive(Clone, Debug, Default)]
pub(crate) struct FieldPath(Vec<Segment>);

impl FieldPath {
    /// The object itself.
    pub(crate) fn root() -> Self {
        FieldPath(Vec::new())
    }

    /// A path from its dotted segments (`["spec", "mode"]`).
    pub(crate) fn of(keys: &[&str]) -> Self {
        FieldPath(keys.iter().map(|k| Segment::Key((*k).to_owned())).collect())
    }

    pub(crate) fn push_key(&mut self, k: &str) {
        self.0.push(Segment::Key(k.to_owned()));
    }

    pub(crate) fn push_index(&mut self, i: usize) {
        self.0.push(Segment::Index(i));
    }

    pub(crate) fn pop(&mut self) {
        self.0.pop();
    }

    /// This path with `k` appended.
    pub(crate) fn child(&self, k: &str) -> FieldPath {
        let mut p = self.clone();
        p.push_key(k);
        p
    }

    /// This path with `k` appended, as text.
    pub(crate) fn key(&self, k: &str) -> FieldPath {
        self.child(k)
    }

    /// An error of this kind at this path.
    pub(crate) fn error(&self, kind: ErrorKind) -> FieldError {
        FieldError {
            path: self.to_string(),
            kind,
        }
    }

    /// An `Invalid value` error at this path.
    pub(crate) fn invalid(&self, value: Option<Json>, detail: String) -> FieldError {
        self.error(ErrorKind::Invalid { value, detail })
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            match s {
                Segment::Key(k) if i == 0 => f.write_str(k)?,
                Segment::Key(k) => write!(f, ".{k}")?,
                Segment::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}
