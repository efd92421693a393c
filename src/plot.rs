//! The benchmarks' `--plot` charts as SVG: grouped bars (optionally with a reference
//! line) and lines over a numeric axis.

/// One series of bars: its name in the legend and its colour.
pub struct Series<'a> {
    pub name: &'a str,
    pub color: &'a str,
}

/// A bar chart with one group of bars per label, one bar per series in each group.
/// `values[g][s]` is series `s` in group `g`.
pub fn grouped_bars(
    title: &str,
    unit: &str,
    series: &[Series<'_>],
    labels: &[String],
    values: &[Vec<f64>],
) -> String {
    grouped_bars_with_reference(title, unit, series, labels, values, None)
}

/// [`grouped_bars`] with a dashed horizontal line at `reference.0`, labelled
/// `reference.1` (a capacity, a baseline).
pub fn grouped_bars_with_reference(
    title: &str,
    unit: &str,
    series: &[Series<'_>],
    labels: &[String],
    values: &[Vec<f64>],
    reference: Option<(f64, &str)>,
) -> String {
    let bar = 14.0;
    let widest_label = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0) as f64;
    let group = (bar * series.len() as f64 + 12.0).max(6.5 * widest_label + 12.0);
    let legend = 18.0 * series.len() as f64;
    let (left, bottom) = (60.0, 40.0);
    // Title, then the legend, then the bars.
    let top = 40.0 + legend + 10.0;
    let w = (left + 10.0 + group * labels.len() as f64)
        .max(7.0 * title.chars().count() as f64 + left)
        .max(480.0);
    let h = top + 300.0 + bottom;
    let max = values
        .iter()
        .flatten()
        .copied()
        .chain(reference.map(|r| r.0))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let step = nice_step(max / 4.0);
    let ticks = (max / step).ceil().max(1.0) as usize;
    let scale = 300.0 / (step * ticks as f64);
    let base = h - bottom;
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w:.0}' height='{h:.0}' \
         font-family='sans-serif' font-size='11'>\n\
         <rect width='100%' height='100%' fill='white'/>\n\
         <text x='10' y='20' font-size='13'>{}</text>\n",
        escape(title)
    );
    for (k, se) in series.iter().enumerate() {
        let y = 32.0 + 18.0 * k as f64;
        s += &format!(
            "<rect x='{left}' y='{y:.1}' width='10' height='10' fill='{}'/>\
             <text x='{:.1}' y='{:.1}'>{}</text>\n",
            se.color,
            left + 15.0,
            y + 9.0,
            escape(se.name)
        );
    }
    for i in 0..=ticks {
        let v = step * i as f64;
        let y = base - v * scale;
        s += &format!(
            "<line x1='{left}' x2='{w:.0}' y1='{y:.1}' y2='{y:.1}' stroke='#ddd'/>\
             <text x='5' y='{:.1}'>{}</text>\n",
            y + 4.0,
            tick(v)
        );
    }
    s += &format!(
        "<text x='5' y='{:.1}' fill='#555'>{}</text>\n",
        base - 300.0 - 12.0,
        escape(unit)
    );
    for (g, label) in labels.iter().enumerate() {
        let x0 = left + 10.0 + group * g as f64;
        for (k, se) in series.iter().enumerate() {
            let v = values
                .get(g)
                .and_then(|r| r.get(k))
                .copied()
                .unwrap_or(f64::NAN);
            if !v.is_finite() {
                continue;
            }
            let bh = v * scale;
            s += &format!(
                "<rect x='{:.1}' y='{:.1}' width='{bar}' height='{bh:.1}' fill='{}'/>\n",
                x0 + bar * k as f64,
                base - bh,
                se.color
            );
        }
        s += &format!(
            "<text x='{x0:.1}' y='{:.1}'>{}</text>\n",
            base + 15.0,
            escape(label)
        );
    }
    if let Some((v, label)) = reference.filter(|r| r.0.is_finite()) {
        let y = base - v * scale;
        s += &format!(
            "<line x1='{left}' x2='{w:.0}' y1='{y:.1}' y2='{y:.1}' stroke='#d33' \
             stroke-dasharray='6,3'/><text x='{:.0}' y='{:.1}' fill='#d33'>{}</text>\n",
            w - 7.0 * label.chars().count() as f64 - 10.0,
            y - 4.0,
            escape(label)
        );
    }
    s + "</svg>\n"
}

