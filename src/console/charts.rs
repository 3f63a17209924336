//! Small charts drawn on the server as SVG: no script, and they print.

use std::fmt::Write;

/// Stacked bars, one per minute: delivered (green) under failed (red). `points` is
/// (delivered, failed) per bar, oldest first.
pub fn minute_bars(points: &[(i64, i64)]) -> String {
    const W: f64 = 240.0;
    const H: f64 = 48.0;
    let max = points.iter().map(|(d, f)| d + f).max().unwrap_or(0).max(1) as f64;
    let bar = W / points.len().max(1) as f64;
    let mut svg = format!(
        r#"<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="deliveries and failures per minute, last hour">"#
    );
    let _ = write!(svg, r#"<line x1="0" y1="{H}" x2="{W}" y2="{H}" class="axis"/>"#);
    for (i, (delivered, failed)) in points.iter().enumerate() {
        let x = i as f64 * bar;
        let hd = *delivered as f64 / max * H;
        let hf = *failed as f64 / max * H;
        let w = (bar - 0.5).max(0.5);
        if hd > 0.0 {
            let _ = write!(svg, r#"<rect x="{x:.1}" y="{:.1}" width="{w:.1}" height="{hd:.1}" class="ok"><title>{delivered} delivered</title></rect>"#, H - hd);
        }
        if hf > 0.0 {
            let _ = write!(svg, r#"<rect x="{x:.1}" y="{:.1}" width="{w:.1}" height="{hf:.1}" class="bad"><title>{failed} failed</title></rect>"#, H - hd - hf);
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
        let svg = minute_bars(&[(0, 0), (10, 0), (5, 5)]);
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("class=\"ok\"").count(), 2);
        assert_eq!(svg.matches("class=\"bad\"").count(), 1);
        assert!(svg.contains(r#"height="48.0" class="ok""#), "the busiest bar is full height: {svg}");
    }
}
