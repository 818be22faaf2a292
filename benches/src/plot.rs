//! Line and bar charts of benchmark results, as SVG and PNG (plotters), with the
//! DejaVu Sans font from Debian's `fonts-dejavu-core` (installed by
//! `scripts/install-services.sh`).

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::CoordTranslate;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

/// Where the font is read from.
pub const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// One curve: its label and its points.
pub type Series = (String, Vec<(f64, f64)>);

/// Registers the font once, as plotters' `sans-serif` (criterion's charts use
/// it too: plotters draws text only with a registered font once this crate
/// turns on its `ab_glyph` feature); an error says how to install it.
pub fn font() -> Result<(), String> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let bytes = std::fs::read(FONT_PATH).map_err(|e| {
            format!("cannot read the chart font {FONT_PATH} ({e}); run scripts/install-services.sh (Debian package fonts-dejavu-core)")
        })?;
        plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
            .map_err(|_| format!("{FONT_PATH} is not a usable font"))
    })
    .clone()
}

/// A line chart of `series` over log-scaled axes, written to `<stem>.svg`
/// and `<stem>.png`.
pub fn log_log_chart(
    stem: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), String> {
    font()?;
    let (x, y) = log_ranges(title, series.iter())?;
    let labels = Labels {
        title,
        x_label,
        y_label,
        legend: true,
    };
    labels.draw(
        SVGBackend::new(&stem.with_extension("svg"), (960, 600)).into_drawing_area(),
        x.clone().log_scale(),
        y.clone().log_scale(),
        series,
    )?;
    labels.draw(
        BitMapBackend::new(&stem.with_extension("png"), (960, 600)).into_drawing_area(),
        x.log_scale(),
        y.log_scale(),
        series,
    )
}

/// Line charts side by side over the same log-scaled axes, one per entry of
/// `panels` (its title, its series; the legend in the first), under one
/// `title`; written to `<stem>.svg` and `<stem>.png`.
pub fn log_log_panels(
    stem: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    panels: &[(String, Vec<Series>)],
) -> Result<(), String> {
    font()?;
    let (x, y) = log_ranges(title, panels.iter().flat_map(|(_, s)| s.iter()))?;
    let size = (40 + 520 * panels.len().max(1) as u32, 640);
    let words = (title, x_label, y_label);
    draw_panels(
        SVGBackend::new(&stem.with_extension("svg"), size).into_drawing_area(),
        words,
        (x.clone(), y.clone()),
        panels,
    )?;
    draw_panels(
        BitMapBackend::new(&stem.with_extension("png"), size).into_drawing_area(),
        words,
        (x, y),
        panels,
    )
}

/// The panels of [`log_log_panels`] on `area`, under `(title, x_label,
/// y_label)`.
fn draw_panels<DB: DrawingBackend>(
    area: DrawingArea<DB, plotters::coord::Shift>,
    (title, x_label, y_label): (&str, &str, &str),
    (x, y): (LogRange, LogRange),
    panels: &[(String, Vec<Series>)],
) -> Result<(), String> {
    let failed = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("{title}: {e:?}");
    area.fill(&WHITE).map_err(failed)?;
    let area = area.titled(title, ("sans-serif", 22)).map_err(failed)?;
    let cells = area.split_evenly((1, panels.len().max(1)));
    for (i, (cell, (name, series))) in cells.into_iter().zip(panels).enumerate() {
        let labels = Labels {
            title: name,
            x_label,
            y_label,
            legend: i == 0,
        };
        labels.draw(cell, x.clone().log_scale(), y.clone().log_scale(), series)?;
    }
    Ok(())
}

/// Log-scaled axes that fit every point of `series`, with a margin.
fn log_ranges<'a>(
    title: &str,
    series: impl Iterator<Item = &'a Series>,
) -> Result<(LogRange, LogRange), String> {
    let (mut x_min, mut x_max, mut y_min, mut y_max) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in series.flat_map(|(_, p)| p.iter()) {
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    if x_min > x_max {
        return Err(format!("{title}: nothing to plot"));
    }
    Ok((
        (x_min * 0.8).max(1e-9)..x_max * 1.25,
        (y_min * 0.5).max(1e-9)..y_max * 2.0,
    ))
}

/// An axis's range, log-scaled where it is drawn.
type LogRange = std::ops::Range<f64>;

/// The words of one line chart, and whether it draws the legend.
struct Labels<'a> {
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    legend: bool,
}

