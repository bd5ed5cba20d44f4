//! The results page's summary table, made from the bench's result files: one row a
//! scenario, each figure read from the file its row names, so that the page cannot drift
//! from what was measured. The rows are listed in a TOML file beside the result files
//! (docs/results/summary.toml); a row that names no file still carries the figures typed
//! from an older run, marked as such, until its command is run again.

use std::path::Path;

use anyhow::{bail, Context, Result};
use appease_bench::report::{ModeResult, ScenarioResult};
use appease_bench::{Mode, Report};
use serde::Deserialize;

use crate::bench_cmd::{report_of, Measured};

/// The figure columns, after the scenario's: the modes compared, then the batch's share.
const MODES: [(&str, Mode); 6] = [
    ("unloaded", Mode::Unloaded),
    ("unmanaged", Mode::Unmanaged),
    ("by hand", Mode::BatchCgroupIdle),
    ("appease", Mode::Appease),
    ("Ananicy", Mode::Ananicy),
    ("system76-scheduler", Mode::System76Scheduler),
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    row: Vec<Row>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    /// The first cell: the scenario's link and its headline figure.
    scenario: String,
    /// The result file, relative to the spec's directory.
    file: Option<String>,
    /// Text after a column's figure (a footnote's mark), by column name ("batch" for the
    /// batch's share).
    #[serde(default)]
    marks: std::collections::BTreeMap<String, String>,
    /// A row not yet made from a file: its figure cells, then its date and its command.
    cells: Option<Vec<String>>,
}

/// The summary table in Markdown.
pub fn summary(spec_path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(spec_path)
        .with_context(|| format!("reading {}", spec_path.display()))?;
    let spec: Spec =
        toml::from_str(&text).with_context(|| format!("parsing {}", spec_path.display()))?;
    let dir = spec_path.parent().unwrap_or(Path::new("."));
    let mut out = String::from("| scenario: headline |");
    for (name, _) in MODES {
        out += &format!(" {name} |");
    }
    out += " appease's batch | measured | command |\n|";
    out += &"---|".repeat(MODES.len() + 4);
    out += "\n";
    for row in &spec.row {
        let cells = match (&row.file, &row.cells) {
            (Some(file), None) => cells_of_file(&dir.join(file), row)
                .with_context(|| format!("the summary's row {:?}", row.scenario))?,
            (None, Some(cells)) if cells.len() == MODES.len() + 3 => cells.clone(),
            _ => bail!(
                "{}: the row {:?} needs either `file` or {} `cells`",
                spec_path.display(),
                row.scenario,
                MODES.len() + 3
            ),
        };
        out += &format!("| {} | {} |\n", row.scenario, cells.join(" | "));
    }
    Ok(out)
}

/// A row's figure cells, date and command from its result file.
fn cells_of_file(path: &Path, row: &Row) -> Result<Vec<String>> {
    let Report::Latency(results) = report_of(path)? else {
        bail!(
            "{}: only a latency scenario's result makes a summary row",
            path.display()
        );
    };
    let [r] = results.as_slice() else {
        bail!(
            "{}: a batch-level sweep makes no single row",
            path.display()
        );
    };
    let value: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let measured = Measured::of(&value).with_context(|| {
        format!(
            "{} does not say when and how it was measured",
            path.display()
        )
    })?;
    let mark = |column: &str, cell: String| match row.marks.get(column) {
        Some(m) if cell != "–" => format!("{cell} {m}"),
        _ => cell,
    };
    let mut cells: Vec<String> = MODES
        .iter()
        .map(|&(name, mode)| {
            let cell = r
                .modes
                .iter()
                .find(|m| m.mode == mode)
                .map_or("–".to_string(), headline);
            let cell = mark(name, cell);
            match mode {
                Mode::Appease if cell != "–" => format!("**{cell}**"),
                _ => cell,
            }
        })
        .collect();
    cells.push(mark("batch", batch_share(r)));
    cells.push(measured.date);
    cells.push(format!("`{}`", measured.command));
    Ok(cells)
}

/// The server's headline figure: its p99 in ms; for a player, and its frames dropped.
fn headline(m: &ModeResult) -> String {
    let p99 = thousands(m.latency_ms.p99);
    match &m.frames {
        Some(f) => format!("{p99}; {}", f.dropped),
        None => p99,
    }
}

/// appease's batch's throughput against unmanaged's.
fn batch_share(r: &ScenarioResult) -> String {
    let of = |mode| r.modes.iter().find(|m| m.mode == mode);
    match (of(Mode::Appease), of(Mode::Unmanaged)) {
        (Some(a), Some(u)) if u.batch_throughput > 0.0 => {
            format!("{:.1} %", 100.0 * a.batch_throughput / u.batch_throughput)
        }
        _ => "–".to_string(),
    }
}

/// Milliseconds as the page writes them: two decimals, whole numbers with separators
/// from 1,000 up.
fn thousands(ms: f64) -> String {
    if ms < 1000.0 {
        return format!("{ms:.2}");
    }
    let digits = format!("{:.0}", ms);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_as_the_page_writes_them() {
        assert_eq!(thousands(6.2449), "6.24");
        assert_eq!(thousands(999.994), "999.99");
        assert_eq!(thousands(26_706.4), "26,706");
        assert_eq!(thousands(113_705.0), "113,705");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
    }

    #[test]
    fn a_row_with_neither_a_file_nor_all_its_cells_is_named() {
        let dir = std::env::temp_dir().join(format!("appease-summary-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let spec = dir.join("summary.toml");
        std::fs::write(&spec, "[[row]]\nscenario = \"web\"\ncells = [\"1\"]\n").unwrap();
        let err = format!("{:#}", summary(&spec).unwrap_err());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            err.contains("the row \"web\" needs either `file` or 9 `cells`"),
            "{err}"
        );
    }
}
