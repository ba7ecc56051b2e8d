//! SVG charts of a benchmark run (plotters, SVG backend only).
//!
//! Every function takes plain data so it can be tested without running anything.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

const FONT: &str = "sans-serif";

/// Colour of a mode (stable across charts).
pub fn mode_color(mode: &str) -> RGBColor {
    match mode {
        "boot" => RGBColor(120, 120, 120),
        "lazy" => RGBColor(214, 39, 40),
        "lazy-page" => RGBColor(227, 119, 194),
        "eager" => RGBColor(255, 127, 14),
        "record" => RGBColor(148, 103, 189),
        "parallel" => RGBColor(140, 86, 75),
        "ws-cached" => RGBColor(23, 190, 207),
        "prefetch" => RGBColor(31, 119, 180),
        "warm" => RGBColor(44, 160, 44),
        "prefetch-sealed" => RGBColor(106, 61, 154),
        "lazy-sealed" => RGBColor(177, 89, 40),
        "prefetch-pooled" | "burst-pooled" => RGBColor(0, 128, 128),
        "burst-each" => RGBColor(188, 189, 34),
        "burst-shared" => RGBColor(31, 60, 120),
        _ => RGBColor(0, 0, 0),
    }
}

fn lighter(c: RGBColor) -> RGBColor {
    let l = |v: u8| (v as u16 + (255 - v as u16) * 55 / 100) as u8;
    RGBColor(l(c.0), l(c.1), l(c.2))
}

fn short(mode: &str) -> &str {
    match mode {
        "record" => "rec",
        "parallel" => "par",
        "ws-cached" => "wsc",
        "prefetch" => "REAP",
        "prefetch-sealed" => "REAP+enc",
        "lazy-sealed" => "lazy+enc",
        "prefetch-pooled" => "REAP+pool",
        other => other,
    }
}

/// The series legend, boxed on a translucent background at `pos`.
fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    pos: SeriesLabelPosition,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    chart.configure_series_labels().position(pos).background_style(WHITE.mix(0.85)).border_style(BLACK).draw().map_err(e)
}

fn e<E: std::fmt::Debug>(err: E) -> anyhow::Error {
    anyhow!("drawing chart: {err:?}")
}

/// One function's bars in the latency breakdown: (mode, restore ms, first invocation ms).
#[derive(Debug, Clone)]
pub struct LatencyGroup {
    pub function: String,
    pub bars: Vec<(String, f64, f64)>,
}

/// Stacked bars per function (one panel each) and mode: restore (solid) + first invocation (light).
pub fn latency_breakdown(path: &Path, groups: &[LatencyGroup]) -> Result<()> {
    let cols = groups.len().clamp(1, 4);
    let rows = groups.len().div_ceil(cols).max(1);
    let root = SVGBackend::new(path, (330 * cols as u32, 60 + 290 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let (title, body) = root.split_vertically(60);
    title
        .draw_text(
            "Time to first response (median): restore (solid) + first invocation (light), ms",
            &(FONT, 17).into_font().color(&BLACK),
            (10, 8),
        )
        .map_err(e)?;
    title
        .draw_text(
            "rec = record, par = parallel, wsc = ws-cached, REAP = prefetch; warm = 2nd invocation only",
            &(FONT, 12).into_font().color(&BLACK),
            (10, 34),
        )
        .map_err(e)?;
    let panels = body.split_evenly((rows, cols));
    for (g, panel) in groups.iter().zip(panels.iter()) {
        let n = g.bars.len().max(1);
        let ymax = g.bars.iter().map(|b| b.1 + b.2).fold(0.0f64, f64::max).max(1e-3) * 1.12;
        let mut chart = ChartBuilder::on(panel)
            .caption(&g.function, (FONT, 15))
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(46)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..ymax)
            .map_err(e)?;
        let labels: Vec<String> = g.bars.iter().map(|b| short(&b.0).to_string()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n + 1)
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    labels.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .x_label_style((FONT, 10))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .max_light_lines(1)
            .y_desc("ms")
            .draw()
            .map_err(e)?;
        chart
            .draw_series(g.bars.iter().enumerate().map(|(i, b)| {
                let x = i as f64;
                Rectangle::new([(x - 0.38, 0.0), (x + 0.38, b.1)], mode_color(&b.0).filled())
            }))
            .map_err(e)?
            .label("restore")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], RGBColor(60, 60, 60).filled()));
        chart
            .draw_series(g.bars.iter().enumerate().map(|(i, b)| {
                let x = i as f64;
                Rectangle::new([(x - 0.38, b.1), (x + 0.38, b.1 + b.2)], lighter(mode_color(&b.0)).filled())
            }))
            .map_err(e)?
            .label("first invocation")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], RGBColor(190, 190, 190).filled()));
        chart
            .draw_series(g.bars.iter().enumerate().map(|(i, b)| {
                Text::new(format!("{:.0}", b.1 + b.2), (i as f64 - 0.3, b.1 + b.2 + ymax * 0.06), (FONT, 9))
            }))
            .map_err(e)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font((FONT, 10))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}

