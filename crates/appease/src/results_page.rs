//! The results page's summary table, made from the bench's result files: one row a
//! scenario, each figure read from the file its row names, so that the page cannot drift
//! from what was measured. The rows are listed in a TOML file beside the result files
//! (docs/results/summary.toml); a row that names no file still carries the figures typed
//! from an older run, marked as such, until its command is run again.

use std::path::Path;

use anyhow::{bail, Context, Result};
use appease_bench::closed_loop::ClosedLoopResult;
use appease_bench::fetch::{FetchResult, Server};
use appease_bench::markdown::thousands;
use appease_bench::report::{ModeResult, ScenarioResult};
use appease_bench::utilization::UtilizationResult;
use appease_bench::{Batch, Mode, Report};
use serde::Deserialize;

use crate::bench_cmd::{read_result, Measured};

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
    /// The row's name in README's table, which shows the rows that have one.
    readme: Option<String>,
    /// README's cells of a row not yet made from a file: unloaded, unmanaged, by hand,
    /// appease, the best peer, appease's batch.
    readme_cells: Option<Vec<String>>,
    /// The peers' figures from an earlier run, for a row whose file ran without them.
    peers: Option<TypedPeers>,
    /// Of a fetch file, the cases beside this server ("db", "web"): one row a server.
    server: Option<String>,
    /// Of a utilization file, which of its figures: "groups" (the batch groups without a
    /// server), or the batch beside the server ("soak", "mixed").
    part: Option<String>,
}

/// The peer daemons' cells typed from an earlier run (`make peers` is a build of their
/// sources, not always at hand), and its date.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TypedPeers {
    ananicy: String,
    #[serde(rename = "system76-scheduler")]
    system76_scheduler: String,
    /// README's best-peer cell, e.g. "47.55 (Ananicy)", for a row README shows.
    best: Option<String>,
    date: String,
}

impl TypedPeers {
    fn cell(&self, mode: Mode) -> Option<&str> {
        match mode {
            Mode::Ananicy => Some(&self.ananicy),
            Mode::System76Scheduler => Some(&self.system76_scheduler),
            _ => None,
        }
    }
}

/// README's figure columns.
const README_COLUMNS: [&str; 6] = [
    "unloaded",
    "unmanaged",
    "idle group by hand",
    "appease",
    "best peer daemon",
    "appease's batch",
];

