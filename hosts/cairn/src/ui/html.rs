//! HTML building blocks of the dashboard: escaping (every value that comes from a run is user
//! data: task text, token text, plugin names), the page frame, query-string encoding and the
//! diverging colour scale of advantages.

use std::fmt::Write;

/// `text` with `& < > " '` escaped, safe inside element content and quoted attributes.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` percent-encoded for a query-string value (everything but `A-Z a-z 0-9 - _ . ~`).
pub fn query_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A float for display: at most 4 decimals (exponent form when tiny or huge), `-` for a missing or non-finite value.
pub fn num(x: Option<f64>) -> String {
    match x {
        Some(x) if x.is_finite() => {
            if x == x.trunc() && x.abs() < 1e12 {
                // `+ 0.0` turns -0 into 0.
                format!("{:.0}", x + 0.0)
            } else if x.abs() >= 1e-3 && x.abs() < 1e6 {
                let s = format!("{x:.4}");
                s.trim_end_matches('0').trim_end_matches('.').to_owned()
            } else {
                format!("{x:.3e}")
            }
        }
        _ => "-".into(),
    }
}

/// The background colour of a token with advantage `a` on a scale whose ends are `±scale`:
/// blue for negative, white at 0, red for positive (a diverging scale; `scale <= 0` gives
/// white).
pub fn advantage_colour(a: f64, scale: f64) -> String {
    let t = if scale > 0.0 && a.is_finite() {
        (a / scale).clamp(-1.0, 1.0)
    } else {
        0.0
    };
    // White (255,255,255) towards red (214,39,40) or blue (31,119,180).
    let (r, g, b) = if t >= 0.0 {
        (214.0, 39.0, 40.0)
    } else {
        (31.0, 119.0, 180.0)
    };
    let t = t.abs();
    let mix = |c: f64| (255.0 + (c - 255.0) * t).round() as u8;
    format!("#{:02x}{:02x}{:02x}", mix(r), mix(g), mix(b))
}

/// A whole page: `title` (escaped here), the navigation, and `body` (already HTML). `base` is
/// the dashboard's path prefix (`""`, or `"/ui"` beside the gateway).
pub fn page(base: &str, title: &str, body: &str, gateway: bool) -> String {
    let gateway_link = if gateway {
        format!(r#" · <a href="{base}/gateway">gateway</a>"#)
    } else {
        String::new()
    };
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · cairn</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{base}/static/dashboard.css">
</head><body data-base="{base}">
<nav><a href="{base}/">cairn</a> · <a href="{base}/">runs</a>{gateway_link}</nav>
<main>
{body}
</main>
<script src="{base}/static/dashboard.js"></script>
</body></html>
"#,
        title = escape(title),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_makes_markup_inert() {
        assert_eq!(
            escape(r#"<script>alert("x&y")</script>'"#),
            "&lt;script&gt;alert(&quot;x&amp;y&quot;)&lt;/script&gt;&#39;"
        );
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(
            query_value("scaffolds/edge seed&1"),
            "scaffolds%2Fedge%20seed%261"
        );
        assert_eq!(query_value("é"), "%C3%A9");
    }

    #[test]
    fn the_colour_scale_diverges_around_white() {
        assert_eq!(advantage_colour(0.0, 1.0), "#ffffff");
        assert_eq!(advantage_colour(2.0, 1.0), "#d62728");
        assert_eq!(advantage_colour(-1.0, 1.0), "#1f77b4");
        assert_eq!(advantage_colour(f64::NAN, 1.0), "#ffffff");
        assert_eq!(advantage_colour(1.0, 0.0), "#ffffff");
    }

    #[test]
    fn numbers_are_short() {
        assert_eq!(num(Some(2.0)), "2");
        assert_eq!(num(Some(-0.0)), "0");
        assert_eq!(num(Some(0.123456)), "0.1235");
        assert_eq!(num(Some(f64::NAN)), "-");
        assert_eq!(num(None), "-");
        assert_eq!(num(Some(1.5e-7)), "1.500e-7");
    }
}