/// Page faults of the first invocation per function: lazy vs prefetch (log scale; 0 drawn as 1).
pub fn page_faults(path: &Path, data: &[(String, f64, f64)]) -> Result<()> {
    let data: Vec<(String, Vec<f64>)> = data.iter().map(|d| (d.0.clone(), vec![d.1, d.2])).collect();
    let modes = [("lazy", "lazy"), ("prefetch", "prefetch (REAP)")];
    grouped_bars(path, "Page faults served during the first invocation (median, log scale)", "page faults", &modes, &data, true)
}

/// Peak memory charged to an instance per function and start mode (MiB, medians).
pub fn memory(path: &Path, modes: &[(&str, &str)], data: &[(String, Vec<f64>)]) -> Result<()> {
    grouped_bars(path, "Peak memory of an instance up to its first response (median)", "MiB", modes, data, false)
}

/// One group of bars per function, one bar per mode (`modes`: mode for the colour,
/// legend label), labelled with its value. Log scale draws 0 as 1.
fn grouped_bars(path: &Path, caption: &str, y_desc: &str, modes: &[(&str, &str)], data: &[(String, Vec<f64>)], log: bool) -> Result<()> {
    let n = data.len().max(1);
    let m = modes.len().max(1) as f64;
    let root = SVGBackend::new(path, ((160 + (55 * modes.len() as u32 + 20) * n as u32).max(720), 460)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let top = data.iter().flat_map(|d| d.1.iter().copied()).fold(if log { 10.0 } else { 1.0 }, f64::max);
    let names: Vec<String> = data.iter().map(|d| d.0.clone()).collect();
    let label = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            names.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let width = 0.8 / m;
    let left = |k: usize, i: usize| i as f64 - 0.4 + k as f64 * width;
    macro_rules! draw {
        ($chart:expr, $base:expr, $top_of:expr, $label_y:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(n + 1)
                .x_label_formatter(&label)
                .y_label_formatter(&|y| format!("{y:.0}"))
                .max_light_lines(1)
                .y_desc(y_desc)
                .draw()
                .map_err(e)?;
            for (k, (mode, legend)) in modes.iter().enumerate() {
                let c = mode_color(mode);
                let vals: Vec<(usize, f64)> = data.iter().enumerate().filter_map(|(i, d)| d.1.get(k).map(|v| (i, *v))).collect();
                chart
                    .draw_series(vals.iter().map(|&(i, v)| {
                        Rectangle::new([(left(k, i) + 0.01, $base), (left(k, i) + width - 0.01, $top_of(v))], c.filled())
                    }))
                    .map_err(e)?
                    .label(*legend)
                    .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
                chart
                    .draw_series(vals.iter().map(|&(i, v)| {
                        let text = if v >= 100.0 || log { format!("{v:.0}") } else { format!("{v:.1}") };
                        Text::new(text, (left(k, i) + 0.01, $label_y(v)), (FONT, 10))
                    }))
                    .map_err(e)?;
            }
            legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        }};
    }
    let mut builder = ChartBuilder::on(&root);
    builder.caption(caption, (FONT, 17)).margin(12).x_label_area_size(30).y_label_area_size(60);
    let xs = -0.5f64..(n as f64 - 0.5);
    if log {
        let chart = builder.build_cartesian_2d(xs, (0.5f64..top * 25.0).log_scale()).map_err(e)?;
        draw!(chart, 0.5, |v: f64| v.max(1.0), |v: f64| v.max(1.0) * 1.6);
    } else {
        let chart = builder.build_cartesian_2d(xs, 0f64..top * 1.25).map_err(e)?;
        draw!(chart, 0.0, |v: f64| v, |v: f64| v + top * 0.06);
    }
    root.present().map_err(e)?;
    Ok(())
}

