//! The chart of queries/s against vids per term, one panel per density.

use std::path::Path;

use plotters::prelude::*;

use crate::report::{Outcome, Report, percent};
use crate::system::System;

/// Draws queries/s against vids per term, one panel per density.
pub fn draw(path: &Path, report: &Report) -> anyhow::Result<()> {
    let mut densities: Vec<f64> = report.chart.iter().map(|o| o.density).collect();
    densities.dedup();
    let root = SVGBackend::new(path, (560 * densities.len() as u32, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, densities.len()));
    for (panel, density) in panels.iter().zip(&densities) {
        let points: Vec<&Outcome> = report
            .chart
            .iter()
            .filter(|o| o.density == *density)
            .collect();
        // x is log2 of the vids per term, labelled with the vids themselves.
        let xs: Vec<f64> = points
            .iter()
            .map(|o| (o.vids_per_term as f64).log2())
            .collect();
        let top = points
            .iter()
            .flat_map(|o| o.systems.iter().map(|(_, f)| f.queries_per_second))
            .fold(1.0, f64::max);
        let x0 = xs.iter().copied().fold(f64::MAX, f64::min);
        let x1 = xs.iter().copied().fold(f64::MIN, f64::max);
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!(
                    "{} vectors of 2^{} bits, {} dense, {} terms, concurrency {}",
                    report.vectors,
                    report.bits.ilog2(),
                    percent(*density),
                    report.terms,
                    report.concurrency
                ),
                ("sans-serif", 16),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x0 - 0.2..x1 + 0.2, 0.0..top * 1.1)?;
        chart
            .configure_mesh()
            .x_desc("vids per term")
            .y_desc("queries/s")
            .x_labels(xs.len() * 4)
            .x_label_formatter(&|x| {
                let rounded = x.round();
                if (x - rounded).abs() < 0.01 {
                    format!("{:.0}", rounded.exp2())
                } else {
                    String::new()
                }
            })
            .y_labels(12)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for system in System::ALL {
            let color = color(system);
            let series: Vec<(f64, f64)> = points
                .iter()
                .map(|o| {
                    (
                        (o.vids_per_term as f64).log2(),
                        o.figures(system).queries_per_second,
                    )
                })
                .collect();
            chart
                .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))?
                .label(system.legend())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart.draw_series(series.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// The colour of `system`'s line.
fn color(system: System) -> RGBColor {
    match system {
        System::Redis => RED,
        System::Bitfold => BLUE,
        System::Roaring => GREEN,
        System::Roof => BLACK,
    }
}
