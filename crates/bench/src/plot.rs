//! Plots a person would rather look at than read: each mode's response-time CDF against
//! the unloaded one (the AIX case study's Figures 2 and 5), and latency against the batch level
//! (the 2010 customer-appeasement paper's Figures 1–2); for the utilization scenario, how evenly each case shares the
//! CPUs among its soakers (the CFS group-scheduling slides). SVG, written with `--out`.

use plotters::prelude::*;

use crate::report::ScenarioResult;
use crate::utilization::UtilizationResult;
use crate::Mode;

const SIZE: (u32, u32) = (900, 560);

/// Mode colours, the same in every plot; `unloaded` black, `appease` the boldest.
fn colour(mode: Mode) -> RGBColor {
    match mode {
        Mode::Unloaded => BLACK,
        Mode::Unmanaged => RGBColor(214, 39, 40),
        Mode::BatchNice19 => RGBColor(255, 127, 14),
        Mode::BatchSchedIdle => RGBColor(148, 103, 189),
        Mode::BatchCgroupIdle => RGBColor(140, 86, 75),
        Mode::RbpeClassic => RGBColor(127, 127, 127),
        Mode::Appease => RGBColor(31, 119, 180),
        Mode::Ananicy => RGBColor(44, 160, 44),
        Mode::System76Scheduler => RGBColor(23, 190, 207),
        Mode::BatchGroupIdle => RGBColor(227, 119, 194),
        Mode::BatchBranchIdle => RGBColor(188, 189, 34),
        Mode::BatchCgroupLow => RGBColor(255, 187, 120),
    }
}

fn stroke(mode: Mode) -> ShapeStyle {
    colour(mode).stroke_width(if mode == Mode::Appease { 3 } else { 2 })
}

/// The plot's error as text: plotters' error types borrow the backend.
fn svg(
    draw: impl FnOnce(&DrawingArea<SVGBackend, plotters::coord::Shift>) -> Result<(), String>,
) -> anyhow::Result<String> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, SIZE).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        draw(&root).map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        root.present().map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    }
    Ok(buf)
}

/// Response-time CDF of every mode at one batch level. Time is on a log scale: an
/// unmanaged mode can be a thousand times slower than the rest.
pub fn cdf(r: &ScenarioResult) -> anyhow::Result<String> {
    let points = || r.modes.iter().flat_map(|m| m.cdf_ms.iter().map(|c| c.1));
    let xmin = points().fold(f64::INFINITY, f64::min).max(0.001) * 0.8;
    let xmax = points().fold(0.0, f64::max).max(xmin * 10.0) * 1.2;
    let title = format!(
        "{}: response time, {} soakers ({} per CPU)",
        r.scenario, r.soakers, r.load_per_cpu
    );
    svg(|root| {
        let mut chart = frame(root, &title)
            .build_cartesian_2d((xmin..xmax).log_scale(), 0.0..100.0)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("response time (ms, log scale)")
            .y_desc("requests answered within (%)")
            .draw()
            .map_err(|e| e.to_string())?;
        for m in &r.modes {
            let points = m.cdf_ms.iter().map(|&(pct, ms)| (ms, pct));
            chart
                .draw_series(LineSeries::new(points, stroke(m.mode)))
                .map_err(|e| e.to_string())?
                .label(m.mode.name())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], stroke(m.mode)));
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight)
    })
}

/// What every plot shares: its title, margins and room for the axis labels.
fn frame<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    title: &str,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut b = ChartBuilder::on(root);
    b.caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60);
    b
}

/// The box naming each mode's colour.
fn legend<'a, 'b: 'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>,
    at: SeriesLabelPosition,
) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

/// Mean and p99 of every mode against the batch level (one point per `--load` value).
pub fn latency_vs_load(rs: &[ScenarioResult]) -> anyhow::Result<String> {
    let xmax = rs
        .iter()
        .map(|r| r.load_per_cpu)
        .fold(0.0, f64::max)
        .max(1.0);
    let values = || {
        rs.iter()
            .flat_map(|r| r.modes.iter())
            .flat_map(|m| [m.latency_ms.mean, m.latency_ms.p99])
    };
    let ymin = values().fold(f64::INFINITY, f64::min).max(0.001) * 0.8;
    let ymax = values().fold(0.0, f64::max).max(ymin * 10.0) * 1.2;
    let modes: Vec<Mode> = rs
        .first()
        .map(|r| r.modes.iter().map(|m| m.mode).collect())
        .unwrap_or_default();
    let title = format!(
        "{}: latency against batch load (solid p99, dashed mean)",
        rs.first().map_or("", |r| r.scenario.as_str())
    );
    svg(|root| {
        let mut chart = frame(root, &title)
            .build_cartesian_2d(0.0..xmax, (ymin..ymax).log_scale())
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("batch jobs per CPU")
            .y_desc("response time (ms, log scale)")
            .draw()
            .map_err(|e| e.to_string())?;
        for mode in modes {
            let of = |f: fn(&crate::report::Latency) -> f64| {
                rs.iter()
                    .filter_map(|r| {
                        let m = r.modes.iter().find(|m| m.mode == mode)?;
                        Some((r.load_per_cpu, f(&m.latency_ms)))
                    })
                    .collect::<Vec<_>>()
            };
            chart
                .draw_series(LineSeries::new(of(|l| l.p99), stroke(mode)))
                .map_err(|e| e.to_string())?
                .label(mode.name())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], stroke(mode)));
            chart
                .draw_series(DashedLineSeries::new(of(|l| l.mean), 6, 4, stroke(mode)))
                .map_err(|e| e.to_string())?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    })
}

