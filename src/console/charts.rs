//! Small charts drawn on the server as SVG: no script, and they print.

use std::fmt::Write;

/// Stacked bars, one per minute: delivered (green) under failed (red). `points` is
/// (delivered, failed) per bar, oldest first, the last bar the minute starting at `last`.
/// Bars are drawn against the busiest bar, or `scale` attempts a minute where that is more
/// (the caller's: the dashboard's shared scale, so that rows compare), written at the top
/// of the chart beside a line at that height, with 0 at its foot. Under the bars, a time
/// axis: the minutes every quarter of the way (UTC), and "now" at the right.
pub fn minute_bars(points: &[(i64, i64)], scale: i64, last: chrono::DateTime<chrono::Utc>) -> String {
    const W: f64 = 240.0;
    const H: f64 = 48.0;
    /// Room above the bars for the top line, right of them for the scale's labels, and
    /// below them for the time axis.
    const TOP: f64 = 4.0;
    const LABELS: f64 = 56.0;
    const AXIS: f64 = 13.0;
    let max = points.iter().map(|(d, f)| d + f).max().unwrap_or(0).max(scale).max(1) as f64;
    let bar = W / points.len().max(1) as f64;
    let (width, height, foot) = (W + LABELS, H + TOP + AXIS, H + TOP);
    let mut svg = format!(
        r#"<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="attempts per minute, the last hour to {} UTC, against a scale of {max}/min">"#,
        last.format("%H:%M")
    );
    let _ = write!(svg, r#"<line x1="0" y1="{TOP}" x2="{W}" y2="{TOP}" class="grid"/>"#);
    let _ = write!(svg, r#"<line x1="0" y1="{foot}" x2="{W}" y2="{foot}" class="axis"/>"#);
    let _ = write!(svg, r#"<text x="{}" y="{}" class="scale">{max}/min</text>"#, W + 4.0, TOP + 8.0);
    let _ = write!(svg, r#"<text x="{}" y="{foot}" class="scale">0</text>"#, W + 4.0);
    // Ticks at the start of the first bar and every quarter after it; the last is now.
    let n = points.len();
    for tick in 0..4 {
        let i = tick * n / 4;
        let x = i as f64 * bar;
        let at = last - chrono::Duration::minutes((n - 1 - i) as i64);
        let anchor = if tick == 0 { "start" } else { "middle" };
        let _ = write!(svg, r#"<line x1="{x:.1}" y1="{foot}" x2="{x:.1}" y2="{}" class="axis"/>"#, foot + 3.0);
        let _ = write!(svg, r#"<text x="{x:.1}" y="{}" text-anchor="{anchor}" class="time">{}</text>"#, height - 1.0, at.format("%H:%M"));
    }
    let _ = write!(svg, r#"<text x="{W}" y="{}" text-anchor="end" class="time">now</text>"#, height - 1.0);
    for (i, (delivered, failed)) in points.iter().enumerate() {
        let x = i as f64 * bar;
        let hd = *delivered as f64 / max * H;
        let hf = *failed as f64 / max * H;
        let w = (bar - 0.5).max(0.5);
        if hd > 0.0 {
            let _ = write!(
                svg,
                r#"<rect x="{x:.1}" y="{:.1}" width="{w:.1}" height="{hd:.1}" class="ok"><title>{delivered} delivered</title></rect>"#,
                foot - hd
            );
        }
        if hf > 0.0 {
            let _ = write!(
                svg,
                r#"<rect x="{x:.1}" y="{:.1}" width="{w:.1}" height="{hf:.1}" class="bad"><title>{failed} failed</title></rect>"#,
                foot - hd - hf
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(hm: &str) -> chrono::DateTime<chrono::Utc> {
        format!("2026-11-27T{hm}:00Z").parse().unwrap()
    }

    #[test]
    fn bars_scale_to_the_busiest_minute() {
        let svg = minute_bars(&[(0, 0), (10, 0), (5, 5)], 0, at("14:05"));
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("class=\"ok\"").count(), 2);
        assert_eq!(svg.matches("class=\"bad\"").count(), 1);
        assert!(svg.contains(r#"height="48.0" class="ok""#), "the busiest bar is full height: {svg}");
        assert!(svg.contains(">10/min</text>"), "{svg}");
    }

    #[test]
    fn a_shared_scale_is_written_and_bars_drawn_against_it() {
        let svg = minute_bars(&[(10, 0), (5, 5)], 40, at("14:05"));
        assert!(svg.contains(">40/min</text>") && svg.contains(">0</text>"), "{svg}");
        assert!(svg.contains(r#"height="12.0" class="ok""#), "10 of 40 is a quarter of 48: {svg}");
        assert!(!svg.contains(r#"height="48.0""#), "{svg}");
    }

    #[test]
    fn an_hour_of_bars_has_a_time_axis() {
        let svg = minute_bars(&[(1, 0); 60], 0, at("14:05"));
        let times: Vec<&str> = svg.split("class=\"time\">").skip(1).map(|t| t.split('<').next().unwrap()).collect();
        assert_eq!(times, ["13:06", "13:21", "13:36", "13:51", "now"], "{svg}");
        assert!(svg.contains("the last hour to 14:05 UTC"), "{svg}");
    }
}