fn read_spec(spec_path: &Path) -> Result<Spec> {
    let text = std::fs::read_to_string(spec_path)
        .with_context(|| format!("reading {}", spec_path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing {}", spec_path.display()))
}

/// README's shorter table: the rows the spec names for it, the best peer in one column.
pub fn readme(spec_path: &Path) -> Result<String> {
    let spec = read_spec(spec_path)?;
    let dir = spec_path.parent().unwrap_or(Path::new("."));
    let mut out = format!("| scenario | {} |\n|", README_COLUMNS.join(" | "));
    out += &"---|".repeat(README_COLUMNS.len() + 1);
    out += "\n";
    for row in &spec.row {
        let Some(name) = &row.readme else { continue };
        let cells = match (&row.file, &row.readme_cells) {
            (Some(file), None) => readme_cells_of_file(&dir.join(file), row)
                .with_context(|| format!("README's row {name:?}"))?,
            (None, Some(cells)) if cells.len() == README_COLUMNS.len() => cells.clone(),
            _ => bail!(
                "{}: README's row {name:?} needs either `file` or {} `readme_cells`",
                spec_path.display(),
                README_COLUMNS.len()
            ),
        };
        out += &format!("| {name} | {} |\n", cells.join(" | "));
    }
    Ok(out)
}

/// README's cells from a result file: the server's p99 (frames dropped, for a player)
/// by mode, the best peer's with its name, appease's batch.
fn readme_cells_of_file(path: &Path, row: &Row) -> Result<Vec<String>> {
    let (r, _) = single_result(path)?;
    let figure = |m: &ModeResult| match &m.frames {
        Some(f) => (f.dropped as f64, f.dropped.to_string()),
        None => (m.latency_ms.p99, thousands(m.latency_ms.p99)),
    };
    let of = |mode| r.modes.iter().find(|m| m.mode == mode).map(figure);
    let cell = |mode| of(mode).map_or("–".to_string(), |(_, c)| c);
    let best_peer = [Mode::Ananicy, Mode::System76Scheduler]
        .into_iter()
        .filter_map(|mode| of(mode).map(|(v, c)| (v, format!("{c} ({})", peer_name(mode)))))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
        .or_else(|| row.peers.as_ref().and_then(|p| p.best.clone()))
        .unwrap_or_else(|| "–".to_string());
    Ok(vec![
        cell(Mode::Unloaded),
        cell(Mode::Unmanaged),
        cell(Mode::BatchCgroupIdle),
        format!("**{}**", cell(Mode::Appease)),
        best_peer,
        batch_share(&r),
    ])
}

fn peer_name(mode: Mode) -> &'static str {
    MODES
        .iter()
        .find(|(_, m)| *m == mode)
        .map_or("?", |(name, _)| name)
}

/// A latency scenario's one result (one batch level) in `path`, and when and how it was
/// measured.
fn single_result(path: &Path) -> Result<(ScenarioResult, Option<Measured>)> {
    let (report, measured) = read_result(path)?;
    Ok((latency_result(report, path)?, measured))
}

/// The one result of a latency scenario's report (one batch level).
fn latency_result(report: Report, path: &Path) -> Result<ScenarioResult> {
    let Report::Latency(mut results) = report else {
        bail!(
            "{}: only a latency scenario's or a client sweep's result makes a summary row",
            path.display()
        );
    };
    if results.len() != 1 {
        bail!(
            "{}: a batch-level sweep makes no single row",
            path.display()
        );
    }
    Ok(results.remove(0))
}

/// A column's cell with the row's mark for that column after it, if any.
fn mark(row: &Row, column: &str, cell: String) -> String {
    match row.marks.get(column) {
        Some(m) if cell != "–" => format!("{cell} {m}"),
        _ => cell,
    }
}

/// A client sweep's row: each mode's completion times in s at the sweep's most clients,
/// one per client variant in the file's order (e.g. read-only / read-write).
fn sweep_cells(r: &ClosedLoopResult, measured: Measured, row: &Row) -> Vec<String> {
    let most = r.clients.iter().copied().max();
    let (mut cells, _) = mode_cells(row, |mode| {
        let times: Vec<String> = r
            .series
            .iter()
            .filter(|s| s.mode == mode)
            .filter_map(|s| s.points.iter().find(|p| Some(p.clients) == most))
            .map(|p| format!("{:.2}", p.completion_s))
            .collect();
        (!times.is_empty()).then(|| times.join(" / "))
    });
    cells.push("–".to_string());
    cells.push(measured.date);
    cells.push(format!("`{}`", measured.command));
    cells
}

/// A fetch row: each mode's p99 beside the row's server, one per job in the file's order
/// (e.g. dump / pull / ETL), and appease's batch against unmanaged's for each.
fn fetch_cells(r: &FetchResult, measured: Measured, row: &Row, path: &Path) -> Result<Vec<String>> {
    let Some(name) = &row.server else {
        bail!(
            "{}: a fetch file's row names its `server` (db or web)",
            path.display()
        );
    };
    let server = Server::parse(name)?;
    let cases: Vec<_> = r.cases.iter().filter(|c| c.server == server).collect();
    if cases.is_empty() {
        bail!("{}: no case beside the server {name:?}", path.display());
    }
    let per_job = |f: &dyn Fn(&appease_bench::fetch::ModeSummary) -> Option<String>, mode| {
        let cells: Option<Vec<String>> = cases.iter().map(|c| c.mode(mode).and_then(f)).collect();
        cells.map(|c| c.join(" / "))
    };
    let p99 = |m: &appease_bench::fetch::ModeSummary| Some(format!("{:.2}", m.median.p99_ms));
    let (mut cells, _) = mode_cells(row, |mode| per_job(&p99, mode));
    let batch = |m: &appease_bench::fetch::ModeSummary| m.batch_pct.map(|b| format!("{b:.1}"));
    let share = per_job(&batch, Mode::Appease).map_or("–".to_string(), |b| format!("{b} %"));
    cells.push(mark(row, "batch", share));
    cells.push(measured.date);
    cells.push(format!("`{}`", measured.command));
    Ok(cells)
}

/// A batch-level sweep's row: each mode's p99 at every level, in the file's order, and
/// the range of the CPUs appease's batch got over the levels.
fn load_sweep_cells(levels: &[ScenarioResult], measured: Measured, row: &Row) -> Vec<String> {
    let (mut cells, _) = mode_cells(row, |mode| {
        let p99s: Option<Vec<String>> = levels
            .iter()
            .map(|r| r.modes.iter().find(|m| m.mode == mode).map(headline))
            .collect();
        p99s.map(|c| c.join(" / "))
    });
    let cpus: Vec<f64> = levels
        .iter()
        .filter_map(|r| r.modes.iter().find(|m| m.mode == Mode::Appease))
        .map(|m| m.batch_cpus)
        .collect();
    let (least, most) = cpus
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &c| (lo.min(c), hi.max(c)));
    cells.push(match cpus.is_empty() {
        true => "–".to_string(),
        false => mark(row, "batch", format!("{least:.2}–{most:.2} CPUs")),
    });
    cells.push(measured.date);
    cells.push(format!("`{}`", measured.command));
    cells
}

