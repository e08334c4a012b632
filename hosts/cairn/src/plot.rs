//! The PNG of a run's curves, drawn from `metrics.jsonl` and `eval.jsonl` at the end of a run
//! (and by `cairn plot RUN_DIR`).

use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use serde_json::{Map, Value};

use crate::output::{Existing, Output};

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// One panel: metric keys of `metrics.jsonl` (RL steps) with their titles; the first key the
/// run reports is drawn (with the KL off no reference pass runs, so the KL panel shows how far
/// each update moved from the rollout policy instead).
const PANELS: &[&[(&str, &str)]] = &[
    &[("reward/episode_mean", "mean episode reward")],
    &[("success_rate", "training success rate")],
    &[("loss", "loss")],
    &[
        ("kl", "KL to reference (token mean)"),
        (
            "approx_kl_old_k3",
            "KL to the rollout policy (k3, token mean)",
        ),
    ],
    &[("clip_fraction", "clip fraction")],
    &[("response_length/mean", "response length (tokens)")],
    &[("turns_per_trajectory/mean", "turns per episode")],
    &[("tokens_per_s", "rollout tokens/s")],
];

/// Series read from a run directory.
struct Series {
    rl: Vec<(f64, serde_json::Map<String, Value>)>,
    sft: Vec<(f64, f64)>,
    evals: Vec<(f64, f64, String)>,
}

/// The objects of the JSON-lines file `path` (none if it is missing). A last line cut off
/// mid-write (what a killed trainer can leave) is left out with a note; any other line that is
/// not a JSON object is refused by file and line.
fn read_jsonl(path: &Path) -> Result<Vec<Map<String, Value>>> {
    let lines = crate::jsonl::read(path);
    if let Some(problem) = lines.problems.first() {
        anyhow::bail!(
            "{problem}; every line of {} must be one JSON object: fix or delete that line",
            path.display()
        );
    }
    if let Some(n) = lines.cut_off {
        eprintln!(
            "note: {} line {n} is cut off (no newline, not valid JSON; a trainer killed while \
             writing it leaves this); it is left out",
            path.display()
        );
    }
    Ok(lines.rows)
}

/// Checks that `run_dir` is a run directory (it has `metrics.jsonl` or `eval.jsonl`).
fn check_run_dir(run_dir: &Path) -> Result<()> {
    if !run_dir.is_dir() {
        anyhow::bail!(
            "{}: no such directory; give a run directory (the `run.dir` of a training run)",
            run_dir.display()
        );
    }
    if !run_dir.join("metrics.jsonl").is_file() && !run_dir.join("eval.jsonl").is_file() {
        anyhow::bail!(
            "{}: not a run directory (no metrics.jsonl or eval.jsonl); give the `run.dir` of a \
             training run",
            run_dir.display()
        );
    }
    Ok(())
}

fn load(run_dir: &Path) -> Result<Series> {
    check_run_dir(run_dir)?;
    let mut s = Series {
        rl: Vec::new(),
        sft: Vec::new(),
        evals: Vec::new(),
    };
    for m in read_jsonl(&run_dir.join("metrics.jsonl"))? {
        let step = m.get("step").and_then(Value::as_f64).unwrap_or(0.0);
        match m.get("phase").and_then(Value::as_str) {
            Some("rl") => s.rl.push((step, m)),
            Some("warm_start") => {
                if let Some(l) = m.get("sft_loss").and_then(Value::as_f64) {
                    s.sft.push((step, l));
                }
            }
            _ => {}
        }
    }
    for v in read_jsonl(&run_dir.join("eval.jsonl"))? {
        let step = v.get("step").and_then(Value::as_f64).unwrap_or(0.0);
        let rate = v.get("success_rate").and_then(Value::as_f64).unwrap_or(0.0);
        let label = v
            .get("label")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        s.evals.push((step, rate, label));
    }
    Ok(s)
}

fn range(values: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let lo = values.clone().fold(f64::INFINITY, f64::min);
    let hi = values.fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    // A flat series still gets a readable band around it.
    let pad = ((hi - lo) * 0.08).max(0.05 * lo.abs().max(hi.abs()).max(1.0));
    (lo - pad, hi + pad)
}

