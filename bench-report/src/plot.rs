//! Pictures, with plotters' SVG backend: bandwidth against size or ladder stage (one line per
//! provider or pair, the line rate dashed where known), and the GPU-to-NIC diagram of a
//! topology. Text is left to the SVG viewer's fonts (no font library at build time).

use plotters::prelude::*;

use bench_core::error::{Error, Result};
use bench_core::report::RunReport;
use bench_core::units::human_bytes;

/// One line of a bandwidth plot.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    /// (size in bytes or stage index, Gbit/s).
    pub points: Vec<(f64, f64)>,
}

/// What the x axis shows.
#[derive(Clone, Debug)]
pub enum XAxis {
    /// Message size, log scale.
    Size,
    /// Ladder stages, in order.
    Stages(Vec<String>),
}

fn perr(e: impl std::fmt::Display) -> Error {
    Error::Unavailable(format!("drawing the plot: {e}"))
}

/// Series and axis for a command's runs: one series per `label(run)`.
pub fn from_runs<'a>(
    runs: impl IntoIterator<Item = (String, &'a RunReport)>,
    ladder: bool,
) -> (XAxis, Vec<Series>) {
    let mut series: Vec<Series> = Vec::new();
    let mut stages: Vec<String> = Vec::new();
    for (label, r) in runs {
        let x = if ladder {
            let st = r.stage.clone().unwrap_or_default();
            match stages.iter().position(|s| *s == st) {
                Some(i) => i as f64,
                None => {
                    stages.push(st);
                    (stages.len() - 1) as f64
                }
            }
        } else {
            r.size as f64
        };
        match series.iter_mut().find(|s| s.label == label) {
            Some(s) => s.points.push((x, r.gbps)),
            None => series.push(Series {
                label,
                points: vec![(x, r.gbps)],
            }),
        }
    }
    for s in &mut series {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let axis = if ladder {
        XAxis::Stages(stages)
    } else {
        XAxis::Size
    };
    (axis, series)
}

/// Bandwidth against size or stage as an SVG document.
pub fn bandwidth_svg(
    title: &str,
    axis: &XAxis,
    series: &[Series],
    line_rate: Option<(f64, String)>,
) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(perr)?;
        let ymax = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .chain(line_rate.as_ref().map(|l| l.0))
            .fold(0.0f64, f64::max)
            .max(1e-3)
            * 1.12;
        // x: log2(size) for sizes, the stage index for the ladder.
        let xs: Vec<f64> = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect();
        let (x0, x1, labels) = match axis {
            XAxis::Size => {
                let lo = xs
                    .iter()
                    .copied()
                    .fold(f64::INFINITY, f64::min)
                    .max(1.0)
                    .log2()
                    .floor();
                let hi = xs
                    .iter()
                    .copied()
                    .fold(0.0f64, f64::max)
                    .max(1.0)
                    .log2()
                    .ceil();
                (lo - 0.5, hi + 0.5, (hi - lo) as usize + 1)
            }
            XAxis::Stages(st) => (-0.5, st.len().max(1) as f64 - 0.5, st.len().max(1)),
        };
        let tx = |x: f64| match axis {
            XAxis::Size => x.max(1.0).log2(),
            XAxis::Stages(_) => x,
        };
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(14)
            .x_label_area_size(if matches!(axis, XAxis::Stages(_)) {
                60
            } else {
                40
            })
            .y_label_area_size(60)
            .build_cartesian_2d(x0..x1, 0.0..ymax)
            .map_err(perr)?;
        let xfmt = |v: &f64| -> String {
            let r = v.round();
            if (v - r).abs() > 1e-6 {
                return String::new();
            }
            match axis {
                XAxis::Size => {
                    if (0.0..63.0).contains(&r) {
                        human_bytes(1u64 << r as u32)
                    } else {
                        String::new()
                    }
                }
                XAxis::Stages(st) => st.get(r as usize).cloned().unwrap_or_default(),
            }
        };
        chart
            .configure_mesh()
            .x_labels(labels.min(24))
            .light_line_style(BLACK.mix(0.04))
            .x_label_formatter(&xfmt)
            .y_desc("Gbit/s")
            .x_desc(match axis {
                XAxis::Size => "message size (bytes)",
                XAxis::Stages(_) => "ladder stage",
            })
            .draw()
            .map_err(perr)?;
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (tx(x), y)).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(perr)?
                .label(s.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(perr)?;
        }
        if let Some((rate, what)) = line_rate {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(x0, rate), (x1, rate)],
                    8,
                    5,
                    RED.stroke_width(2),
                ))
                .map_err(perr)?
                .label(format!("line rate {rate} Gbit/s ({what})"))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(perr)?;
        root.present().map_err(perr)?;
    }
    Ok(svg)
}