/// Colours for series in order.
pub const COLOURS: [&str; 8] = [
    "#3b6fd4", "#d33", "#3a9d5d", "#b8860b", "#8a2be2", "#555", "#e377c2", "#17becf",
];

/// A line per series over a numeric x axis, named by `x_label`, values in `unit`.
/// Points repeated at one x (repeated runs) are each drawn as a dot, and the line
/// joins their medians.
pub fn lines(title: &str, x_label: &str, unit: &str, series: &[(&str, Vec<(f64, f64)>)]) -> String {
    let points = || series.iter().flat_map(|(_, p)| p.iter().copied());
    let (x0, x1) = points().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (x, _)| {
        (lo.min(x), hi.max(x))
    });
    let max = points()
        .map(|p| p.1)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let step = nice_step(max / 4.0);
    let ticks = (max / step).ceil().max(1.0) as usize;
    let y1 = step * ticks as f64;
    // The legend's width: about 7 pixels a character.
    let legend = series
        .iter()
        .map(|(n, _)| n.chars().count())
        .max()
        .unwrap_or(0);
    let right = (legend as f64 * 7.0 + 20.0).max(160.0);
    let (w, h, left, top, bottom) = (480.0 + right, 400.0, 70.0, 40.0, 50.0);
    let px = |x: f64| {
        if x1 > x0 {
            left + (x - x0) / (x1 - x0) * (w - left - right)
        } else {
            left + (w - left - right) / 2.0
        }
    };
    let py = |y: f64| h - bottom - y / y1 * (h - top - bottom);
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' \
         font-family='sans-serif' font-size='11'>\n\
         <rect width='100%' height='100%' fill='white'/>\n\
         <text x='{left}' y='20' font-size='13'>{}</text>\n",
        escape(title)
    );
    for i in 0..=ticks {
        let v = step * i as f64;
        s += &format!(
            "<line x1='{left}' x2='{:.0}' y1='{:.1}' y2='{:.1}' stroke='#ddd'/>\
             <text x='5' y='{:.1}'>{} {}</text>\n",
            w - right,
            py(v),
            py(v),
            py(v) + 4.0,
            tick(v),
            escape(unit)
        );
    }
    let mut xs: Vec<f64> = points().map(|p| p.0).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    for x in xs {
        s += &format!(
            "<text x='{:.1}' y='{:.0}' text-anchor='middle'>{}</text>\n",
            px(x),
            h - bottom + 16.0,
            tick(x)
        );
    }
    s += &format!(
        "<text x='{:.0}' y='{:.0}' text-anchor='middle' fill='#555'>{}</text>\n",
        (left + w - right) / 2.0,
        h - 10.0,
        escape(x_label)
    );
    for (i, (name, points)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let mut points = points.clone();
        points.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let path: Vec<String> = points
            .chunk_by(|a, b| a.0 == b.0)
            .map(|runs| {
                let (x, y) = runs[runs.len() / 2];
                format!("{:.1},{:.1}", px(x), py(y))
            })
            .collect();
        s += &format!(
            "<polyline fill='none' stroke='{c}' stroke-width='2' points='{}'/>\n",
            path.join(" ")
        );
        for (x, y) in &points {
            s += &format!(
                "<circle cx='{:.1}' cy='{:.1}' r='3' fill='{c}'/>\n",
                px(*x),
                py(*y)
            );
        }
        s += &format!(
            "<text x='{:.0}' y='{:.0}' fill='{c}'>{}</text>\n",
            w - right + 10.0,
            top + 16.0 * (i as f64 + 1.0),
            escape(name)
        );
    }
    s + "</svg>\n"
}

