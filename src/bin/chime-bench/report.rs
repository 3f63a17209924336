//! The bench's results: a table on stdout, JSON for machines, SVG charts for the README.

use std::fmt::Write as _;
use std::path::Path;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::bench::percentile;
use crate::cli::BenchArgs;
use crate::receiver::Arrival;

#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    AtLeast(f64),
    AtMost(f64),
}

impl Target {
    fn met(self, value: f64) -> bool {
        match self {
            Target::AtLeast(t) => value >= t,
            Target::AtMost(t) => value <= t,
        }
    }
}

/// One measured quantity, with every run's value and their median.
#[derive(Debug, Serialize)]
pub struct Figure {
    pub scenario: String,
    pub nodes: u32,
    pub metric: String,
    pub unit: String,
    pub median: f64,
    pub runs: Vec<f64>,
    pub target: Option<Target>,
    pub met: Option<bool>,
}

/// Callbacks per 100 ms from the due instant, of one burst.
#[derive(Debug, Serialize)]
struct BurstSeries {
    label: String,
    per_100ms: Vec<u32>,
}

/// Lateness of one steady run: sorted values for the chart, quantiles for the JSON.
#[derive(Debug, Serialize)]
struct LatenessSeries {
    label: String,
    quantiles_ms: Vec<(f64, f64)>,
    #[serde(skip)]
    sorted_ms: Vec<f64>,
}

/// A neighbour's steady beside a herd (the fairness scenario), per 100 ms from the
/// neighbour's first due time: the herd's callbacks as they arrived, and the worst lateness
/// of the neighbour's tasks due in each 100 ms. For reading where the lateness came from.
#[derive(Debug, Serialize)]
struct HerdTimeline {
    label: String,
    /// When the herd fell due, seconds after the neighbour's first task.
    herd_due_s: f64,
    herd_callbacks_per_100ms: Vec<u32>,
    neighbour_max_lateness_ms_per_100ms: Vec<f64>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    started_at: DateTime<Utc>,
    cpus: usize,
    settings: serde_json::Value,
    figures: Vec<Figure>,
    bursts: Vec<BurstSeries>,
    lateness: Vec<LatenessSeries>,
    herd_timelines: Vec<HerdTimeline>,
}

impl Report {
    pub fn new(args: &BenchArgs) -> Report {
        Report {
            started_at: Utc::now(),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            settings: serde_json::to_value(args).unwrap_or_default(),
            figures: Vec::new(),
            bursts: Vec::new(),
            lateness: Vec::new(),
            herd_timelines: Vec::new(),
        }
    }

    /// Adds one run's value of a figure.
    pub fn add(&mut self, scenario: &str, nodes: u32, metric: &str, unit: &str, value: f64, target: Option<Target>) {
        eprintln!("bench: {scenario}, {nodes} node(s): {metric}: {} {unit}", fmt(value));
        let i = match self.figures.iter().position(|f| f.scenario == scenario && f.nodes == nodes && f.metric == metric) {
            Some(i) => i,
            None => {
                self.figures.push(Figure {
                    scenario: scenario.into(),
                    nodes,
                    metric: metric.into(),
                    unit: unit.into(),
                    median: f64::NAN,
                    runs: Vec::new(),
                    target,
                    met: None,
                });
                self.figures.len() - 1
            }
        };
        let f = &mut self.figures[i];
        f.runs.push(value);
        f.median = median(&f.runs);
        f.met = f.target.map(|t| t.met(f.median));
    }

    /// The median so far of the figure of `scenario` whose metric contains `metric`.
    pub fn median_of(&self, scenario: &str, nodes: u32, metric: &str) -> Option<f64> {
        self.figures.iter().find(|f| f.scenario == scenario && f.nodes == nodes && f.metric.contains(metric)).map(|f| f.median)
    }

