//! The SVG bar chart: one panel for cost rows (lower is better), one for throughput rows
//! (higher is better), each bar ending left or right of its own target mark.

use crate::{Kind, Row};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

const SIZE: (u32, u32) = (900, 520);
const TITLE: &str = "idem vs the hand-written baseline (ratio, one run)";
/// Pixels left of each panel's plot for the row labels.
const LABEL_WIDTH: u32 = 220;
/// Pixels per panel for its caption and x axis.
const PANEL_OVERHEAD: u32 = 70;
const FOOTER: u32 = 40;
const MET: RGBColor = RGBColor(46, 139, 87);
const MISSED: RGBColor = RGBColor(205, 55, 55);

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type DrawResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Draws the chart of the measured ratio rows to `path`.
pub fn write_svg(path: &Path, rows: &[Row]) -> crate::Result<()> {
    draw(path, rows).map_err(|e| format!("cannot draw {}: {e}", path.display()))
}

fn draw(path: &Path, rows: &[Row]) -> DrawResult<()> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let body = root.titled(TITLE, ("sans-serif", 22))?;
    let measured = |kind| -> Vec<&Row> {
        rows.iter().filter(|r| r.kind == kind && r.ratio().is_some()).collect()
    };
    let panels: Vec<(&str, Vec<&Row>)> = [
        ("Cost: idem time / baseline time. Lower is better: met when the bar stops left of its target mark", measured(Kind::Cost)),
        ("Throughput: baseline time / idem time. Higher is better: met when the bar reaches past its target mark", measured(Kind::Throughput)),
    ]
    .into_iter()
    .filter(|(_, rows)| !rows.is_empty())
    .collect();
    let total_rows: u32 = panels.iter().map(|(_, rows)| rows.len() as u32).sum();
    let free = body.dim_in_pixel().1.saturating_sub(FOOTER + PANEL_OVERHEAD * panels.len() as u32);
    let row_height = free / total_rows.max(1);
    let mut rest = body;
    for (caption, panel_rows) in &panels {
        let (panel, below) =
            rest.split_vertically(PANEL_OVERHEAD + row_height * panel_rows.len() as u32);
        draw_panel(&root, &panel, caption, panel_rows)?;
        rest = below;
    }
    let legend = match panels.is_empty() {
        true => "No ratio benchmark has results.",
        false => "Green: met; red: missed; black mark: the row's target; dark grey line: 1.0x, as fast as \
                  the baseline. Bytes per record: see the table.",
    };
    let not_run: Vec<&str> = rows.iter().filter(|r| r.values.is_none()).map(|r| r.short).collect();
    let not_run = match not_run.join(", ") {
        list if list.is_empty() => String::new(),
        list if list.len() <= 130 => format!("Not run: {list}."),
        _ => format!("Not run: {} of {} rows; see the table.", not_run.len(), rows.len()),
    };
    let style = ("sans-serif", 13).into_font().color(&BLACK);
    rest.draw_text(legend, &style, (12, 4))?;
    rest.draw_text(&not_run, &style, (12, 21))?;
    root.present()?;
    Ok(())
}

fn draw_panel(root: &Area, panel: &Area, caption: &str, rows: &[&Row]) -> DrawResult<()> {
    let n = rows.len() as f64;
    let widest = rows.iter().flat_map(|r| [r.ratio().unwrap_or(0.0), r.target]).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(panel)
        .caption(caption, ("sans-serif", 15))
        .margin(6)
        .margin_left(LABEL_WIDTH)
        .margin_right(20)
        .x_label_area_size(22)
        .build_cartesian_2d(0.0..widest * 1.3, -0.5..n - 0.5)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_label_formatter(&|_| String::new())
        .x_label_formatter(&|v| format!("{v:.1}x"))
        .draw()?;
    let parity = [(1.0, -0.5), (1.0, n - 0.5)];
    chart.draw_series(std::iter::once(PathElement::new(
        parity,
        RGBColor(90, 90, 90).stroke_width(2),
    )))?;
    let label_style =
        TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    let value_style =
        TextStyle::from(("sans-serif", 12).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, row) in rows.iter().enumerate() {
        let (Some(ratio), Some(met)) = (row.ratio(), row.met()) else {
            continue;
        };
        let y = n - 1.0 - i as f64; // first row on top
        let colour = if met { MET } else { MISSED };
        chart.draw_series(std::iter::once(Rectangle::new(
            [(0.0, y - 0.3), (ratio, y + 0.3)],
            colour.filled(),
        )))?;
        let mark = [(row.target, y - 0.42), (row.target, y + 0.42)];
        chart.draw_series(std::iter::once(PathElement::new(mark, BLACK.stroke_width(3))))?;
        let (x0, y0) = chart.backend_coord(&(0.0, y));
        root.draw(&Text::new(row.short.to_string(), (x0 - 8, y0), label_style.clone()))?;
        let (x1, _) = chart.backend_coord(&(ratio.max(row.target), y));
        let sign = if row.kind == Kind::Cost { "≤" } else { "≥" };
        let text = format!("{ratio:.2}x (target {sign} {}x)", row.target);
        root.draw(&Text::new(text, (x1 + 6, y0), value_style.clone()))?;
    }
    Ok(())
}
