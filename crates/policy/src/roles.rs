//! Staggered roles for a multi-process application (the AIX case study): one block priority for
//! all of an application's processes lets a single-instance hog starve its peers; fixed,
//! staggered priorities by contribution to the critical path do not.
//!
//! The rule, from the paper's worked example (its Figure 3 -> Figure 4): the critical
//! process (whose response is what customers wait for) ranks first; the processes its
//! requests pass through next, each a rank below the previous, in order of their share of
//! the per-request CPU; the rest (small shares, off the path) share the last rank.

/// What was observed of one process of the application.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    pub name: String,
    /// Share of the CPU one request (call) costs that this process spends, percent.
    pub share_pct: f64,
    /// How often it runs per request.
    pub invocations: f64,
}

/// A suggested rank (0 = first) for one process, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Suggestion {
    pub name: String,
    pub rank: u32,
    pub why: &'static str,
}

/// Processes with at least this share of a request's CPU, invoked more than once per
/// request, are taken to be on the critical path (the paper's B and C: 26 % and 16 %).
pub const PATH_SHARE_PCT: f64 = 10.0;

/// Ranks the processes of one application; `critical` names the process whose response
/// is measured. Errors name what is missing.
pub fn suggest(observed: &[Observed], critical: &str) -> Result<Vec<Suggestion>, String> {
    if !observed.iter().any(|o| o.name == critical) {
        return Err(format!(
            "the critical process {critical:?} is not among the observed processes"
        ));
    }
    if let Some(o) = observed.iter().find(|o| {
        !o.share_pct.is_finite()
            || !o.invocations.is_finite()
            || o.share_pct < 0.0
            || o.invocations < 0.0
    }) {
        return Err(format!(
            "{}: share and invocations must be non-negative numbers",
            o.name
        ));
    }
    let mut path: Vec<&Observed> = observed
        .iter()
        .filter(|o| o.name != critical && o.share_pct >= PATH_SHARE_PCT && o.invocations > 1.0)
        .collect();
    path.sort_by(|a, b| {
        b.share_pct
            .total_cmp(&a.share_pct)
            .then(a.name.cmp(&b.name))
    });
    let last = path.len() as u32 + 1;
    let mut out = vec![Suggestion {
        name: critical.to_string(),
        rank: 0,
        why: "critical: its response is what customers wait for",
    }];
    out.extend(path.iter().enumerate().map(|(i, o)| Suggestion {
        name: o.name.clone(),
        rank: i as u32 + 1,
        why: "on the critical path: a large share, run several times per request",
    }));
    let mut rest: Vec<&Observed> = observed
        .iter()
        .filter(|o| o.name != critical && !path.iter().any(|p| p.name == o.name))
        .collect();
    rest.sort_by(|a, b| a.name.cmp(&b.name));
    out.extend(rest.into_iter().map(|o| Suggestion {
        name: o.name.clone(),
        rank: last,
        why: "off the critical path: equal, below it, above batch",
    }));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(name: &str, share_pct: f64, invocations: f64) -> Observed {
        Observed {
            name: name.into(),
            share_pct,
            invocations,
        }
    }

    #[test]
    fn figure_3_gives_figure_4() {
        // the AIX case study's Figure 3: per-call work share and how often each process runs.
        let fig3 = [
            obs("A", 48.0, 2.0),
            obs("B", 26.0, 7.0),
            obs("C", 16.0, 4.0),
            obs("D", 4.0, 4.0),
            obs("E", 4.0, 1.0),
            obs("F", 2.0, 2.0),
        ];
        let s = suggest(&fig3, "A").unwrap();
        let ranks: Vec<(&str, u32)> = s.iter().map(|s| (s.name.as_str(), s.rank)).collect();
        // Figure 4: fixed priorities 45, 46, 47, 48, 48, 48.
        assert_eq!(
            ranks,
            [("A", 0), ("B", 1), ("C", 2), ("D", 3), ("E", 3), ("F", 3)]
        );
    }

    #[test]
    fn bad_input_is_named() {
        assert!(suggest(&[obs("A", 1.0, 1.0)], "Z")
            .unwrap_err()
            .contains("\"Z\""));
        assert!(suggest(&[obs("A", f64::NAN, 1.0)], "A")
            .unwrap_err()
            .contains("non-negative"));
    }
}
