//! Small charts drawn on the server as SVG: no script, and they print.

use std::fmt::Write;

/// Stacked bars, one per minute: delivered (green) under failed (red). `points` is
/// (delivered, failed) per bar, oldest first. Bars are drawn against `scale` attempts a
/// minute (the caller's: the dashboard gives every row the same, so that rows compare),
/// written at the top of the chart beside a line at that height, with 0 at its foot.
pub fn minute_bars(points: &[(i64, i64)], scale: i64) -> String {
    const W: f64 = 240.0;
    const H: f64 = 48.0;
    /// Room above the bars for the top line and right of them for the scale's labels.
    const TOP: f64 = 4.0;
    const LABELS: f64 = 56.0;
    let max = points.iter().map(|(d, f)| d + f).max().unwrap_or(0).max(scale).max(1) as f64;
    let bar = W / points.len().max(1) as f64;
    let (width, height, foot) = (W + LABELS, H + TOP, H + TOP);
    let mut svg = format!(
        r#"<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="attempts per minute, last hour, against a scale of {max}/min">"#
    );
    let _ = write!(svg, r#"<line x1="0" y1="{TOP}" x2="{W}" y2="{TOP}" class="grid"/>"#);
    let _ = write!(svg, r#"<line x1="0" y1="{foot}" x2="{W}" y2="{foot}" class="axis"/>"#);
    let _ = write!(svg, r#"<text x="{}" y="{}" class="scale">{max}/min</text>"#, W + 4.0, TOP + 8.0);
    let _ = write!(svg, r#"<text x="{}" y="{foot}" class="scale">0</text>"#, W + 4.0);
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

    #[test]
    fn bars_scale_to_the_busiest_minute() {
        let svg = minute_bars(&[(0, 0), (10, 0), (5, 5)], 0);
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("class=\"ok\"").count(), 2);
        assert_eq!(svg.matches("class=\"bad\"").count(), 1);
        assert!(svg.contains(r#"height="48.0" class="ok""#), "the busiest bar is full height: {svg}");
        assert!(svg.contains(">10/min</text>"), "{svg}");
    }

    #[test]
    fn a_shared_scale_is_written_and_bars_drawn_against_it() {
        let svg = minute_bars(&[(10, 0), (5, 5)], 40);
        assert!(svg.contains(">40/min</text>") && svg.contains(">0</text>"), "{svg}");
        assert!(svg.contains(r#"height="12.0" class="ok""#), "10 of 40 is a quarter of 48: {svg}");
        assert!(!svg.contains(r#"height="48.0""#), "{svg}");
    }
}
