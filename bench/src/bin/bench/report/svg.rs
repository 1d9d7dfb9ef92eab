//! chart.svg: a horizontal bar chart of GB/s per run, whiskers at min-max,
//! a dashed line at the line rate.

use crate::results::{Kind, Row};
use crate::summary::Summary;
use std::fmt::Write as _;

fn xml(v: &str) -> String {
    v.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Where the chart draws: the bars' left edge and width, each bar's height
/// and the gap below it, the first bar's top, and the GB/s at the right edge.
struct Frame {
    left: f64,
    width: f64,
    bar_h: f64,
    gap: f64,
    top: f64,
    max: f64,
}

impl Frame {
    /// The x of `v` GB/s.
    fn x(&self, v: f64) -> f64 {
        self.left + v / self.max * self.width
    }

    /// The y below the last of `bars` bars.
    fn bottom(&self, bars: usize) -> f64 {
        self.top + bars as f64 * (self.bar_h + self.gap)
    }
}

/// A horizontal bar chart of GB/s per run, whiskers at min-max, a line at the line rate.
pub fn svg(sm: &Summary) -> String {
    let bars: Vec<&Row> = std::iter::once(sm.line).chain(sm.rows).chain(sm.pytorch_rows).filter(|r| r.ok()).collect();
    let max = bars.iter().map(|r| r.gbps().max).fold(sm.line_rate, f64::max).max(1e-9) * 1.12;
    let f = Frame { left: 190.0, width: 640.0, bar_h: 20.0, gap: 8.0, top: 80.0, max };
    let height = f.bottom(bars.len()) + 60.0;
    let total_w = f.left + f.width + 130.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{height}" viewBox="0 0 {total_w} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    titles(&mut o, sm);
    for (i, r) in bars.iter().enumerate() {
        bar(&mut o, &f, f.top + i as f64 * (f.bar_h + f.gap), r, sm.line_rate);
    }
    axis(&mut o, &f, f.bottom(bars.len()), sm.line_rate);
    o.push_str("</svg>\n");
    o
}

/// The title, the subtitle and the colours' legend.
fn titles(o: &mut String, sm: &Summary) {
    let title = format!(
        "Host-to-device GB/s per strategy — {}{}",
        sm.gpu.name,
        if sm.gpu.emulated { " — EMULATED: not GPU measurements" } else { "" }
    );
    let _ = writeln!(o, r#"<text x="10" y="22" font-size="15" font-weight="bold">{}</text>"#, xml(&title));
    let sub = format!(
        "median of {} run(s) ({} for auto and ring-cache), whiskers min-max; dashed line: the line rate, {:.2} GB/s, \
         measured in the same run",
        sm.reps, sm.target_reps, sm.line_rate
    );
    let _ = writeln!(o, r##"<text x="10" y="42" fill="#444">{}</text>"##, xml(&sub));
    let mut lx = 10.0;
    for (color, what) in [
        ("#2b6cb0", "line rate"),
        ("#38a169", "file to GPU"),
        ("#a0aec0", "disk alone (O_DIRECT)"),
        ("#dd6b20", "PyTorch's row-by-row copy"),
        ("#805ad5", "KvikIO, same file"),
        ("#e53e3e", "data damaged"),
    ] {
        let _ = writeln!(
            o,
            r##"<rect x="{lx}" y="50" width="10" height="10" fill="{color}"/><text x="{}" y="59" fill="#444">{what}</text>"##,
            lx + 14.0
        );
        lx += 28.0 + what.len() as f64 * 6.5;
    }
}

/// One run's bar at `y`: its name, the median, the min-max whisker, the label.
fn bar(o: &mut String, f: &Frame, y: f64, r: &Row, line_rate: f64) {
    let (left, bar_h) = (f.left, f.bar_h);
    let g = r.gbps();
    let color = match r.kind {
        Kind::LineRate => "#2b6cb0",
        Kind::Disk => "#a0aec0",
        Kind::Rows => "#dd6b20",
        Kind::External => "#805ad5",
        Kind::Stream if r.intact.as_bool() == Some(false) => "#e53e3e",
        Kind::Stream => "#38a169",
    };
    let _ =
        writeln!(o, r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#, left - 8.0, y + bar_h * 0.72, xml(&r.name));
    let _ = writeln!(
        o,
        r#"<rect x="{left}" y="{y}" width="{:.1}" height="{bar_h}" fill="{color}"><title>{}</title></rect>"#,
        (f.x(g.median) - left).max(0.5),
        xml(&format!("{}: {:.2} GB/s ({})", r.name, g.median, r.what))
    );
    let ym = y + bar_h / 2.0;
    let (x0, x1) = (f.x(g.min), f.x(g.max));
    let _ = writeln!(
        o,
        r##"<line x1="{x0:.1}" x2="{x1:.1}" y1="{ym}" y2="{ym}" stroke="#222"/><line x1="{x0:.1}" x2="{x0:.1}" y1="{}" y2="{}" stroke="#222"/><line x1="{x1:.1}" x2="{x1:.1}" y1="{}" y2="{}" stroke="#222"/>"##,
        ym - 5.0,
        ym + 5.0,
        ym - 5.0,
        ym + 5.0
    );
    let label = if r.kind == Kind::Disk {
        format!("{:.2}", g.median)
    } else {
        format!("{:.2} ({:.2}x)", g.median, g.median / line_rate)
    };
    let _ = writeln!(o, r#"<text x="{:.1}" y="{}">{}</text>"#, x1 + 6.0, y + bar_h * 0.72, xml(&label));
}

/// The dashed line at the line rate, the axis at `bottom`, its ticks and its title.
fn axis(o: &mut String, f: &Frame, bottom: f64, line_rate: f64) {
    let (left, width, max) = (f.left, f.width, f.max);
    let lx = f.x(line_rate);
    let _ = writeln!(
        o,
        r##"<line x1="{lx:.1}" x2="{lx:.1}" y1="{}" y2="{bottom}" stroke="#2b6cb0" stroke-dasharray="5,4"/>"##,
        f.top - 8.0
    );
    let _ = writeln!(o, r##"<line x1="{left}" x2="{}" y1="{bottom}" y2="{bottom}" stroke="#888"/>"##, left + width);
    let step = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0].into_iter().find(|s| max / s <= 8.0).unwrap_or(200.0);
    let mut t = 0.0;
    while t <= max {
        let _ = writeln!(
            o,
            r##"<text x="{:.1}" y="{}" text-anchor="middle" fill="#444">{t}</text>"##,
            f.x(t),
            bottom + 16.0
        );
        t += step;
    }
    let _ = writeln!(
        o,
        r##"<text x="{}" y="{}" text-anchor="middle" fill="#444">GB/s (10^9 bytes per second)</text>"##,
        left + width / 2.0,
        bottom + 36.0
    );
}
