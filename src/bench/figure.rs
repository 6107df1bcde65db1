//! One benchmark figure and its `BENCH …` line (or JSON object).

use std::fmt;

/// A scenario's result with its parameters, printed as
/// `BENCH scenario=<name> k1=v1 k2=v2 …` (one line, no spaces inside values), or
/// as one JSON object by [`to_json`](Self::to_json).
///
/// Every store scenario starts with `engine=`, `keys=` and `workers=`, so lines
/// from different runs can be grepped and compared column by column.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    scenario: &'static str,
    fields: Vec<(&'static str, String)>,
}

impl Figure {
    /// A figure for `scenario` with no fields yet.
    #[must_use]
    pub fn new(scenario: &'static str) -> Self {
        Self {
            scenario,
            fields: Vec::new(),
        }
    }

    /// Adds `key=value`; values are printed with `Display`.
    #[must_use]
    pub fn with(mut self, key: &'static str, value: impl fmt::Display) -> Self {
        self.fields.push((key, value.to_string()));
        self
    }

    /// The scenario's name.
    #[must_use]
    pub fn scenario(&self) -> &'static str {
        self.scenario
    }

    /// The value printed for `key`, if the figure has it.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The figure as one JSON object: `{"scenario": …, "k1": v1, …}`, numbers as
    /// JSON numbers.
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        let mut object = serde_json::Map::new();
        object.insert("scenario".into(), self.scenario.into());
        for (key, value) in &self.fields {
            let json = match value.parse::<f64>() {
                Ok(n) if n.is_finite() => serde_json::Number::from_f64(n)
                    .map_or_else(|| value.clone().into(), serde_json::Value::Number),
                _ => value.clone().into(),
            };
            let json = match value.parse::<i64>() {
                Ok(n) => n.into(),
                Err(_) => json,
            };
            object.insert((*key).into(), json);
        }
        serde_json::Value::Object(object)
    }
}

impl fmt::Display for Figure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BENCH scenario={}", self.scenario)?;
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
        let line = Figure::new("queue")
            .with("workers", 4)
            .with("ratio", "0.71");
        assert_eq!(
            line.to_string(),
            "BENCH scenario=queue workers=4 ratio=0.71"
        );
    }

    #[test]
    fn a_figure_prints_as_one_json_object_with_numbers() {
        let json = Figure::new("enqueue")
            .with("engine", "sqlite")
            .with("keys", 10)
            .with("keys_per_s", "12.5")
            .to_json();
        assert_eq!(
            json,
            serde_json::json!({
                "scenario": "enqueue", "engine": "sqlite", "keys": 10, "keys_per_s": 12.5
            })
        );
    }
}