/// Charts one above the other in one SVG (each keeps its own size).
pub fn stacked(charts: &[String]) -> String {
    let size = |svg: &str, attr: &str| -> f64 {
        svg.split_once(&format!(" {attr}='"))
            .and_then(|(_, rest)| rest.split('\'').next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let width = charts.iter().map(|c| size(c, "width")).fold(0.0, f64::max);
    let mut y = 0.0;
    let mut body = String::new();
    for c in charts {
        // The chart's root element, placed at its offset.
        body += &c.replacen("<svg ", &format!("<svg y='{y}' "), 1);
        y += size(c, "height");
    }
    format!("<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{y}'>\n{body}</svg>\n")
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw.is_nan() || raw <= 0.0 || raw.is_infinite() {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

fn tick(v: f64) -> String {
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacked_charts_keep_their_sizes_one_below_the_other() {
        let bars = grouped_bars(
            "t",
            "s",
            &[Series {
                name: "a",
                color: "#111",
            }],
            &["x".into()],
            &[vec![1.0]],
        );
        let a_long_legend = "a legend far longer than the default margin holds";
        let lines = lines(
            "u",
            "x",
            "",
            &[(a_long_legend, vec![(0.0, 1.0), (1.0, 2.0)])],
        );
        let size = |svg: &str, attr: &str| -> f64 {
            let rest = svg.split_once(&format!(" {attr}='")).unwrap().1;
            rest.split('\'').next().unwrap().parse().unwrap()
        };
        // The legend widens the lines chart.
        assert!(size(&lines, "width") > 640.0, "{lines}");
        let both = stacked(&[bars.clone(), lines.clone()]);
        assert_eq!(
            size(&both, "height"),
            size(&bars, "height") + size(&lines, "height")
        );
        assert_eq!(
            size(&both, "width"),
            size(&bars, "width").max(size(&lines, "width"))
        );
        let second = format!("<svg y='{}' ", size(&bars, "height"));
        assert!(
            both.contains("<svg y='0' ") && both.contains(&second),
            "{both}"
        );
        assert!(both.ends_with("</svg>\n</svg>\n"));
    }

    #[test]
    fn bars_scale_to_the_largest_value_and_skip_missing_ones() {
        let series = [
            Series {
                name: "a <1>",
                color: "#111",
            },
            Series {
                name: "b",
                color: "#222",
            },
        ];
        let svg = grouped_bars(
            "t",
            "s",
            &series,
            &["x".into(), "y".into()],
            &[vec![1.0, 2.0], vec![4.0, f64::NAN]],
        );
        assert!(svg.contains("a &lt;1&gt;"));
        // Three bars: the missing value draws none.
        assert_eq!(svg.matches("width='14'").count(), 3);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        // Ticks at round values up to the largest bar.
        assert!(
            svg.contains(">4</text>") && svg.contains(">1</text>"),
            "{svg}"
        );
        assert_eq!(nice_step(0.43), 0.5);
        assert_eq!(nice_step(3.0), 5.0);
        let with_line = grouped_bars_with_reference(
            "t",
            "MB/s",
            &series,
            &["x".into()],
            &[vec![1.0, 2.0]],
            Some((8.0, "capacity")),
        );
        // The reference line raises the scale to its value.
        assert!(with_line.contains("stroke-dasharray") && with_line.contains(">8</text>"));
    }

    #[test]
    fn lines_join_the_medians_and_dot_every_point() {
        let svg = lines(
            "t",
            "Zipf exponent",
            "s",
            &[
                ("hash", vec![(0.0, 1.0), (1.0, 3.0), (1.0, 2.0), (1.0, 9.0)]),
                ("flow", vec![(0.0, 1.1), (1.0, 1.0)]),
            ],
        );
        assert_eq!(svg.matches("<circle").count(), 6);
        assert_eq!(svg.matches("<polyline").count(), 2);
        // The hash line's second point is the median run (3 s), not the 9 s outlier.
        let hash = svg.split("<polyline").nth(1).unwrap();
        let y_of = |v: f64| 400.0 - 50.0 - v / 10.0 * 310.0;
        assert!(hash.contains(&format!("{:.1}", y_of(3.0))), "{hash}");
        assert!(svg.contains("Zipf exponent") && svg.ends_with("</svg>\n"));
    }
}
