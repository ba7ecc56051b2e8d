//! SVG chart of a `thaw sim --compare` run (plotters, SVG backend).

use std::path::Path;

use plotters::coord::ranged1d::Ranged;
use plotters::prelude::*;

use crate::placement::Policy;
use crate::sim::SimReport;

const FONT: &str = "sans-serif";

fn color(p: Policy) -> RGBColor {
    match p {
        Policy::Random => RGBColor(120, 120, 120),
        Policy::LeastLoaded => RGBColor(255, 127, 14),
        Policy::Hash => RGBColor(148, 103, 189),
        Policy::Thaw => RGBColor(31, 119, 180),
    }
}

fn e<E: std::fmt::Debug>(err: E) -> String {
    format!("{err:?}")
}

/// Three panels over the node count (log x): cold-start cache hit ratio, bytes fetched
/// from the store, busiest node's load over the mean; one line per policy.
pub fn comparison(path: &Path, reports: &[SimReport]) -> Result<(), String> {
    type Metric = (&'static str, fn(&SimReport) -> f64);
    let metrics: [Metric; 3] = [
        ("cold-start cache hit ratio (%)", |r| 100.0 * r.hit_ratio),
        ("bytes fetched from the store (GiB)", |r| r.store_bytes as f64 / (1u64 << 30) as f64),
        ("busiest node's load / mean", |r| r.max_load_over_mean),
    ];
    let root = SVGBackend::new(path, (1200, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let (title, body) = root.split_vertically(40);
    let cf = reports.first().map(|r| r.cache_fraction * 100.0).unwrap_or(0.0);
    let fns = reports.first().map(|r| r.functions).unwrap_or(0);
    title
        .draw_text(
            &format!("thaw sim: {fns} functions, per-node cache {cf:.0}% of all snapshot bytes"),
            &(FONT, 18).into_font().color(&BLACK),
            (10, 10),
        )
        .map_err(e)?;
    let xmax = reports.iter().map(|r| r.nodes).max().unwrap_or(10).max(10) as f64 * 1.5;
    let xmin = reports.iter().map(|r| r.nodes).min().unwrap_or(10).max(1) as f64 / 1.5;
    for (i, (panel, (label, get))) in body.split_evenly((1, 3)).iter().zip(metrics).enumerate() {
        let vals: Vec<f64> = reports.iter().map(get).collect();
        let ymax = vals.iter().copied().fold(0.0, f64::max);
        let builder = |label| {
            let mut b = ChartBuilder::on(panel);
            b.caption(label, (FONT, 15)).margin(12).x_label_area_size(35).y_label_area_size(55);
            b
        };
        if i == 0 {
            // Hit ratio: linear 0-100 %.
            let mut chart = builder(label).build_cartesian_2d((xmin..xmax).log_scale(), 0.0..100.0).map_err(e)?;
            chart.configure_mesh().x_desc("nodes").x_label_formatter(&|x| format!("{x:.0}")).draw().map_err(e)?;
            lines(&mut chart, reports, get)?;
        } else {
            // Store bytes and max/mean span orders of magnitude between policies: log y.
            let ymin = vals.iter().copied().filter(|v| *v > 0.0).fold(f64::MAX, f64::min).min(1.0) / 1.5;
            let mut chart = builder(&format!("{label}, log")).build_cartesian_2d((xmin..xmax).log_scale(), (ymin..ymax * 1.5).log_scale()).map_err(e)?;
            chart.configure_mesh().x_desc("nodes").x_label_formatter(&|x| format!("{x:.0}")).y_label_formatter(&|y| if *y >= 10.0 { format!("{y:.0}") } else { format!("{y:.2}") }).draw().map_err(e)?;
            lines(&mut chart, reports, get)?;
        }
    }
    root.present().map_err(e)?;
    Ok(())
}

/// One line (and its points) per policy, and the legend.
fn lines<'a, DB, Y>(chart: &mut ChartContext<'a, DB, Cartesian2d<LogCoord<f64>, Y>>, reports: &[SimReport], get: fn(&SimReport) -> f64) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64>,
{
    for p in Policy::ALL {
        let pts: Vec<(f64, f64)> = reports.iter().filter(|r| r.policy == p).map(|r| (r.nodes as f64, get(r))).collect();
        let c = color(p);
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(e)?
            .label(p.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|xy| Circle::new(xy, 3, c.filled()))).map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}