impl Labels<'_> {
    fn draw<DB: DrawingBackend, X, Y>(
        &self,
        area: DrawingArea<DB, plotters::coord::Shift>,
        x: X,
        y: Y,
        series: &[Series],
    ) -> Result<(), String>
    where
        X: AsRangedCoord<Value = f64>,
        Y: AsRangedCoord<Value = f64>,
        X::CoordDescType: ValueFormatter<f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        let Labels {
            title,
            x_label,
            y_label,
            legend,
        } = *self;
        let failed = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("{title}: {e:?}");
        area.fill(&WHITE).map_err(failed)?;
        let mut chart = ChartBuilder::on(&area)
            .caption(title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d(x, y)
            .map_err(failed)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(failed)?;
        for (i, (label, points)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(failed)?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(failed)?;
        }
        if legend {
            finish(&mut chart, &area, title)
        } else {
            area.present().map_err(failed)
        }
    }
}

/// A tick's label: at most three decimals, none trailing (`0.3`, `1000`).
fn tick(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// Draws the legend in the upper right corner and presents the picture.
fn finish<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
) -> Result<(), String> {
    let failed = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("{title}: {e:?}");
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(failed)?;
    area.present().map_err(failed)
}

/// One group of bars: its label and one value per bar series (`None`: no bar).
pub type BarGroup = (String, Vec<Option<f64>>);

/// Grouped bars over a log-scaled value axis, one group per entry of
/// `groups` and one bar of each of `series` in it, with a dashed line at
/// `reference` (e.g. 1 for ratios); written to `<stem>.svg` and `<stem>.png`.
pub fn bar_chart(
    stem: &Path,
    title: &str,
    y_label: &str,
    series: &[&str],
    groups: &[BarGroup],
    reference: f64,
) -> Result<(), String> {
    font()?;
    let values = groups.iter().flat_map(|(_, v)| v.iter().flatten().copied());
    let (min, max) = values.fold((reference, reference), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if groups.is_empty() || min <= 0.0 {
        return Err(format!("{title}: nothing to plot"));
    }
    // Room above the tallest bar for the legend.
    let y = (min * 0.8..max * 2.5).log_scale();
    let svg = stem.with_extension("svg");
    let png = stem.with_extension("png");
    let size = (160 + 90 * groups.len() as u32, 600);
    let bars = Bars {
        title,
        y_label,
        series,
        groups,
        reference,
    };
    bars.draw(SVGBackend::new(&svg, size).into_drawing_area(), y.clone())?;
    bars.draw(BitMapBackend::new(&png, size).into_drawing_area(), y)
}

struct Bars<'a> {
    title: &'a str,
    y_label: &'a str,
    series: &'a [&'a str],
    groups: &'a [BarGroup],
    reference: f64,
}

impl Bars<'_> {
    fn draw<DB: DrawingBackend, Y>(
        &self,
        area: DrawingArea<DB, plotters::coord::Shift>,
        y: Y,
    ) -> Result<(), String>
    where
        Y: AsRangedCoord<Value = f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        let failed = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("{}: {e:?}", self.title);
        area.fill(&WHITE).map_err(failed)?;
        let n = self.groups.len();
        let mut chart = ChartBuilder::on(&area)
            .caption(self.title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(60)
            .y_label_area_size(72)
            .build_cartesian_2d(0.0..n as f64, y)
            .map_err(failed)?;
        let labels = |x: &f64| {
            let i = x.floor() as usize;
            match self.groups.get(i) {
                Some((label, _)) if (x - i as f64 - 0.5).abs() < 1e-6 => label.clone(),
                _ => String::new(),
            }
        };
        let floor = chart.y_range().start;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(2 * n + 1)
            .x_label_formatter(&labels)
            .y_desc(self.y_label)
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(failed)?;
        let width = 0.8 / self.series.len().max(1) as f64;
        for (s, name) in self.series.iter().enumerate() {
            let color = Palette99::pick(s).to_rgba();
            let bars = self
                .groups
                .iter()
                .enumerate()
                .filter_map(|(i, (_, values))| {
                    let value = (*values.get(s)?)?;
                    let x0 = i as f64 + 0.1 + s as f64 * width;
                    Some(Rectangle::new(
                        [(x0, floor), (x0 + width * 0.9, value)],
                        color.filled(),
                    ))
                });
            chart
                .draw_series(bars)
                .map_err(failed)?
                .label(*name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled())
                });
        }
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, self.reference), (n as f64, self.reference)],
                6,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(failed)?;
        finish(&mut chart, &area, self.title)
    }
}
