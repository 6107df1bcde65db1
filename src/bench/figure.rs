//! One benchmark figure and its `BENCH …` line.

use std::fmt;

/// A named figure with its parameters and results, printed as
/// `BENCH name=<name> k1=v1 k2=v2 …` (one line, no spaces inside values).
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    name: &'static str,
    fields: Vec<(&'static str, String)>,
}

impl Figure {
    /// A figure called `name` with no fields yet.
    #[must_use]
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            fields: Vec::new(),
        }
    }

    /// Adds `key=value`; values are printed with `Display`.
    #[must_use]
    pub fn with(mut self, key: &'static str, value: impl fmt::Display) -> Self {
        self.fields.push((key, value.to_string()));
        self
    }
}

impl fmt::Display for Figure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BENCH name={}", self.name)?;
        for (key, value) in &self.fields {
            write!(f, " {key}={value}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Figure;

    #[test]
    fn a_figure_prints_as_one_bench_line() {
        let line = Figure::new("queue_cycle")
            .with("workers", 4)
            .with("ratio", "0.71");
        assert_eq!(
            line.to_string(),
            "BENCH name=queue_cycle workers=4 ratio=0.71"
        );
    }
}
