//! Renderings of measurements: JSON for tools, Markdown for people, SVG for a glance.

use std::fmt::Write as _;

use crate::geomean;
use crate::measure::Measurement;
use crate::suite::WORKLOADS;

fn category(name: &str) -> &'static str {
    WORKLOADS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("", |(_, c)| c.label())
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn json_list(v: &[f64]) -> String {
    let items: Vec<String> = v.iter().map(|x| format!("{x:.6}")).collect();
    format!("[{}]", items.join(","))
}

/// All measurements as JSON, with the geometric mean of the median ratios.
pub fn json(ms: &[Measurement]) -> String {
    let rows: Vec<String> = ms
        .iter()
        .map(|m| {
            format!(
                "{{\"name\":{},\"category\":{},\"native_s\":{},\"hira_s\":{},\"ratio_median\":{:.4},\"ratio_min\":{:.4},\"ratio_max\":{:.4},\"calls\":{},\"bytes_sent\":{},\"bytes_received\":{},\"native_verified\":{},\"hira_verified\":{},\"outputs_match\":{}}}",
                json_str(&m.name),
                json_str(category(&m.name)),
                json_list(&m.native),
                json_list(&m.hira),
                m.median_ratio(),
                m.min_ratio(),
                m.max_ratio(),
                m.calls,
                m.bytes_sent,
                m.bytes_received,
                m.native_ok,
                m.hira_ok,
                m.outputs_match
            )
        })
        .collect();
    let g = geomean(&ms.iter().map(Measurement::median_ratio).collect::<Vec<_>>());
    format!(
        "{{\"workloads\":[{}],\"geomean_ratio\":{g:.4}}}\n",
        rows.join(",")
    )
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// A Markdown table: one row per program and the geometric mean.
pub fn markdown(ms: &[Measurement]) -> String {
    let mut s = String::from(
        "| workload | category | native (s) | Hira (s) | slowdown median | min | max | calls | bytes to host | bytes back | verified |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for m in ms {
        let _ = writeln!(
            s,
            "| {} | {} | {:.3} | {:.3} | {:.2}x | {:.2} | {:.2} | {} | {} | {} | {} |",
            m.name,
            category(&m.name),
            m.median_native(),
            m.median_hira(),
            m.median_ratio(),
            m.min_ratio(),
            m.max_ratio(),
            m.calls,
            human_bytes(m.bytes_sent),
            human_bytes(m.bytes_received),
            if m.verified() { "yes" } else { "NO" }
        );
    }
    let g = geomean(&ms.iter().map(Measurement::median_ratio).collect::<Vec<_>>());
    let _ = writeln!(s, "| **geometric mean** | | | | **{g:.2}x** | | | | | | |");
    s
}

/// A horizontal bar chart of median slowdowns with min-max whiskers.
pub fn svg(ms: &[Measurement]) -> String {
    let (w, row, left, top) = (720.0, 28.0, 110.0, 40.0);
    let h = top + row * ms.len() as f64 + 40.0;
    let max = ms
        .iter()
        .map(Measurement::max_ratio)
        .fold(1.0f64, f64::max)
        .ceil()
        .max(2.0);
    let x = |r: f64| left + (w - left - 30.0) * r / max;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{left}\" y=\"20\" font-size=\"14\">Slowdown through Hira (Hira time / native time, median with min-max)</text>\n"
    );
    for t in 0..=(max as usize) {
        let xt = x(t as f64);
        let _ = writeln!(
            s,
            "<line x1=\"{xt}\" y1=\"{top}\" x2=\"{xt}\" y2=\"{}\" stroke=\"{}\"/><text x=\"{xt}\" y=\"{}\" text-anchor=\"middle\">{t}x</text>",
            h - 30.0,
            if t == 1 { "#888" } else { "#ddd" },
            h - 15.0
        );
    }
    for (i, m) in ms.iter().enumerate() {
        let y = top + row * i as f64;
        let colour = if m.verified() { "#4a7fb5" } else { "#c0392b" };
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text><rect x=\"{left}\" y=\"{}\" width=\"{:.1}\" height=\"{}\" fill=\"{colour}\"/><line x1=\"{:.1}\" y1=\"{}\" x2=\"{:.1}\" y2=\"{}\" stroke=\"black\"/><text x=\"{:.1}\" y=\"{}\">{:.2}x</text>",
            left - 8.0,
            y + 17.0,
            m.name,
            y + 6.0,
            x(m.median_ratio()) - left,
            row - 12.0,
            x(m.min_ratio()),
            y + 12.0,
            x(m.max_ratio()),
            y + 12.0,
            x(m.max_ratio()) + 6.0,
            y + 17.0,
            m.median_ratio()
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, ratios: &[f64]) -> Measurement {
        Measurement {
            calls: 10,
            bytes_sent: 2048,
            ..Measurement::with_ratios(name, ratios)
        }
    }

    #[test]
    fn markdown_has_a_row_per_workload_and_the_geomean() {
        let t = markdown(&[m("gaussian", &[2.0]), m("nn", &[8.0])]);
        assert!(t.contains("| gaussian | interposition-dominant |"));
        assert!(t.contains("| 2.0 KiB |"));
        assert!(t.contains("**4.00x**"));
    }

    #[test]
    fn json_escapes_names() {
        let j = json(&[m("a\"b", &[1.0])]);
        assert!(j.contains("\"name\":\"a\\\"b\""));
        assert!(j.ends_with("\"geomean_ratio\":1.0000}\n"));
    }

    #[test]
    fn svg_draws_one_bar_per_workload() {
        let s = svg(&[m("a", &[1.5]), m("b", &[2.5])]);
        assert_eq!(s.matches("<rect x=").count(), 2);
        assert!(s.starts_with("<svg"));
    }
}
