//! The trace as an SVG timeline (plotters' SVG backend): one band per device, top to bottom,
//! each with three lanes ([`Lane`]): the barrier and release wait (grey, thin), the stage
//! kernels, and the copy engine right below them. A stage's GEMM and the copies that feed it
//! have the stage's colour; the part of a GEMM that waited for its flag is light grey, flag
//! sets are black ticks. A legend row sits below the time axis. The x axis is microseconds on the trace's clock.

use plotters::prelude::*;
use thiserror::Error;

use super::model::{Event, EventKind, Lane, Trace};

/// Why the SVG could not be drawn (an error of the drawing library).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("cannot draw the SVG timeline: {0}")]
pub struct SvgError(String);

/// Width of the picture in pixels.
const WIDTH: u32 = 1400;
/// Height of one device's band in pixels.
const BAND_PX: u32 = 72;
/// Height of the title, axis and legend in pixels.
const FRAME_PX: u32 = 150;
/// Rows of one device's band (three lanes and a gap), in chart units.
const BAND_ROWS: f64 = 4.0;

/// Height of the legend's row in pixels.
const LEGEND_PX: u32 = 30;

/// The tint of a kernel's flag wait (drawn over the kernel's bar).
const WAIT_TINT: RGBColor = RGBColor(225, 225, 225);

/// The grey of the barrier and the release wait.
const SYNC_GREY: RGBColor = RGBColor(130, 130, 130);

/// The colour of stage `stage`.
fn stage_colour(stage: usize) -> RGBColor {
    let c = Palette99::pick(stage).to_rgba();
    RGBColor(c.0, c.1, c.2)
}

/// Top and bottom (chart units) of `lane` in device `device`'s band, counted from the top of
/// `tp` bands.
fn lane_rows(tp: usize, device: usize, lane: Lane) -> (f64, f64) {
    let (offset, height) = match lane {
        Lane::Sync => (0.2, 0.5),
        Lane::Kernels => (0.8, 1.0),
        Lane::CopyEngine => (1.9, 1.0),
    };
    let top = tp as f64 * BAND_ROWS - device as f64 * BAND_ROWS - offset;
    (top, top - height)
}

/// The rectangle of `[start_ns, end_ns)` in `lane` of `device`, at least a hair wide.
fn bar(tp: usize, device: usize, lane: Lane, start_ns: u64, end_ns: u64) -> [(f64, f64); 2] {
    let (top, bottom) = lane_rows(tp, device, lane);
    let (x0, x1) = (start_ns as f64 / 1000.0, end_ns as f64 / 1000.0);
    [(x0, top), (x1.max(x0 + 0.001), bottom)]
}

impl Trace {
    /// The timeline as an SVG document (module documentation).
    pub fn render_svg(&self) -> Result<String, SvgError> {
        let mut svg = String::new();
        let height = FRAME_PX + BAND_PX * self.tp as u32;
        draw(self, SVGBackend::with_string(&mut svg, (WIDTH, height)))
            .map_err(|e| SvgError(e.to_string()))?;
        Ok(svg)
    }
}

