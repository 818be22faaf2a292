//! A run's timeline as an SVG picture: one row per worker, its critical
//! sections as bars (green: completed; amber: overlapped another worker's;
//! grey: abandoned or failed), each write as a tick (a red cross where the
//! resource rejected it), faults as shaded bands.

use std::fmt::Write as _;

use crate::record::{Micros, Trace};
use crate::section::{overlapping_pairs, sections};

const WIDTH: f64 = 960.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 56.0;
const ROW: f64 = 28.0;
const BAR: f64 = 14.0;
const BOTTOM: f64 = 72.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Draws `trace` with `title` on top.
pub fn svg(title: &str, trace: &Trace) -> String {
    let duration = trace.duration.max(1) as f64;
    let plot = WIDTH - LEFT - RIGHT;
    let x = |at: Micros| LEFT + at as f64 / duration * plot;
    let rows = trace.clients.max(1) as f64;
    let height = TOP + rows * ROW + BOTTOM;
    let bottom = TOP + rows * ROW;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, sans-serif" font-size="11">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="18" font-size="14" font-weight="bold">{}</text>"#,
        escape(title)
    );
    // Faults.
    for (i, fault) in trace.faults.iter().enumerate() {
        let start = x(fault.start);
        let end = x(fault.end).max(start + 2.0);
        let _ = writeln!(
            out,
            r##"<rect x="{start:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#607d8b" fill-opacity="0.22"/>"##,
            TOP - 6.0,
            end - start,
            bottom - TOP + 6.0
        );
        let _ = writeln!(
            out,
            r##"<text x="{start:.1}" y="{:.1}" fill="#37474f">⚡ {}</text>"##,
            34.0 + 12.0 * (i % 2) as f64,
            escape(&fault.label)
        );
    }
    // Rows.
    for client in 0..trace.clients {
        let y = TOP + f64::from(client) * ROW;
        let _ = writeln!(
            out,
            r##"<text x="8" y="{:.1}">worker {client}</text><line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#eeeeee"/>"##,
            y + BAR,
            WIDTH - RIGHT,
            y + ROW - 4.0,
            y + ROW - 4.0
        );
    }
    let sections = sections(trace);
    let mut overlapped = vec![false; sections.len()];
    for (a, b) in overlapping_pairs(&sections) {
        overlapped[a] = true;
        overlapped[b] = true;
    }
    for (section, overlapped) in sections.iter().zip(overlapped) {
        let Some(acquired) = section.acquired_at else {
            continue;
        };
        let end = section
            .ended_at
            .or_else(|| section.writes.last().map(|(at, _)| *at))
            .unwrap_or(trace.duration)
            .max(acquired);
        let y = TOP + f64::from(section.client) * ROW + 4.0;
        let fill = if overlapped {
            "#ffa000"
        } else if section.completed() {
            "#43a047"
        } else {
            "#9e9e9e"
        };
        let stroke = if overlapped {
            r##" stroke="#d50000" stroke-width="1.5""##
        } else {
            ""
        };
        let token = section
            .token
            .map_or_else(|| "no token".to_owned(), |t| format!("token {t}"));
        let _ = writeln!(
            out,
            r#"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{BAR}" fill="{fill}"{stroke}><title>worker {} section {} ({token})</title></rect>"#,
            x(acquired),
            (x(end) - x(acquired)).max(1.0),
            section.client,
            section.section,
        );
        for &(at, accepted) in &section.writes {
            let wx = x(at);
            if accepted {
                let _ = writeln!(
                    out,
                    r##"<line x1="{wx:.1}" x2="{wx:.1}" y1="{:.1}" y2="{:.1}" stroke="#1b5e20" stroke-width="1.5"/>"##,
                    y - 2.0,
                    y + BAR + 2.0
                );
            } else {
                let _ = writeln!(
                    out,
                    r##"<path d="M{:.1} {:.1} l8 8 m0 -8 l-8 8" stroke="#d50000" stroke-width="2"/>"##,
                    wx - 4.0,
                    y + BAR / 2.0 - 4.0
                );
            }
        }
    }
    // Time axis, a tick per second.
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" x2="{:.1}" y1="{bottom:.1}" y2="{bottom:.1}" stroke="#424242"/>"##,
        WIDTH - RIGHT
    );
    let seconds = (duration / 1e6).ceil() as u64;
    let every = (seconds / 20).max(1);
    for second in (0..=seconds).step_by(every as usize) {
        let tx = x(second * 1_000_000);
        if tx > WIDTH - RIGHT + 0.5 {
            break;
        }
        let _ = writeln!(
            out,
            r##"<line x1="{tx:.1}" x2="{tx:.1}" y1="{bottom:.1}" y2="{:.1}" stroke="#424242"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle">{second}s</text>"##,
            bottom + 4.0,
            bottom + 16.0
        );
    }
    // Legend, two lines.
    let swatch =
        |fill: &str| format!(r#"<rect x="0" y="-9" width="14" height="10" fill="{fill}"/>"#);
    let entries = [
        (0.0, 0.0, swatch("#43a047"), "completed section"),
        (
            170.0,
            0.0,
            r##"<rect x="0" y="-9" width="14" height="10" fill="#ffa000" stroke="#d50000"/>"##
                .to_owned(),
            "overlapped another worker's section",
        ),
        (
            440.0,
            0.0,
            swatch("#9e9e9e"),
            "lost / rejected write / not released",
        ),
        (
            0.0,
            16.0,
            r##"<path d="M3 -8 l8 8 m0 -8 l-8 8" stroke="#d50000" stroke-width="2"/>"##.to_owned(),
            "write rejected: its token was below the last accepted one",
        ),
        (
            440.0,
            16.0,
            r##"<rect x="0" y="-9" width="14" height="10" fill="#607d8b" fill-opacity="0.3"/>"##
                .to_owned(),
            "fault (from injection to heal)",
        ),
    ];
    for (dx, dy, mark, text) in entries {
        let _ = writeln!(
            out,
            r#"<g transform="translate({:.1} {:.1})">{mark}<text x="18" y="0">{}</text></g>"#,
            LEFT + dx,
            bottom + 36.0 + dy,
            escape(text)
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Fault, Kind, Record};

    #[test]
    fn draws_sections_writes_and_faults() {
        let trace = Trace {
            records: vec![
                Record {
                    at: 100_000,
                    client: 0,
                    section: 0,
                    kind: Kind::Acquired(Some(3)),
                },
                Record {
                    at: 200_000,
                    client: 0,
                    section: 0,
                    kind: Kind::Write {
                        token: Some(3),
                        index: 0,
                        accepted: false,
                    },
                },
            ],
            faults: vec![Fault {
                label: "a <fault>".into(),
                start: 150_000,
                end: 900_000,
            }],
            clients: 2,
            duration: 2_000_000,
            stores: vec![],
        };
        let svg = svg("redis — holder-paused", &trace);
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("a &lt;fault&gt;"));
        assert!(svg.contains("token 3"));
        // The rejected write is drawn as a cross.
        assert!(svg.contains("l8 8 m0 -8 l-8 8\" stroke=\"#d50000\" stroke-width=\"2\"/>\n"));
        assert!(svg.contains("worker 1"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