    /// Adds the figures of the burst and steady runs on a loaded table (scenarios named
    /// "`loaded` burst" and "`loaded` steady": backlog, scale) relative to the empty
    /// table's, as percentages, under the scenario `loaded`.
    pub fn compare_loaded(&mut self, loaded: &str, nodes: u32) {
        let pairs: Vec<(String, f64, f64)> = self
            .figures
            .iter()
            .filter(|f| f.nodes == nodes && (f.scenario == "burst" || f.scenario == "steady"))
            .filter(|f| f.metric.contains("rate") || f.metric.contains("lateness p"))
            .filter_map(|empty| {
                let full = self.figures.iter().find(|f| f.scenario == format!("{loaded} {}", empty.scenario) && f.metric == empty.metric)?;
                Some((empty.metric.clone(), empty.median, full.median))
            })
            .collect();
        for (metric, empty, full) in pairs {
            let higher_is_better = metric.contains("rate");
            let target = if higher_is_better { Target::AtLeast(90.0) } else { Target::AtMost(110.0) };
            self.add(loaded, nodes, &format!("{metric}, % of the empty table's"), "%", 100.0 * full / empty, Some(target));
        }
    }

    pub fn burst_series(&mut self, label: &str, due: DateTime<Utc>, arrivals: &[Arrival]) {
        let mut per_100ms: Vec<u32> = Vec::new();
        for a in arrivals {
            let bucket = ((a.at - due).num_milliseconds().max(0) / 100) as usize;
            if per_100ms.len() <= bucket {
                per_100ms.resize(bucket + 1, 0);
            }
            per_100ms[bucket] += 1;
        }
        self.bursts.retain(|s| s.label != label);
        self.bursts.push(BurstSeries { label: label.into(), per_100ms });
    }

