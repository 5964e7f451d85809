//! The report: one row per measurement, its anchor and their ratio, printed as it runs and written
//! as a Markdown table.

use std::collections::HashMap;
use std::fmt::Write as _;

pub(crate) type Anchors = HashMap<String, f64>;

/// One line of the report.
pub(crate) struct Row {
    pub(crate) section: &'static str,
    pub(crate) what: String,
    pub(crate) gpumem: f64,
    pub(crate) anchor_name: String,
    pub(crate) anchor: Option<f64>,
    pub(crate) unit: &'static str,
    /// Whether lower is better (times, ratios of memory) or higher (rates).
    pub(crate) lower_is_better: bool,
}

impl Row {
    pub(crate) fn ratio(&self) -> Option<f64> {
        let a = self.anchor?;
        Some(if self.lower_is_better { a / self.gpumem } else { self.gpumem / a })
    }
}

pub(crate) struct Report {
    pub(crate) rows: Vec<Row>,
    pub(crate) anchors: Anchors,
}

impl Report {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add(
        &mut self,
        section: &'static str,
        what: impl Into<String>,
        gpumem: f64,
        anchor_name: impl Into<String>,
        anchor: Option<f64>,
        unit: &'static str,
        lower_is_better: bool,
    ) {
        let row = Row {
            section,
            what: what.into(),
            gpumem,
            anchor_name: anchor_name.into(),
            anchor,
            unit,
            lower_is_better,
        };
        eprintln!(
            "  {:<14} {:<44} gpumem {:>12.3} {:<5} {:<34} {:>12} {}",
            row.section,
            row.what,
            row.gpumem,
            row.unit,
            row.anchor_name,
            row.anchor.map_or("-".into(), |a| format!("{a:.3}")),
            row.ratio().map_or("-".into(), |r| format!("x{r:.2}"))
        );
        self.rows.push(row);
    }

    pub(crate) fn external(&self, key: &str) -> Option<f64> {
        self.anchors.get(key).copied()
    }

    pub(crate) fn markdown(&self) -> String {
        let mut s = String::new();
        writeln!(s, "| section | measurement | gpumem | anchor | anchor's figure | gpumem's advantage |")
            .unwrap();
        writeln!(s, "| --- | --- | --- | --- | --- | --- |").unwrap();
        for r in &self.rows {
            writeln!(
                s,
                "| {} | {} | {} {} | {} | {} | {} |",
                r.section,
                r.what,
                fmt(r.gpumem),
                r.unit,
                r.anchor_name,
                r.anchor.map_or("-".into(), |a| format!("{} {}", fmt(a), r.unit)),
                r.ratio().map_or("-".into(), |x| format!("{x:.2}x"))
            )
            .unwrap();
        }
        s
    }
}

pub(crate) fn fmt(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}