/// Draws `trace` on `backend`.
fn draw<'a>(
    trace: &Trace,
    backend: SVGBackend<'a>,
) -> Result<(), DrawingAreaErrorKind<<SVGBackend<'a> as DrawingBackend>::ErrorType>> {
    let root = backend.into_drawing_area();
    root.fill(&WHITE)?;
    let (main, legend) = root.split_vertically(root.dim_in_pixel().1 - LEGEND_PX);
    let tp = trace.tp;
    let end_us = (trace.end_ns() as f64 / 1000.0).max(0.001);
    let title = format!(
        "{} at TP={}, {}: {} ({} run{})",
        trace.schedule.cli_name(),
        tp,
        trace.problem,
        trace.source.name(),
        trace.iterations,
        if trace.iterations == 1 { "" } else { "s" }
    );
    // Tick labels with as many decimals as tell them apart.
    let decimals = match end_us {
        x if x < 20.0 => 2,
        x if x < 200.0 => 1,
        _ => 0,
    };
    let mut chart = ChartBuilder::on(&main)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..end_us * 1.02, 0f64..tp as f64 * BAND_ROWS)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc("µs")
        .x_label_formatter(&|us| format!("{us:.decimals$}"))
        .draw()?;

    let events = || {
        trace
            .devices
            .iter()
            .flat_map(|d| d.events.iter().map(move |e| (d.device, e)))
    };
    let rect = |d: usize, e: &Event, colour: RGBColor| {
        Rectangle::new(
            bar(tp, d, e.lane(), e.span.start_ns, e.span.end_ns),
            colour.filled(),
        )
    };
    let stages = events().map(|(_, e)| e.stage + 1).max().unwrap_or(0);
    for stage in 0..stages {
        let colour = stage_colour(stage);
        let work = events().filter(move |(_, e)| {
            e.stage == stage
                && matches!(
                    e.kind,
                    EventKind::Gemm | EventKind::Reduce | EventKind::Copy { .. }
                )
        });
        chart.draw_series(work.map(|(d, e)| rect(d, e, colour)))?;
    }
    let sync = events().filter(|(_, e)| e.lane() == Lane::Sync);
    chart.draw_series(sync.map(|(d, e)| rect(d, e, SYNC_GREY)))?;
    let waits = events().flat_map(|(d, e)| {
        e.waits().map(move |w| {
            Rectangle::new(
                bar(tp, d, e.lane(), w.start_ns, w.end_ns),
                WAIT_TINT.filled(),
            )
        })
    });
    chart.draw_series(waits)?;
    let flags = events().filter(|(_, e)| matches!(e.kind, EventKind::FlagSet { .. }));
    chart.draw_series(flags.map(|(d, e)| {
        let [(x, top), (_, bottom)] = bar(tp, d, e.lane(), e.span.start_ns, e.span.end_ns);
        PathElement::new(vec![(x, top), (x, bottom)], BLACK.stroke_width(1))
    }))?;

    // The legend, in a row below the axis.
    let items = (0..stages)
        .map(|s| (format!("stage {s}"), stage_colour(s)))
        .chain([
            ("barrier, release wait".to_string(), SYNC_GREY),
            ("flag wait".to_string(), WAIT_TINT),
            ("flag set".to_string(), BLACK),
        ]);
    let y = legend.dim_in_pixel().1 as i32 / 2;
    let mut x = 90;
    for (label, colour) in items {
        let swatch = if colour == BLACK {
            [(x + 6, y - 6), (x + 7, y + 6)]
        } else {
            [(x, y - 6), (x + 14, y + 6)]
        };
        legend.draw(&Rectangle::new(swatch, colour.filled()))?;
        // About 7 pixels per character at this size.
        let width = 40 + 7 * label.chars().count() as i32;
        legend.draw(&Text::new(
            label,
            (x + 20, y - 6),
            ("sans-serif", 12).into_font(),
        ))?;
        x += width;
    }

    // Device and lane names left of the bands.
    for d in 0..tp {
        for lane in Lane::ALL {
            let (top, bottom) = lane_rows(tp, d, lane);
            let (x, y) = chart.backend_coord(&(0.0, (top + bottom) / 2.0));
            let label = match lane {
                Lane::Sync => format!("device {d}"),
                Lane::Kernels => "kernels".into(),
                Lane::CopyEngine => "copies".into(),
            };
            let size = if lane == Lane::Sync { 14 } else { 11 };
            root.draw(&Text::new(
                label,
                (x - 74, y - size / 2),
                ("sans-serif", size).into_font(),
            ))?;
        }
    }
    root.present()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::ScheduleKind;
    use crate::trace::tests::synthetic;

    /// Checks that every element is closed in order (the SVG backend writes no comments or
    /// CDATA, so tags and quoted attributes are all there is to balance).
    fn assert_well_formed(svg: &str) {
        let mut open: Vec<&str> = Vec::new();
        let mut rest = svg;
        while let Some(i) = rest.find('<') {
            rest = &rest[i + 1..];
            let end = rest.find('>').unwrap_or_else(|| panic!("unclosed tag"));
            let tag = &rest[..end];
            rest = &rest[end + 1..];
            assert_eq!(
                tag.matches('"').count() % 2,
                0,
                "unbalanced quotes in <{tag}>"
            );
            if tag.starts_with('?') || tag.ends_with('/') {
                continue;
            }
            let name = tag.trim_start_matches('/').split_whitespace().next();
            let name = name.unwrap_or_else(|| panic!("empty tag"));
            if tag.starts_with('/') {
                assert_eq!(open.pop(), Some(name), "</{name}> closes the wrong element");
            } else {
                open.push(name);
            }
        }
        assert!(open.is_empty(), "unclosed elements: {open:?}");
    }

    #[test]
    fn the_svg_is_well_formed_with_a_bar_per_event() {
        for kind in [
            ScheduleKind::AllGatherRotatingA,
            ScheduleKind::ReduceScatterTilingA,
            ScheduleKind::ReduceScatterSingleStageB,
        ] {
            let (_, trace) = synthetic(kind, 3, 1);
            let svg = trace.render_svg().unwrap_or_else(|e| panic!("{e}"));
            assert!(
                svg.starts_with("<svg") || svg.starts_with("<?xml"),
                "{kind}"
            );
            assert_well_formed(&svg);
            let events: usize = trace.devices.iter().map(|d| d.events.len()).sum();
            // One rectangle per event that is not a flag set (those are lines), plus the
            // background, the legend's box and swatches.
            let flags = trace
                .devices
                .iter()
                .flat_map(|d| &d.events)
                .filter(|e| matches!(e.kind, EventKind::FlagSet { .. }))
                .count();
            assert!(svg.matches("<rect").count() > events - flags, "{kind}");
            for d in 0..3 {
                assert!(svg.contains(&format!("device {d}")), "{kind}");
            }
            assert!(
                svg.contains("stage 0"),
                "{kind}: the legend names the stages"
            );
        }
        assert!(assert_fails(|| assert_well_formed("<svg><g></svg></g>")));
        assert!(assert_fails(|| assert_well_formed("<svg><rect/>")));
    }

    fn assert_fails(f: impl FnOnce() + std::panic::UnwindSafe) -> bool {
        std::panic::catch_unwind(f).is_err()
    }
}