type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// One titled panel of the run figure: axes over `x` (steps) × `y`, with its mesh drawn.
fn panel<'a, 'b>(
    area: &'a DrawingArea<BitMapBackend<'b>, Shift>,
    title: &str,
    x: Range<f64>,
    y: Range<f64>,
) -> Result<Chart<'a, 'b>> {
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .label_style(("sans-serif", 13))
        .draw()?;
    Ok(chart)
}

/// Draws `<run_dir>/curves.png` and returns its path. The file is the run's own (`cairn
/// train` draws it at the end, `cairn plot` redraws it), so an existing regular file is
/// replaced without `--force`; anything else there is refused ([`Output`]).
pub fn plot_run(run_dir: &Path) -> Result<PathBuf> {
    // Registering twice is harmless: the registry is keyed by family and style.
    let _ = register_font("sans-serif", FontStyle::Normal, FONT);
    let series = load(run_dir)?;
    let out = run_dir.join("curves.png");
    Output {
        flag: "the plot",
        path: &out,
        stores: &crate::output::run_stores(run_dir),
        existing: Existing::Replace,
    }
    .write_via_path(|tmp| draw_run(run_dir, &series, tmp))?;
    Ok(out)
}

/// Draws the curves of `series` (of `run_dir`) into the PNG file `out`.
fn draw_run(run_dir: &Path, series: &Series, out: &Path) -> Result<()> {
    let root = BitMapBackend::new(out, (1600, 1300)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, rest) = root.split_vertically(60);
    top.titled(
        &format!("Cairn run: {}", run_dir.display()),
        ("sans-serif", 30).into_font(),
    )?;
    let (grid_area, bottom) = rest.split_vertically(960);
    let panels = grid_area.split_evenly((2, 4));
    for (area, choices) in panels.iter().zip(PANELS) {
        let points_of = |key: &str| -> Vec<(f64, f64)> {
            series
                .rl
                .iter()
                .filter_map(|(s, m)| m.get(key).and_then(Value::as_f64).map(|v| (*s, v)))
                .filter(|(_, v)| v.is_finite())
                .collect()
        };
        let (points, title) = choices
            .iter()
            .map(|(key, title)| (points_of(key), *title))
            .find(|(p, _)| !p.is_empty())
            .unwrap_or_else(|| (Vec::new(), choices[0].1));
        let (x0, x1) = range(points.iter().map(|p| p.0));
        let (y0, y1) = range(points.iter().map(|p| p.1));
        let mut chart = panel(area, title, x0..x1, y0..y1)?;
        chart.draw_series(LineSeries::new(
            points.iter().copied(),
            BLUE.stroke_width(2),
        ))?;
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 2, BLUE.filled())))?;
    }
    let (sft_area, eval_area) = bottom.split_horizontally(800);
    {
        let (x0, x1) = range(series.sft.iter().map(|p| p.0));
        let (y0, y1) = range(series.sft.iter().map(|p| p.1));
        let mut chart = panel(
            &sft_area,
            "warm start: SFT loss (nats/token)",
            x0..x1,
            y0..y1,
        )?;
        chart.draw_series(LineSeries::new(
            series.sft.iter().copied(),
            RED.stroke_width(2),
        ))?;
    }
    {
        let (x0, x1) = range(series.evals.iter().map(|p| p.0));
        // Room on the right for the last point's label.
        let x1 = x1 + (x1 - x0) * 0.25;
        let mut chart = panel(&eval_area, "held-out success rate", x0..x1, 0.0..1.05)?;
        let pts: Vec<(f64, f64)> = series.evals.iter().map(|e| (e.0, e.1)).collect();
        chart.draw_series(LineSeries::new(pts.iter().copied(), GREEN.stroke_width(2)))?;
        chart.draw_series(series.evals.iter().map(|(x, y, label)| {
            EmptyElement::at((*x, *y))
                + Circle::new((0, 0), 5, GREEN.filled())
                + Text::new(
                    format!("{label} {:.0}%", y * 100.0),
                    (6, -16),
                    ("sans-serif", 14),
                )
        }))?;
    }
    root.present()
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

