//! The process page's charts, as inline SVG drawn on the server (no
//! JavaScript): runs per minute by outcome over the last hour, stacked, and
//! the sampled queue depth over the same hour. Every label goes through maud,
//! so nothing from the data can become markup.

use maud::{Markup, html};

use crate::store::{RunOutcome, Series};

/// The drawing area, in SVG units (the SVG scales to the page's width).
const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 140.0;
/// Room for the axis labels left of and below the area.
const LEFT: f64 = 48.0;
const BOTTOM: f64 = 18.0;

/// Outcomes in stacking order, with their colours.
const OUTCOMES: [(RunOutcome, &str); 6] = [
    (RunOutcome::Done, "#2a9d4b"),
    (RunOutcome::Requeued, "#4a7fd4"),
    (RunOutcome::Retry, "#e09a1a"),
    (RunOutcome::Parked, "#c0392b"),
    (RunOutcome::Canceled, "#999999"),
    (RunOutcome::Expired, "#6c4a9e"),
];

/// Depth lines, with their colours.
const DEPTHS: [(&str, &str); 4] = [
    ("pending", "#4a7fd4"),
    ("backoff", "#e09a1a"),
    ("running", "#2a9d4b"),
    ("parked", "#c0392b"),
];

/// Both charts.
pub(super) fn charts(series: &Series) -> Markup {
    html! {
        h2 { "Last hour" }
        (runs(series))
        (depth(series))
    }
}

/// The minutes of the window (the last one partial).
fn minutes(series: &Series) -> usize {
    let span = (series.end - series.start).num_seconds().max(60);
    usize::try_from(span / 60 + 1).unwrap_or(61).min(24 * 60)
}

/// A chart's frame: the y-axis maximum, the time labels and the legend.
fn frame(id: &str, title: &str, max: u64, legend: &[(&str, &str)], body: Markup) -> Markup {
    let (w, h) = (LEFT + WIDTH, HEIGHT + BOTTOM);
    html! {
        figure.chart id=(id) {
            figcaption { (title) " "
                @for (name, colour) in legend { span.legend style=(format!("color:{colour}")) { "■ " (name) } " " } }
            svg xmlns="http://www.w3.org/2000/svg" viewBox=(format!("0 0 {w} {h}")) width="100%" role="img" {
                title { (title) }
                line x1=(LEFT) y1=(HEIGHT) x2=(w) y2=(HEIGHT) stroke="#888" {}
                line x1=(LEFT) y1="0" x2=(LEFT) y2=(HEIGHT) stroke="#888" {}
                text x=(LEFT - 4.0) y="10" text-anchor="end" font-size="10" { (max) }
                text x=(LEFT - 4.0) y=(HEIGHT) text-anchor="end" font-size="10" { "0" }
                text x=(LEFT) y=(h - 4.0) font-size="10" { "60 min ago" }
                text x=(w) y=(h - 4.0) text-anchor="end" font-size="10" { "now" }
                (body)
            }
        }
    }
}

/// Runs per minute by outcome, stacked bars.
fn runs(series: &Series) -> Markup {
    let n = minutes(series);
    let mut stacks = vec![[0_u64; OUTCOMES.len()]; n];
    for b in &series.runs {
        let minute = usize::try_from((b.at - series.start).num_minutes()).unwrap_or(0);
        let slot = OUTCOMES.iter().position(|(o, _)| *o == b.outcome);
        if let (Some(stack), Some(slot)) = (stacks.get_mut(minute), slot) {
            stack[slot] += b.count;
        }
    }
    let max = stacks
        .iter()
        .map(|s| s.iter().sum::<u64>())
        .max()
        .unwrap_or(0)
        .max(1);
    let bar = WIDTH / n as f64;
    let scale = HEIGHT / max as f64;
    let legend: Vec<_> = OUTCOMES.iter().map(|(o, c)| (o.as_str(), *c)).collect();
    let body = html! {
        @for (i, stack) in stacks.iter().enumerate() {
            @let mut top = HEIGHT;
            @for (slot, count) in stack.iter().enumerate().filter(|(_, c)| **c > 0) {
                @let height = *count as f64 * scale;
                @let y = { top -= height; top };
                rect x=(format!("{:.1}", LEFT + i as f64 * bar)) y=(format!("{y:.1}"))
                     width=(format!("{:.1}", (bar - 1.0).max(0.5))) height=(format!("{height:.1}"))
                     fill=(OUTCOMES[slot].1) {
                    title { (count) " " (OUTCOMES[slot].0.as_str()) }
                }
            }
        }
    };
    frame(
        "runs-chart",
        "Runs per minute by outcome",
        max,
        &legend,
        body,
    )
}

/// The sampled depth, one line per state.
fn depth(series: &Series) -> Markup {
    let span = (series.end - series.start).num_milliseconds().max(1) as f64;
    let value = |p: &crate::store::DepthPoint, state: &str| match state {
        "pending" => p.pending,
        "backoff" => p.backoff,
        "running" => p.running,
        _ => p.parked,
    };
    let max = series
        .depth
        .iter()
        .flat_map(|p| DEPTHS.iter().map(move |(s, _)| value(p, s)))
        .max()
        .unwrap_or(0)
        .max(1);
    let scale = HEIGHT / max as f64;
    let x = |p: &crate::store::DepthPoint| {
        LEFT + (p.at - series.start).num_milliseconds() as f64 / span * WIDTH
    };
    let body = html! {
        @if series.depth.is_empty() {
            text x=(LEFT + 8.0) y=(HEIGHT / 2.0) font-size="12" fill="#888" {
                "No samples yet: drover serve samples the depth once a minute." }
        }
        @for (state, colour) in DEPTHS {
            @let points: Vec<String> = series.depth.iter()
                .map(|p| format!("{:.1},{:.1}", x(p), HEIGHT - value(p, state) as f64 * scale)).collect();
            polyline points=(points.join(" ")) fill="none" stroke=(colour) stroke-width="1.5" {}
        }
    };
    frame("depth-chart", "Queue depth (sampled)", max, &DEPTHS, body)
}