/// A concurrency curve: (name, mode for the colour, points (N, avg ms, max ms)).
pub type ConcSeries = (String, String, Vec<(u32, f64, f64)>);

/// Average (solid) and max (dashed-looking thin line) time to first response per instance vs N.
/// Each series: (name, mode for the colour, points (N, avg ms, max ms)).
pub fn concurrency(path: &Path, series: &[ConcSeries]) -> Result<()> {
    lines(path, "Concurrent cold starts: time to first response per instance", "concurrent cold starts (N)", series, ("avg", "max"))
}

/// Two lines per series against a count on x: the first value of each point solid with
/// dots, the second thin; `labels` name the two in the legend.
pub fn lines(path: &Path, caption: &str, x_desc: &str, series: &[ConcSeries], labels: (&str, &str)) -> Result<()> {
    let root = SVGBackend::new(path, (760, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let xmax = series.iter().flat_map(|s| s.2.iter().map(|p| p.0)).max().unwrap_or(1) as f64;
    let ymax = series.iter().flat_map(|s| s.2.iter().map(|p| p.2.max(p.1))).filter(|v| v.is_finite()).fold(1.0f64, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, (FONT, 17))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax + 1.0, 0f64..ymax)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .max_light_lines(1)
        .y_desc("ms")
        .draw()
        .map_err(e)?;
    for (name, mode, pts) in series {
        let c = mode_color(mode);
        chart
            .draw_series(LineSeries::new(pts.iter().map(|p| (p.0 as f64, p.1)), c.stroke_width(2)))
            .map_err(e)?
            .label(format!("{name} {}", labels.0))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], c.stroke_width(2)));
        chart
            .draw_series(pts.iter().map(|p| Circle::new((p.0 as f64, p.1), 3, c.filled())))
            .map_err(e)?;
        let cm = c.mix(0.45);
        chart
            .draw_series(LineSeries::new(pts.iter().map(|p| (p.0 as f64, p.2)), cm.stroke_width(1)))
            .map_err(e)?
            .label(format!("{name} {}", labels.1))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], cm.stroke_width(1)));
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(e)?;
    Ok(())
}