    pub fn lateness_series(&mut self, label: &str, sorted_ms: Vec<f64>) {
        let quantiles_ms = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0].iter().map(|&q| (q, percentile(&sorted_ms, q))).collect();
        self.lateness.retain(|s| s.label != label);
        self.lateness.push(LatenessSeries { label: label.into(), quantiles_ms, sorted_ms });
    }

    /// The timeline of a neighbour's steady from `from` (its first due time) beside a herd
    /// due at `herd_due`: the herd's callbacks by arrival, the neighbour's by due time.
    pub fn herd_timeline(&mut self, label: &str, from: DateTime<Utc>, herd_due: DateTime<Utc>, herd: &[Arrival], neighbour: &[Arrival]) {
        let bucket = |at: DateTime<Utc>| ((at - from).num_milliseconds().max(0) / 100) as usize;
        let mut herd_callbacks_per_100ms: Vec<u32> = Vec::new();
        for a in herd {
            let b = bucket(a.at);
            if herd_callbacks_per_100ms.len() <= b {
                herd_callbacks_per_100ms.resize(b + 1, 0);
            }
            herd_callbacks_per_100ms[b] += 1;
        }
        let mut neighbour_max_lateness_ms_per_100ms: Vec<f64> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for a in neighbour.iter().filter(|a| seen.insert(a.task_id)) {
            let b = bucket(a.run_at);
            if neighbour_max_lateness_ms_per_100ms.len() <= b {
                neighbour_max_lateness_ms_per_100ms.resize(b + 1, 0.0);
            }
            let late = (a.at - a.run_at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0;
            neighbour_max_lateness_ms_per_100ms[b] = neighbour_max_lateness_ms_per_100ms[b].max(late);
        }
        let herd_due_s = (herd_due - from).num_microseconds().unwrap_or(0) as f64 / 1e6;
        self.herd_timelines.retain(|t| t.label != label);
        self.herd_timelines.push(HerdTimeline { label: label.into(), herd_due_s, herd_callbacks_per_100ms, neighbour_max_lateness_ms_per_100ms });
    }

    pub fn print(&self) {
        let rows: Vec<[String; 7]> = self
            .figures
            .iter()
            .map(|f| {
                let target = match f.target {
                    Some(Target::AtLeast(t)) => format!(">= {}", fmt(t)),
                    Some(Target::AtMost(t)) => format!("<= {}", fmt(t)),
                    None => String::new(),
                };
                let runs = if f.runs.len() > 1 { f.runs.iter().map(|v| fmt(*v)).collect::<Vec<_>>().join(" / ") } else { String::new() };
                let met = match f.met {
                    Some(true) => "ok",
                    Some(false) => "MISSED",
                    None => "",
                };
                [f.scenario.clone(), f.nodes.to_string(), f.metric.clone(), format!("{} {}", fmt(f.median), f.unit), runs, target, met.into()]
            })
            .collect();
        let header = ["scenario", "nodes", "metric", "median", "runs", "target", ""].map(String::from);
        let mut widths = [0; 7];
        for row in std::iter::once(&header).chain(&rows) {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for row in std::iter::once(&header).chain(&rows) {
            let line: Vec<String> = row.iter().zip(widths).map(|(cell, w)| format!("{cell:w$}")).collect();
            println!("{}", line.join("  ").trim_end());
        }
    }

    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, serde_json::to_vec_pretty(self)?).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
    }

    /// Two charts side by side: callbacks per second through each burst, and the share of
    /// steady callbacks within each lateness.
    pub fn write_svg(&self, path: &Path) -> anyhow::Result<()> {
        const COLORS: [&str; 4] = ["#2563eb", "#dc2626", "#16a34a", "#9333ea"];
        let (w, h) = (460.0, 300.0);
        let mut svg = String::new();
        let _ = write!(svg, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{h}" font-family="sans-serif" font-size="11">"#, 2.0 * w);
        svg.push_str(r#"<rect width="100%" height="100%" fill="white"/>"#);

        let burst_lines: Vec<(String, Vec<(f64, f64)>)> = self
            .bursts
            .iter()
            .map(|s| {
                let points = s.per_100ms.iter().enumerate().map(|(i, &n)| (i as f64 / 10.0, f64::from(n) * 10.0)).collect();
                (s.label.clone(), points)
            })
            .collect();
        chart(&mut svg, 0.0, (w, h), "burst: callbacks per second", "seconds after due", &burst_lines, &COLORS);

        let lateness_lines: Vec<(String, Vec<(f64, f64)>)> = self
            .lateness
            .iter()
            .map(|s| {
                let n = s.sorted_ms.len() as f64;
                // Up to p99.9: the last few points would stretch the axis and hide the rest.
                let shown = ((n * 0.999).ceil() as usize).min(s.sorted_ms.len());
                let step = (shown / 400).max(1);
                let points = s.sorted_ms[..shown].iter().enumerate().step_by(step).map(|(i, &v)| (v, 100.0 * (i + 1) as f64 / n)).collect();
                (s.label.clone(), points)
            })
            .collect();
        chart(&mut svg, w, (w, h), "steady: % of callbacks within a lateness (to p99.9)", "lateness, ms", &lateness_lines, &COLORS);
        svg.push_str("</svg>\n");
        std::fs::write(path, svg).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
    }
}

/// One line chart at horizontal offset `x0`, axes from zero to the largest value.
fn chart(svg: &mut String, x0: f64, (w, h): (f64, f64), title: &str, x_label: &str, lines: &[(String, Vec<(f64, f64)>)], colors: &[&str]) {
    let (left, right, top, bottom) = (x0 + 55.0, x0 + w - 15.0, 30.0, h - 40.0);
    let (step_x, max_x) = axis(lines.iter().flat_map(|(_, p)| p.iter().map(|p| p.0)).fold(0.0, f64::max));
    let (step_y, max_y) = axis(lines.iter().flat_map(|(_, p)| p.iter().map(|p| p.1)).fold(0.0, f64::max));
    let sx = |x: f64| left + (right - left) * x / max_x;
    let sy = |y: f64| bottom - (bottom - top) * y / max_y;
    let _ = write!(svg, r#"<text x="{}" y="16" font-size="13" font-weight="bold">{title}</text>"#, left);
    let _ = write!(svg, r##"<path d="M{left},{top}V{bottom}H{right}" fill="none" stroke="#555"/>"##);
    for i in 0..=(max_x / step_x).round() as u32 {
        let v = step_x * f64::from(i);
        let _ = write!(svg, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, sx(v), bottom + 14.0, tick(v, step_x));
    }
    for i in 0..=(max_y / step_y).round() as u32 {
        let v = step_y * f64::from(i);
        let _ = write!(svg, r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#, left - 4.0, sy(v) + 4.0, tick(v, step_y));
    }
    let _ = write!(svg, r#"<text x="{}" y="{}" text-anchor="middle">{x_label}</text>"#, (left + right) / 2.0, h - 8.0);
    for (i, (label, points)) in lines.iter().enumerate() {
        let color = colors[i % colors.len()];
        let d: Vec<String> = points.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y))).collect();
        let _ = write!(svg, r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.5"/>"#, d.join(" "));
        let _ = write!(svg, r#"<text x="{}" y="{}" fill="{color}">{}</text>"#, right - 150.0, top + 14.0 * (i as f64 + 1.0), escape(label));
    }
}

/// A tick step of 1, 2 or 5 times a power of ten giving at most 5 steps, and the axis end.
fn axis(max: f64) -> (f64, f64) {
    let max = if max > 0.0 { max } else { 1.0 };
    let magnitude = 10f64.powf((max / 5.0).log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * magnitude).find(|s| max / s <= 5.0).unwrap_or(10.0 * magnitude);
    (step, (max / step - 1e-9).ceil() * step)
}

/// A tick label: whole numbers when the step is.
fn tick(v: f64, step: f64) -> String {
    if step >= 1.0 && v.abs() < 100.0 { format!("{v:.0}") } else { fmt(v) }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Thousands separated above 100, one decimal below 100, two below 10.
fn fmt(v: f64) -> String {
    if v.abs() >= 100.0 {
        let digits = format!("{:.0}", v.abs());
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        if v < 0.0 { format!("-{out}") } else { out }
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_easily() {
        assert_eq!(fmt(15234.4), "15,234");
        assert_eq!(fmt(1_000_000.0), "1,000,000");
        assert_eq!(fmt(123.0), "123");
        assert_eq!(fmt(12.34), "12.3");
        assert_eq!(fmt(1.234), "1.23");
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(axis(13_210.0), (5000.0, 15_000.0));
        assert_eq!(axis(100.0), (20.0, 100.0));
        assert_eq!(axis(0.4), (0.1, 0.4));
    }

    #[test]
    fn a_herd_timeline_buckets_the_herd_by_arrival_and_the_neighbour_by_due_time() {
        let from: DateTime<Utc> = "2026-11-26T00:00:00Z".parse().unwrap();
        let at = |ms: i64| from + chrono::TimeDelta::milliseconds(ms);
        let arrival = |due: i64, came: i64| Arrival { task_id: uuid::Uuid::new_v4(), run_at: at(due), at: at(came), attempt: 1, delivered: true };
        let herd = [arrival(150, 160), arrival(150, 170), arrival(150, 420)];
        let mut b = vec![arrival(0, 2), arrival(110, 190), arrival(120, 125), arrival(330, 331)];
        // A repeat of a task is not its lateness.
        b.push(Arrival { at: at(900), ..b[3] });
        let args = <crate::cli::Cli as clap::Parser>::parse_from(["chime", "bench"]);
        let crate::cli::Tool::Bench(args) = args.command else { unreachable!() };
        let mut report = Report::new(&args);
        report.herd_timeline("t", from, at(150), &herd, &b);
        let t = &report.herd_timelines[0];
        assert_eq!(t.herd_due_s, 0.15);
        assert_eq!(t.herd_callbacks_per_100ms, [0, 2, 0, 0, 1]);
        assert_eq!(t.neighbour_max_lateness_ms_per_100ms, [2.0, 80.0, 0.0, 1.0]);
    }
}