/// A utilization row: without a server, Jain's index over 48 one-soaker groups under one
/// idle group (by hand) and under appease, and how busy the CPUs were under appease; beside
/// the server, each mode's p99 and Jain's index over the jobs, and the CPUs appease's batch
/// got.
fn utilization_cells(
    u: &UtilizationResult,
    measured: Measured,
    row: &Row,
    path: &Path,
) -> Result<Vec<String>> {
    let part = row.part.as_deref().unwrap_or_default();
    // Each mode's figure, and the batch's cell.
    let (figures, batch): (Vec<(Mode, String)>, String) = if part == "groups" {
        let case = |name: &str| u.cases.iter().find(|c| c.case.contains(name));
        let (Some(hand), Some(managed)) = (
            case("groups under an idle group"),
            case("under the appease daemon"),
        ) else {
            bail!(
                "{}: no case of batch groups by hand and under appease",
                path.display()
            );
        };
        let figures = vec![
            (Mode::BatchCgroupIdle, format!("{:.4}", hand.jain_index)),
            (Mode::Appease, format!("{:.4}", managed.jain_index)),
        ];
        (figures, format!("{:.2} % busy", managed.cpu_util_pct))
    } else {
        let batch = Batch::parse(part).with_context(|| {
            format!(
                "{}: a utilization file's row names its `part`: groups, or the batch beside the server",
                path.display()
            )
        })?;
        let Some(level) = u.with_server.iter().find(|l| l.params.batch == batch) else {
            bail!("{}: no run of {part:?} beside the server", path.display());
        };
        let figures = level.modes.iter().map(|m| {
            let jain = m.batch_jain.map_or("–".to_string(), |j| format!("{j:.3}"));
            (m.mode, format!("{}; {jain}", thousands(m.latency_ms.p99)))
        });
        let batch = level
            .modes
            .iter()
            .find(|m| m.mode == Mode::Appease)
            .map_or("–".to_string(), |m| {
                format!("{:.2} CPUs, {:.1} % busy", m.batch_cpus, m.cpu_util_pct)
            });
        (figures.collect(), batch)
    };
    let (mut cells, peers_typed) = mode_cells(row, |mode| {
        figures
            .iter()
            .find(|(m, _)| *m == mode)
            .map(|(_, f)| f.clone())
    });
    cells.push(mark(row, "batch", batch));
    cells.push(measured_on(row, measured.date, peers_typed));
    cells.push(format!("`{}`", measured.command));
    Ok(cells)
}