/// Empirical CDF of time to first response (log x axis). Series: (name, mode for colour, samples).
pub fn cdf(path: &Path, series: &[(String, String, Vec<f64>)]) -> Result<()> {
    let root = SVGBackend::new(path, (760, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let all: Vec<f64> = series.iter().flat_map(|s| s.2.iter().copied()).filter(|v| *v > 0.0).collect();
    let xmin = all.iter().copied().fold(f64::INFINITY, f64::min);
    let xmax = all.iter().copied().fold(0.0f64, f64::max);
    let (xmin, xmax) = if all.is_empty() { (1.0, 10.0) } else { (xmin * 0.9, xmax * 1.1) };
    // x is log10(ms) on a linear axis, labelled in ms: readable ticks at any range.
    let (lx0, lx1) = (xmin.log10(), xmax.log10());
    let mut chart = ChartBuilder::on(&root)
        .caption("CDF of time to first response, all functions and runs", (FONT, 17))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(lx0..lx1, 0f64..1.0)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("time to first response, ms (log scale)")
        .x_labels(12)
        .x_label_formatter(&|x| {
            let v = 10f64.powf(*x);
            if v < 10.0 { format!("{v:.1}") } else { format!("{v:.0}") }
        })
        .max_light_lines(1)
        .y_desc("fraction of cold starts")
        .draw()
        .map_err(e)?;
    for (name, mode, vals) in series {
        let mut v: Vec<f64> = vals.iter().copied().filter(|x| *x > 0.0).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len().max(1) as f64;
        let mut pts = vec![(lx0, 0.0)];
        for (i, x) in v.iter().enumerate() {
            pts.push((x.log10(), i as f64 / n));
            pts.push((x.log10(), (i + 1) as f64 / n));
        }
        pts.push((lx1, 1.0));
        let c = mode_color(mode);
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(e)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], c.stroke_width(2)));
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap()
    }

    #[test]
    fn svg_smoke() {
        let dir = tempfile::tempdir().unwrap();
        let groups = vec![
            LatencyGroup {
                function: "helloworld".into(),
                bars: vec![("boot".into(), 120.0, 3.0), ("lazy".into(), 8.0, 20.0), ("prefetch".into(), 9.0, 4.0)],
            },
            LatencyGroup { function: "pyaes".into(), bars: vec![("lazy".into(), 8.0, 40.0), ("prefetch".into(), 9.0, 9.0)] },
        ];
        let p = dir.path().join("latency.svg");
        latency_breakdown(&p, &groups).unwrap();
        let s = read(&p);
        assert!(s.starts_with("<svg"), "{}", &s[..80.min(s.len())]);
        for name in ["restore", "first invocation", "helloworld", "pyaes", "REAP"] {
            assert!(s.contains(name), "latency chart lacks {name}");
        }

        let p = dir.path().join("faults.svg");
        page_faults(&p, &[("helloworld".into(), 900.0, 0.0), ("pyaes".into(), 1500.0, 12.0)]).unwrap();
        let s = read(&p);
        assert!(s.starts_with("<svg"));
        for name in ["lazy", "prefetch (REAP)", "helloworld"] {
            assert!(s.contains(name), "faults chart lacks {name}");
        }

        let p = dir.path().join("mem.svg");
        memory(&p, &[("boot", "boot"), ("prefetch", "prefetch (REAP)")], &[("heavyimports".into(), vec![74.3, 10.4])]).unwrap();
        let s = read(&p);
        assert!(s.starts_with("<svg"));
        for name in ["MiB", "boot", "prefetch (REAP)", "heavyimports", "74.3", "10.4"] {
            assert!(s.contains(name), "memory chart lacks {name}");
        }

        let p = dir.path().join("conc.svg");
        concurrency(
            &p,
            &[
                ("helloworld lazy".into(), "lazy".into(), vec![(1, 30.0, 30.0), (2, 45.0, 50.0), (4, 80.0, 95.0)]),
                ("helloworld prefetch".into(), "prefetch".into(), vec![(1, 10.0, 10.0), (2, 14.0, 16.0), (4, 25.0, 30.0)]),
            ],
        )
        .unwrap();
        let s = read(&p);
        assert!(s.starts_with("<svg"));
        assert!(s.contains("helloworld lazy avg") && s.contains("helloworld prefetch max"));

        let p = dir.path().join("cdf.svg");
        cdf(&p, &[("lazy".into(), "lazy".into(), vec![20.0, 30.0, 50.0]), ("prefetch".into(), "prefetch".into(), vec![5.0, 8.0])])
            .unwrap();
        let s = read(&p);
        assert!(s.starts_with("<svg"));
        assert!(s.contains("lazy") && s.contains("prefetch"));
    }
}