/// The GPU-to-NIC diagram: one column per GPU (per NUMA node without GPUs) with its NICs
/// below it, columns shaded by NUMA node.
pub fn topology_svg(t: &topo::Topology) -> Result<String> {
    struct Col {
        head: String,
        sub: String,
        numa: Option<u32>,
        nics: Vec<String>,
    }
    let mut cols: Vec<Col> = if t.gpus().is_empty() {
        t.numa_groups()
            .iter()
            .map(|g| Col {
                head: g.numa.map_or("NUMA ?".into(), |n| format!("NUMA {n}")),
                sub: format!("{} core(s), no GPU", g.cores.len()),
                numa: g.numa,
                nics: g.nics.iter().map(|n| n.name.clone()).collect(),
            })
            .collect()
    } else {
        t.gpus()
            .iter()
            .map(|g| Col {
                head: format!("GPU {}", g.index),
                sub: g.pci.clone(),
                numa: g.numa,
                nics: g.nics.iter().map(|n| n.name.clone()).collect(),
            })
            .collect()
    };
    if !t.gpus().is_empty() && !t.unassigned_nics().is_empty() {
        cols.push(Col {
            head: "no GPU".into(),
            sub: "unassigned NICs".into(),
            numa: None,
            nics: t.unassigned_nics().iter().map(|n| n.name.clone()).collect(),
        });
    }
    let cw = 132i32;
    let max_nics = cols.iter().map(|c| c.nics.len()).max().unwrap_or(0).max(1) as i32;
    let w = (cols.len().max(1) as i32 * cw + 20) as u32;
    let h = (110 + max_nics * 34 + 20) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(perr)?;
        let shade = |n: Option<u32>| match n {
            Some(n) => Palette99::pick(n as usize).mix(0.12),
            None => BLACK.mix(0.05),
        };
        let font = ("sans-serif", 13).into_font();
        let small = ("sans-serif", 11).into_font();
        for (i, c) in cols.iter().enumerate() {
            let x = 10 + i as i32 * cw;
            root.draw(&Rectangle::new(
                [(x, 4), (x + cw - 6, h as i32 - 6)],
                shade(c.numa).filled(),
            ))
            .map_err(perr)?;
            root.draw(&Text::new(
                c.numa.map_or("NUMA -".into(), |n| format!("NUMA {n}")),
                (x + 6, 10),
                small.clone(),
            ))
            .map_err(perr)?;
            let (gx0, gy0, gx1, gy1) = (x + 10, 30, x + cw - 16, 76);
            root.draw(&Rectangle::new(
                [(gx0, gy0), (gx1, gy1)],
                RGBColor(0x76, 0xb9, 0x00).filled(),
            ))
            .map_err(perr)?;
            root.draw(&Text::new(
                c.head.clone(),
                (gx0 + 6, gy0 + 6),
                font.clone().color(&WHITE),
            ))
            .map_err(perr)?;
            root.draw(&Text::new(
                c.sub.clone(),
                (gx0 + 6, gy0 + 26),
                small.clone().color(&WHITE),
            ))
            .map_err(perr)?;
            // The link first, the NIC boxes over it.
            if let Some(last) = c.nics.len().checked_sub(1) {
                let mid = (gx0 + gx1) / 2;
                let y = 100 + last as i32 * 34;
                root.draw(&PathElement::new(
                    vec![(mid, gy1), (mid, y)],
                    BLACK.mix(0.5),
                ))
                .map_err(perr)?;
            }
            for (j, n) in c.nics.iter().enumerate() {
                let y = 100 + j as i32 * 34;
                root.draw(&Rectangle::new(
                    [(gx0, y), (gx1, y + 24)],
                    RGBColor(0x1f, 0x5f, 0xa8).filled(),
                ))
                .map_err(perr)?;
                root.draw(&Text::new(
                    n.clone(),
                    (gx0 + 6, y + 6),
                    small.clone().color(&WHITE),
                ))
                .map_err(perr)?;
            }
            if c.nics.is_empty() {
                root.draw(&Text::new("no RDMA NIC", (gx0 + 6, 100), small.clone()))
                    .map_err(perr)?;
            }
        }
        root.present().map_err(perr)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_plot_has_every_series_and_the_line_rate() {
        let s = vec![
            Series {
                label: "efa/shm".into(),
                points: vec![(64.0, 1.0), (4096.0, 20.0), (1048576.0, 40.0)],
            },
            Series {
                label: "efa/tcp".into(),
                points: vec![(64.0, 0.5), (4096.0, 8.0), (1048576.0, 15.0)],
            },
        ];
        let svg = bandwidth_svg("write", &XAxis::Size, &s, Some((100.0, "p5".into()))).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        for t in [
            "efa/shm",
            "efa/tcp",
            "line rate 100 Gbit/s (p5)",
            ">\n64\n<",
            ">\n1M\n<",
            "Gbit/s",
        ] {
            assert!(svg.contains(t), "{t} missing");
        }
    }

    #[test]
    fn ladder_plot_labels_stages() {
        let s = vec![Series {
            label: "efa/shm".into(),
            points: vec![(0.0, 10.0), (1.0, 20.0)],
        }];
        let axis = XAxis::Stages(vec!["baseline".into(), "+pin".into()]);
        let svg = bandwidth_svg("ladder", &axis, &s, None).unwrap();
        assert!(svg.contains("baseline") && svg.contains("+pin"));
        assert!(!svg.contains("line rate"));
    }
}