/// One algorithm's runs (one per seed) for [`compare_runs`].
pub struct RunGroup {
    pub label: String,
    pub runs: Vec<PathBuf>,
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let m = xs.iter().sum::<f64>() / n;
    let s = if xs.len() > 1 {
        (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (m, s)
}

/// Window of the trailing mean applied to each run's training success before averaging seeds
/// (one step's success is a rate over only `tasks_per_step × group_size` episodes).
const SMOOTHING_STEPS: usize = 5;

/// `out[i]` = mean of `xs[i + 1 - w ..= i]` (fewer at the start).
fn trailing_mean(xs: &[f64], w: usize) -> Vec<f64> {
    (0..xs.len())
        .map(|i| {
            let window = &xs[(i + 1).saturating_sub(w)..=i];
            window.iter().sum::<f64>() / window.len() as f64
        })
        .collect()
}

/// The held-out success of a run's evaluation with `label`.
fn eval_rate(run: &Path, label: &str) -> Result<f64> {
    check_run_dir(run)?;
    read_jsonl(&run.join("eval.jsonl"))?
        .iter()
        .rev()
        .find(|e| e.get("label").and_then(Value::as_str) == Some(label))
        .and_then(|e| e.get("success_rate").and_then(Value::as_f64))
        .with_context(|| {
            format!(
                "{}: no `{label}` evaluation in eval.jsonl (is the run finished?)",
                run.display()
            )
        })
}

/// Compares algorithms run with several seeds: writes a PNG of the mean curve of each
/// training metric in `metrics` (keys of `metrics.jsonl`, e.g. `success_rate`; band: ± one std
/// across seeds; a step where a run did not report the metric is left out of that run) for
/// each algorithm, and returns a Markdown table of held-out success after the warm start and
/// after RL (mean ± std across seeds, sample std).
pub fn compare_runs(groups: &[RunGroup], metrics: &[String], out: &Output) -> Result<String> {
    let _ = register_font("sans-serif", FontStyle::Normal, FONT);
    let mut table = String::from(
        "| algorithm | seeds | held-out success after warm start | held-out success after RL |\n|---|---|---|---|\n",
    );
    let mut curves: Vec<Curve> = Vec::new();
    for g in groups {
        let before: Vec<f64> = g
            .runs
            .iter()
            .map(|r| eval_rate(r, "after_warm_start"))
            .collect::<Result<_>>()?;
        let after: Vec<f64> = g
            .runs
            .iter()
            .map(|r| eval_rate(r, "after_rl"))
            .collect::<Result<_>>()?;
        let (bm, bs) = mean_std(&before);
        let (am, as_) = mean_std(&after);
        table.push_str(&format!(
            "| {} | {} | {:.1}% ± {:.1} | {:.1}% ± {:.1} |\n",
            g.label,
            g.runs.len(),
            bm * 100.0,
            bs * 100.0,
            am * 100.0,
            as_ * 100.0
        ));
        // Mean of each metric per RL step across the seeds that report it there.
        // Each run's metrics.jsonl is read once, whatever the number of metrics drawn.
        let series: Vec<Series> = g.runs.iter().map(|r| load(r)).collect::<Result<_>>()?;
        for metric in metrics {
            let per_run: Vec<std::collections::BTreeMap<usize, f64>> = series
                .iter()
                .map(|run| {
                    let raw: Vec<(usize, f64)> = run
                        .rl
                        .iter()
                        .enumerate()
                        .filter_map(|(i, (_, m))| {
                            m.get(metric).and_then(Value::as_f64).map(|v| (i, v))
                        })
                        .collect();
                    let values: Vec<f64> = raw.iter().map(|&(_, v)| v).collect();
                    let smooth = trailing_mean(&values, SMOOTHING_STEPS);
                    raw.iter().map(|&(i, _)| i).zip(smooth).collect()
                })
                .collect();
            let steps: std::collections::BTreeSet<usize> =
                per_run.iter().flat_map(|r| r.keys().copied()).collect();
            let curve: Vec<(f64, f64, f64)> = steps
                .into_iter()
                .map(|i| {
                    let xs: Vec<f64> = per_run.iter().filter_map(|r| r.get(&i).copied()).collect();
                    let (m, s) = mean_std(&xs);
                    ((i + 1) as f64, m, s)
                })
                .collect();
            if curve.is_empty() {
                // A method that never logs this metric (grpo next to edge's `edge/success_e`)
                // is left out of the figure, said so; the table still lists it.
                eprintln!(
                    "note: no run of `{}` reports `{metric}`; it is left out of the figure",
                    g.label
                );
                continue;
            }
            let label = if metrics.len() == 1 {
                g.label.clone()
            } else {
                format!("{}: {metric}", g.label)
            };
            curves.push((label, curve));
        }
    }
    if curves.is_empty() {
        anyhow::bail!(
            "no run reports {} in metrics.jsonl; name a key its lines have (e.g. \
             `success_rate`)",
            metrics
                .iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(" or ")
        );
    }
    out.write_via_path(|path| draw_comparison(&curves, metrics, path))?;
    Ok(table)
}

/// One algorithm's (and metric's) mean curve in a comparison: its label and
/// `(step, mean, std)` points.
type Curve = (String, Vec<(f64, f64, f64)>);

/// Draws the mean `curves` of `metrics` into the PNG file `out`.
fn draw_comparison(curves: &[Curve], metrics: &[String], out: &Path) -> Result<()> {
    let root = BitMapBackend::new(out, (1100, 650)).into_drawing_area();
    root.fill(&WHITE)?;
    let x1 = curves
        .iter()
        .flat_map(|(_, c)| c.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let top = curves
        .iter()
        .flat_map(|(_, c)| c.iter().map(|p| p.1 + p.2))
        .fold(0.0, f64::max);
    let bottom = curves
        .iter()
        .flat_map(|(_, c)| c.iter().map(|p| p.1 - p.2))
        .fold(0.0, f64::min);
    let rates = curves
        .iter()
        .flat_map(|(_, c)| c.iter())
        .all(|p| (0.0..=1.0).contains(&p.1));
    // Rates are drawn on [0, 1] (bands clipped to it); anything else (a bank size, a utility)
    // on its own range.
    let (y0, y1, floor, cap) = if rates {
        (0.0, 1.0, 0.0, 1.0)
    } else {
        let pad = 0.05 * (top - bottom).max(1e-9);
        (bottom - pad, top + pad, f64::NEG_INFINITY, f64::INFINITY)
    };
    let what = if metrics.len() == 1 && metrics[0] == "success_rate" {
        "training success rate".to_string()
    } else {
        metrics.join(", ")
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{what} per RL step ({SMOOTHING_STEPS}-step trailing mean; mean ± std over seeds)"
            ),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(1.0..x1.max(2.0), y0..y1)?;
    chart
        .configure_mesh()
        .x_desc("RL step")
        .y_desc(if metrics.len() == 1 {
            metrics[0].as_str()
        } else {
            "value"
        })
        .draw()?;
    // Ten distinct colours: with six, a seven-method comparison drew its first and last methods
    // in the same colour. Beyond ten, colours repeat.
    let palette = [
        BLUE,
        RED,
        GREEN,
        MAGENTA,
        CYAN,
        BLACK,
        RGBColor(255, 140, 0),
        RGBColor(128, 0, 128),
        RGBColor(128, 128, 0),
        RGBColor(139, 69, 19),
    ];
    for (i, (label, curve)) in curves.iter().enumerate() {
        let color = palette[i % palette.len()];
        let band: Vec<(f64, f64)> = curve
            .iter()
            .map(|&(x, m, s)| (x, (m + s).min(cap)))
            .chain(curve.iter().rev().map(|&(x, m, s)| (x, (m - s).max(floor))))
            .collect();
        chart.draw_series(std::iter::once(Polygon::new(
            band,
            color.mix(0.12).filled(),
        )))?;
        chart
            .draw_series(LineSeries::new(
                curve.iter().map(|&(x, m, _)| (x, m)),
                color.stroke_width(2),
            ))?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    root.present()
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_mean_averages_the_last_w_values() {
        let got = trailing_mean(&[1.0, 3.0, 5.0, 7.0], 2);
        assert_eq!(got, vec![1.0, 2.0, 4.0, 6.0]);
        assert_eq!(trailing_mean(&[], 5), Vec::<f64>::new());
    }

    #[test]
    fn mean_std_uses_the_sample_std() {
        let (m, s) = mean_std(&[0.5, 0.6, 0.7]);
        assert!((m - 0.6).abs() < 1e-12);
        assert!((s - 0.1).abs() < 1e-12, "{s}");
        assert_eq!(mean_std(&[0.3]), (0.3, 0.0));
        assert!(mean_std(&[]).0.is_nan());
    }
}