/// Every plot of a latency scenario's results, as (file name, SVG).
pub fn all(rs: &[ScenarioResult]) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    // A level with no finite latency (stopped before it measured) has nothing to draw,
    // and an unbounded axis would never finish its ticks.
    let drawable = |r: &&ScenarioResult| {
        r.modes
            .iter()
            .any(|m| m.cdf_ms.iter().any(|c| c.1.is_finite() && c.1 > 0.0))
    };
    let rs: Vec<ScenarioResult> = rs.iter().filter(drawable).cloned().collect();
    let rs = &rs[..];
    for r in rs {
        let name = if rs.len() == 1 {
            "cdf.svg".to_string()
        } else {
            format!("cdf-load{}.svg", r.load_per_cpu)
        };
        out.push((name, cdf(r)?));
    }
    if rs.len() > 1 {
        out.push(("latency-vs-load.svg".to_string(), latency_vs_load(rs)?));
    }
    Ok(out)
}

/// Each case's soakers, from the one that got most CPU to the one that got least, as a
/// multiple of their fair share: a fair case is a flat line at 1, the kernel's herding of
/// idle groups a steep one.
pub fn fairness(u: &UtilizationResult) -> anyhow::Result<String> {
    let shares: Vec<(String, Vec<f64>)> = u
        .cases
        .iter()
        .filter(|c| !c.cpu_s.is_empty())
        .map(|c| {
            let mean = c.cpu_s.iter().sum::<f64>() / c.cpu_s.len() as f64;
            let mut s: Vec<f64> = c.cpu_s.iter().map(|x| x / mean.max(1e-9)).collect();
            s.sort_by(|a, b| b.total_cmp(a));
            (format!("{} (Jain {:.3})", c.case, c.jain_index), s)
        })
        .collect();
    let ymax = shares
        .iter()
        .flat_map(|(_, s)| s.iter().copied())
        .fold(1.0, f64::max)
        * 1.1;
    let palette = [
        RGBColor(214, 39, 40),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(127, 127, 127),
        RGBColor(31, 119, 180),
    ];
    let title = format!("utilization: CPU per soaker, {} CPUs", u.cpus);
    svg(|root| {
        let mut chart = frame(root, &title)
            .build_cartesian_2d(0.0..100.0, 0.0..ymax)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("soakers, most CPU first (%)")
            .y_desc("CPU time / fair share")
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, (name, s)) in shares.iter().enumerate() {
            let style = palette[i % palette.len()].stroke_width(2);
            let n = s.len().max(2) as f64 - 1.0;
            let points = s
                .iter()
                .enumerate()
                .map(|(k, &y)| (100.0 * k as f64 / n, y));
            chart
                .draw_series(LineSeries::new(points, style))
                .map_err(|e| e.to_string())?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], style));
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    })
}

/// A closed-loop sweep's completion time against the number of clients, one plot per
/// client variant, a line per mode (the Staircase study's Figures 3 and 4). Clients on a
/// log axis: the sweep doubles them.
pub fn completion_vs_clients(
    r: &crate::closed_loop::ClosedLoopResult,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut variants: Vec<&str> = r.series.iter().map(|s| s.variant.as_str()).collect();
    variants.dedup();
    let mut out = Vec::new();
    for variant in variants {
        let series: Vec<_> = r.series.iter().filter(|s| s.variant == variant).collect();
        let points = || series.iter().flat_map(|s| s.points.iter());
        let xmin = points().map(|p| p.clients).min().unwrap_or(1).max(1) as f64;
        let xmax = (points().map(|p| p.clients).max().unwrap_or(2) as f64).max(xmin * 2.0);
        let ymax = points()
            .map(|p| p.completion_s)
            .filter(|t| t.is_finite())
            .fold(0.0, f64::max)
            .max(1e-3)
            * 1.15;
        let title = format!(
            "{} {variant}: completion time of {} {} against clients",
            r.scenario, r.work_per_run, r.unit
        );
        let svg = svg(|root| {
            let mut chart = frame(root, &title)
                .build_cartesian_2d((xmin * 0.8..xmax * 1.25).log_scale(), 0.0..ymax)
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc("clients (log scale)")
                .y_desc("completion time (s)")
                .draw()
                .map_err(|e| e.to_string())?;
            for s in &series {
                let mode = s.mode;
                let line: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .map(|p| (p.clients as f64, p.completion_s))
                    .collect();
                chart
                    .draw_series(LineSeries::new(line.clone(), stroke(mode)))
                    .map_err(|e| e.to_string())?
                    .label(mode.name())
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], stroke(mode)));
                chart
                    .draw_series(
                        line.into_iter()
                            .map(|p| Circle::new(p, 3, colour(mode).filled())),
                    )
                    .map_err(|e| e.to_string())?;
            }
            legend(&mut chart, SeriesLabelPosition::UpperRight)
        })?;
        out.push((format!("completion-{variant}.svg"), svg));
    }
    Ok(out)
}