/// The summary table in Markdown.
pub fn summary(spec_path: &Path) -> Result<String> {
    let spec = read_spec(spec_path)?;
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

/// A row's figure cells, date and command from its result file: a latency scenario's
/// headline by mode, or a client sweep's completion times at its most clients.
fn cells_of_file(path: &Path, row: &Row) -> Result<Vec<String>> {
    let (report, measured) = read_result(path)?;
    let measured = Measured::required(measured, path)?;
    let r = match report {
        Report::ClosedLoop(sweep) => return Ok(sweep_cells(&sweep, measured, row)),
        Report::Fetch(fetch) => return fetch_cells(&fetch, measured, row, path),
        Report::Utilization(u) => return utilization_cells(&u, measured, row, path),
        Report::Latency(levels) if levels.len() > 1 => {
            return Ok(load_sweep_cells(&levels, measured, row))
        }
        report => latency_result(report, path)?,
    };
    let (mut cells, peers_typed) = mode_cells(row, |mode| {
        r.modes.iter().find(|m| m.mode == mode).map(headline)
    });
    cells.push(mark(row, "batch", batch_share(&r)));
    cells.push(measured_on(row, measured.date, peers_typed));
    cells.push(format!("`{}`", measured.command));
    Ok(cells)
}

/// The mode columns' cells: each mode's figure from the row's file, else the row's typed
/// peer figure, else "–"; appease's in bold, a column's mark after it. And whether a typed
/// figure was shown (the date cell then dates the peers apart).
fn mode_cells(row: &Row, figure: impl Fn(Mode) -> Option<String>) -> (Vec<String>, bool) {
    let mut typed_shown = false;
    let mut cells = Vec::with_capacity(MODES.len());
    for &(name, mode) in &MODES {
        let typed = || {
            row.peers
                .as_ref()
                .and_then(|p| p.cell(mode))
                .map(str::to_string)
        };
        let cell = figure(mode).or_else(|| typed().inspect(|_| typed_shown = true));
        cells.push(match (cell, mode) {
            (None, _) => "–".to_string(),
            (Some(c), Mode::Appease) => mark(row, name, format!("**{c}**")),
            (Some(c), _) => mark(row, name, c),
        });
    }
    (cells, typed_shown)
}

/// The date cell: the run's, and the typed peers' when the row shows them.
fn measured_on(row: &Row, date: String, peers_typed: bool) -> String {
    match (&row.peers, peers_typed) {
        (Some(p), true) => format!("{date}; the peers {}", p.date),
        _ => date,
    }
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
    r.modes
        .iter()
        .find(|m| m.mode == Mode::Appease)
        .and_then(|a| appease_bench::report::batch_vs_unmanaged(r, a))
        .map_or("–".to_string(), |pct| format!("{pct:.1} %"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec of one row made from the kept synthetic run (which ran without the peers),
    /// with the peers' figures typed from an earlier run.
    fn spec_with_typed_peers(dir: &Path) -> std::path::PathBuf {
        let kept = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/results/synthetic.json");
        std::fs::copy(&kept, dir.join("synthetic.json")).unwrap();
        let spec = dir.join("summary.toml");
        std::fs::write(
            &spec,
            "[[row]]\nscenario = \"s\"\nfile = \"synthetic.json\"\nreadme = \"r\"\n\
             peers = { ananicy = \"47.55\", system76-scheduler = \"50.91\", best = \"47.55 (Ananicy)\", date = \"2026-11-29\" }\n",
        )
        .unwrap();
        spec
    }

    #[test]
    fn a_file_without_the_peers_keeps_their_typed_figures_dated_apart() {
        let dir = std::env::temp_dir().join(format!("appease-peers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let spec = spec_with_typed_peers(&dir);
        let (table, readme) = (summary(&spec), readme(&spec));
        std::fs::remove_dir_all(&dir).unwrap();
        let (table, readme) = (table.unwrap(), readme.unwrap());
        let row = table.lines().nth(2).unwrap();
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
        assert_eq!(cells[0], "s");
        assert_eq!(&cells[5..7], ["47.55", "50.91"], "{row}");
        assert!(cells[8].ends_with("; the peers 2026-11-29"), "{row}");
        assert!(
            cells[4].starts_with("**") && cells[4].ends_with("**"),
            "{row}"
        );
        let row = readme.lines().nth(2).unwrap();
        assert!(row.starts_with("| r | "), "{row}");
        assert!(row.contains("| 47.55 (Ananicy) |"), "{row}");
    }

    #[test]
    fn a_client_sweeps_row_gives_each_modes_completion_times_at_its_most_clients() {
        let table = summary_over(
            "db-clients.json",
            "[[row]]\nscenario = \"db\"\nfile = \"db-clients.json\"\nmarks = { appease = \"(h)\" }\n",
        );
        let kept = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/results/db-clients.json");
        let (report, _) = read_result(&kept).unwrap();
        let Report::ClosedLoop(r) = report else {
            panic!("a sweep")
        };
        let at_most = |mode: Mode| -> String {
            let most = r.clients.iter().max().copied();
            let times: Vec<String> = r
                .series
                .iter()
                .filter(|s| s.mode == mode)
                .map(|s| s.points.iter().find(|p| Some(p.clients) == most).unwrap())
                .map(|p| format!("{:.2}", p.completion_s))
                .collect();
            assert_eq!(times.len(), 2, "read-only and read-write");
            times.join(" / ")
        };
        let table = table.unwrap();
        let row = table.lines().nth(2).unwrap();
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
        assert_eq!(cells[1], "–", "no unloaded mode in a sweep: {row}");
        assert_eq!(cells[2], at_most(Mode::Unmanaged), "{row}");
        assert_eq!(cells[3], at_most(Mode::BatchCgroupIdle), "{row}");
        assert_eq!(
            cells[4],
            format!("**{}** (h)", at_most(Mode::Appease)),
            "{row}"
        );
        assert_eq!(cells[7], "–", "no batch share: {row}");
        assert!(cells[9].starts_with("`appease bench db --clients"), "{row}");
    }

    #[test]
    fn a_fetch_files_rows_give_each_modes_p99_per_job_beside_their_server() {
        use appease_bench::fetch::{Case, Job, ModeSummary};
        use appease_bench::rounds::{Cases, Measured as Figures};
        let mode = |mode, p99_ms, batch_pct| ModeSummary {
            mode,
            median: Figures {
                p99_ms,
                p50_ms: 1.0,
                batch_cpus: 1.5,
            },
            jobs_per_min: 60.0,
            batch_pct,
            p99_vs_by_hand: None,
            rounds: Vec::new(),
        };
        let case = |server, job, p99: [f64; 4]| Case {
            server,
            job,
            server_description: String::new(),
            job_description: String::new(),
            measure_s: 10.0,
            modes: vec![
                mode(Mode::Unloaded, p99[0], None),
                mode(Mode::Unmanaged, p99[1], Some(100.0)),
                mode(Mode::BatchCgroupIdle, p99[2], Some(95.0)),
                mode(Mode::Appease, p99[3], Some(p99[3] * 10.0)),
            ],
        };
        let fetch = Cases {
            scenario: "fetch".into(),
            cases: vec![
                case(Server::Db, Job::Dump, [1.0, 8.0, 3.0, 2.5]),
                case(Server::Web, Job::Dump, [0.5, 3.0, 1.0, 0.75]),
                case(Server::Db, Job::Etl, [2.0, 9.0, 4.0, 3.5]),
            ],
        };
        let mut value = serde_json::to_value(&fetch).unwrap();
        value["measured"] =
            serde_json::json!({"date": "2026-12-07", "command": "appease bench fetch"});
        let dir = std::env::temp_dir().join(format!("appease-fetch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("fetch.json"), value.to_string()).unwrap();
        let spec = dir.join("summary.toml");
        std::fs::write(
            &spec,
            "[[row]]\nscenario = \"pg\"\nfile = \"fetch.json\"\nserver = \"db\"\nmarks = { batch = \"(e)\" }\n\
             [[row]]\nscenario = \"nginx\"\nfile = \"fetch.json\"\nserver = \"web\"\n",
        )
        .unwrap();
        let table = summary(&spec);
        std::fs::write(&spec, "[[row]]\nscenario = \"s\"\nfile = \"fetch.json\"\n").unwrap();
        let unnamed = summary(&spec);
        std::fs::remove_dir_all(&dir).unwrap();
        let table = table.unwrap();
        let cells = |n: usize| -> Vec<String> {
            let row = table.lines().nth(n).unwrap();
            row.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        };
        let pg = cells(2);
        assert_eq!(
            pg[1..5],
            [
                "1.00 / 2.00",
                "8.00 / 9.00",
                "3.00 / 4.00",
                "**2.50 / 3.50**"
            ]
        );
        assert_eq!(pg[5..8], ["–", "–", "25.0 / 35.0 % (e)"]);
        assert_eq!(pg[8..], ["2026-12-07", "`appease bench fetch`"]);
        let web = cells(3);
        assert_eq!(web[1..5], ["0.50", "3.00", "1.00", "**0.75**"]);
        assert_eq!(web[7], "7.5 %");
        let e = format!("{:#}", unnamed.unwrap_err());
        assert!(e.contains("names its `server`"), "{e}");
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

    /// The summary made by `spec` (a TOML text of rows) over docs/results/`file`.
    fn summary_over(file: &str, spec: &str) -> Result<String> {
        let dir = std::env::temp_dir().join(format!("appease-rows-{}-{file}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kept = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../docs/results")
            .join(file);
        std::fs::copy(&kept, dir.join(file)).unwrap();
        std::fs::write(dir.join("summary.toml"), spec).unwrap();
        let table = summary(&dir.join("summary.toml"));
        std::fs::remove_dir_all(&dir).unwrap();
        table
    }

    /// The rows' cells of that summary.
    fn rows_of(file: &str, spec: &str) -> Vec<Vec<String>> {
        let table = summary_over(file, spec).unwrap();
        let cells = |row: &str| {
            row.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        };
        table.lines().skip(2).map(cells).collect()
    }

    #[test]
    fn utilization_rows_give_the_groups_fairness_and_beside_the_server_each_modes_p99_and_fairness()
    {
        let kept =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/results/utilization.json");
        let Report::Utilization(u) = read_result(&kept).unwrap().0 else {
            panic!("a utilization file")
        };
        let rows = rows_of(
            "utilization.json",
            "[[row]]\nscenario = \"g\"\nfile = \"utilization.json\"\npart = \"groups\"\n\
             [[row]]\nscenario = \"m\"\nfile = \"utilization.json\"\npart = \"mixed\"\n\
             peers = { ananicy = \"1; 0.5\", system76-scheduler = \"2; 0.6\", date = \"2026-12-01\" }\n",
        );
        let jain = |name: &str| {
            let c = u.cases.iter().find(|c| c.case.contains(name)).unwrap();
            format!("{:.4}", c.jain_index)
        };
        assert_eq!(
            rows[0][3],
            jain("groups under an idle group"),
            "{:?}",
            rows[0]
        );
        assert_eq!(
            rows[0][4],
            format!("**{}**", jain("under the appease daemon")),
            "{:?}",
            rows[0]
        );
        assert_eq!(rows[0][5], "–", "{:?}", rows[0]);
        let mixed = u
            .with_server
            .iter()
            .find(|l| l.params.batch == Batch::Mixed)
            .unwrap();
        let of = |mode| mixed.modes.iter().find(|m| m.mode == mode).unwrap();
        let cell = |m: &ModeResult| {
            format!(
                "{}; {:.3}",
                thousands(m.latency_ms.p99),
                m.batch_jain.unwrap()
            )
        };
        assert_eq!(rows[1][3], cell(of(Mode::BatchCgroupIdle)), "{:?}", rows[1]);
        assert_eq!(
            rows[1][4],
            format!("**{}**", cell(of(Mode::Appease))),
            "{:?}",
            rows[1]
        );
        assert_eq!(
            &rows[1][5..7],
            ["1; 0.5", "2; 0.6"],
            "the peers typed: {:?}",
            rows[1]
        );
        assert!(
            rows[1][8].ends_with("; the peers 2026-12-01"),
            "{:?}",
            rows[1]
        );
        let spec = "[[row]]\nscenario = \"x\"\nfile = \"utilization.json\"\npart = \"soakers\"\n";
        let wrong = format!("{:#}", summary_over("utilization.json", spec).unwrap_err());
        assert!(wrong.contains("`part`"), "{wrong}");
    }

    #[test]
    fn a_batch_level_sweeps_row_gives_each_modes_p99_at_every_level() {
        let kept = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/results/sweep.json");
        let Report::Latency(levels) = read_result(&kept).unwrap().0 else {
            panic!("a latency file")
        };
        assert!(levels.len() > 1, "a sweep of batch levels");
        let rows = rows_of(
            "sweep.json",
            "[[row]]\nscenario = \"s\"\nfile = \"sweep.json\"\n",
        );
        let at_every = |mode| {
            let p99s: Vec<String> = levels
                .iter()
                .map(|r| r.modes.iter().find(|m| m.mode == mode).unwrap())
                .map(|m| thousands(m.latency_ms.p99))
                .collect();
            p99s.join(" / ")
        };
        assert_eq!(rows[0][1], at_every(Mode::Unloaded), "{:?}", rows[0]);
        assert_eq!(rows[0][3], at_every(Mode::BatchCgroupIdle), "{:?}", rows[0]);
        assert_eq!(
            rows[0][4],
            format!("**{}**", at_every(Mode::Appease)),
            "{:?}",
            rows[0]
        );
        assert_eq!(rows[0][5], "–", "no peer in the sweep: {:?}", rows[0]);
        assert!(rows[0][7].ends_with(" CPUs"), "{:?}", rows[0]);
    }
}
