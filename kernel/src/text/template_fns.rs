//! The Python-side helpers Hugging Face adds to its chat-template Jinja environment, rebuilt so
//! that minijinja renders byte for byte what Python jinja2 renders.
//!
//! transformers (`utils/chat_template_utils.py`, `_cached_compile_jinja_template`) overrides
//! `tojson` with `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)` (no HTML escaping, `", "`/`": "` separators, insertion order) and adds the
//! globals `raise_exception(msg)` and `strftime_now(fmt)`. [`py_json_dumps`] reproduces
//! `json.dumps` (including Python's float `repr`), [`strftime`] the C `strftime` codes templates
//! use, and [`CivilTime`] is the clock `strftime_now` reads, pinned per render by
//! [`super::RenderOptions::now`]. Only [`super::template`] calls the minijinja glue here.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error as JinjaError, ErrorKind, State, Value};

/// Context variable that carries a pinned clock (unix seconds) into `strftime_now`.
pub(crate) const NOW_VAR: &str = "__cairn_now_unix_s";

/// Options of Python's `json.dumps` that templates pass to `tojson`; the default is
/// transformers' (`ensure_ascii=False`, compact, insertion order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JsonDumps {
    /// Escape every non-ASCII character as `\uXXXX` (transformers' default: `false`).
    pub ensure_ascii: bool,
    /// Pretty-print with this indent string per level (`indent=4` is four spaces).
    pub indent: Option<String>,
    /// `(item, key)` separators; `None` means Python's default for the indent mode.
    pub separators: Option<(String, String)>,
    /// Sort object keys (by their JSON string form).
    pub sort_keys: bool,
}

/// `json.dumps(value, **options)` as Python writes it, for a JSON value (e.g. the `arguments`
/// string of an OpenAI tool call as vLLM writes it).
pub fn py_json_dumps(value: &serde_json::Value, options: &JsonDumps) -> String {
    dumps_value(&Value::from_serialize(value), options)
        .expect("a JSON value has no undefined, bytes or non-scalar keys")
}

/// [`py_json_dumps`] of a template value. Errors where Python raises `TypeError` (undefined
/// values, bytes, non-scalar keys).
pub(crate) fn dumps_value(value: &Value, options: &JsonDumps) -> Result<String, JinjaError> {
    let (item_sep, key_sep) = match (&options.separators, &options.indent) {
        (Some((item, key)), _) => (item.clone(), key.clone()),
        (None, Some(_)) => (",".to_owned(), ": ".to_owned()),
        (None, None) => (", ".to_owned(), ": ".to_owned()),
    };
    let mut writer = JsonWriter {
        options,
        item_sep,
        key_sep,
        out: String::new(),
    };
    writer.value(value, 0)?;
    Ok(writer.out)
}

struct JsonWriter<'a> {
    options: &'a JsonDumps,
    item_sep: String,
    key_sep: String,
    out: String,
}

impl JsonWriter<'_> {
    fn value(&mut self, value: &Value, level: usize) -> Result<(), JinjaError> {
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(value)?,
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            ValueKind::Seq => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.container(('[', ']'), items.len(), level, |w, i, level| {
                    w.value(&items[i], level)
                })?;
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((key_string(&key)?, item));
                }
                if self.options.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container(('{', '}'), entries.len(), level, |w, i, level| {
                    w.string(&entries[i].0);
                    let key_sep = w.key_sep.clone();
                    w.out.push_str(&key_sep);
                    w.value(&entries[i].1, level)
                })?;
            }
            kind => {
                return Err(JinjaError::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: object of kind {kind} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }

    /// Writes `[...]`/`{...}` the way `json.encoder._make_iterencode` does.
    fn container(
        &mut self,
        (open, close): (char, char),
        len: usize,
        level: usize,
        mut item: impl FnMut(&mut Self, usize, usize) -> Result<(), JinjaError>,
    ) -> Result<(), JinjaError> {
        if len == 0 {
            self.out.push(open);
            self.out.push(close);
            return Ok(());
        }
        self.out.push(open);
        let indent = self.options.indent.clone();
        let newline = |level: usize| {
            indent
                .as_ref()
                .map(|unit| format!("\n{}", unit.repeat(level)))
        };
        if let Some(nl) = newline(level + 1) {
            self.out.push_str(&nl);
        }
        for i in 0..len {
            if i > 0 {
                let sep = self.item_sep.clone();
                self.out.push_str(&sep);
                if let Some(nl) = newline(level + 1) {
                    self.out.push_str(&nl);
                }
            }
            item(self, i, level + 1)?;
        }
        if let Some(nl) = newline(level) {
            self.out.push_str(&nl);
        }
        self.out.push(close);
        Ok(())
    }

    fn number(&mut self, value: &Value) -> Result<(), JinjaError> {
        if value.is_integer() {
            // i128/u128 survive as their decimal text, like Python ints.
            self.out.push_str(&value.to_string());
        } else {
            let x = f64::try_from(value.clone())?;
            self.out.push_str(&py_float_repr(x));
        }
        Ok(())
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{08}' => self.out.push_str("\\b"),
                '\u{0c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(self.out, "\\u{:04x}", c as u32);
                }
                c if self.options.ensure_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// A dict key as `json.dumps` coerces it: strings as-is, numbers, booleans and None as JSON text.
fn key_string(key: &Value) -> Result<String, JinjaError> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        ValueKind::Number if key.is_integer() => Ok(key.to_string()),
        ValueKind::Number => Ok(py_float_repr(f64::try_from(key.clone())?)),
        kind => Err(JinjaError::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

/// Python's `repr(float)` (and so `json.dumps` of a float): the shortest round-trip digits,
/// positional for `1e-4 <= |x| < 1e16`, otherwise scientific with a signed two-digit exponent.
pub fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    let abs = x.abs();
    if abs == 0.0 || (1e-4..1e16).contains(&abs) {
        let mut s = format!("{x}");
        if !s.contains('.') {
            s.push_str(".0");
        }
        return s;
    }
    let s = format!("{x:e}");
    let (mantissa, exponent) = s
        .split_once('e')
        .expect("`{:e}` of a finite float has an exponent");
    let (sign, digits) = match exponent.strip_prefix('-') {
        Some(digits) => ('-', digits),
        None => ('+', exponent),
    };
    format!("{mantissa}e{sign}{digits:0>2}")
}

/// The `tojson` filter: `json.dumps` with transformers' defaults and keyword options
/// `ensure_ascii`, `indent` (int or string), `separators` (pair) and `sort_keys`.
pub(crate) fn tojson_filter(value: &Value, kwargs: Kwargs) -> Result<String, JinjaError> {
    let mut options = JsonDumps::default();
    if let Some(ensure_ascii) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        options.ensure_ascii = ensure_ascii;
    }
    if let Some(indent) = kwargs.get::<Option<Value>>("indent")? {
        options.indent = match indent.kind() {
            ValueKind::None => None,
            ValueKind::String => Some(indent.as_str().unwrap_or_default().to_owned()),
            _ => {
                let n = i64::try_from(indent)?;
                Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
            }
        };
    }
    if let Some(separators) = kwargs.get::<Option<Value>>("separators")? {
        if !separators.is_none() {
            let parts: Vec<String> = separators.try_iter()?.map(|v| v.to_string()).collect();
            let [item, key] = <[String; 2]>::try_from(parts).map_err(|_| {
                JinjaError::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be an (item, key) pair",
                )
            })?;
            options.separators = Some((item, key));
        }
    }
    if let Some(sort_keys) = kwargs.get::<Option<bool>>("sort_keys")? {
        options.sort_keys = sort_keys;
    }
    kwargs.assert_all_used()?;
    dumps_value(value, &options)
}

/// `raise_exception(message)`: aborts the render with the template's own message.
pub(crate) fn raise_exception(message: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the pinned clock of this render, else the system clock (UTC; Python
/// uses local time, which a host can pin through [`super::RenderOptions::now`]).
pub(crate) fn strftime_now(state: &State, format: String) -> Result<String, JinjaError> {
    let now = match state.lookup(NOW_VAR).and_then(|v| v.as_i64()) {
        Some(unix_s) => CivilTime::from_unix_seconds(unix_s),
        None => CivilTime::now_utc(),
    };
    Ok(strftime(&format, &now))
}

/// A calendar date and wall-clock time (proleptic Gregorian, no time zone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CivilTime {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

impl CivilTime {
    /// The UTC date and time of a unix timestamp (Hinnant's `civil_from_days`).
    pub fn from_unix_seconds(unix_s: i64) -> CivilTime {
        let days = unix_s.div_euclid(86_400);
        let secs = unix_s.rem_euclid(86_400);
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let secs = secs as u32;
        CivilTime {
            year,
            month,
            day,
            hour: secs / 3600,
            minute: secs / 60 % 60,
            second: secs % 60,
        }
    }

    /// Unix seconds of this time read as UTC (Hinnant's `days_from_civil`).
    pub fn to_unix_seconds(&self) -> i64 {
        let y = self.year - i64::from(self.month <= 2);
        let era = y.div_euclid(400);
        let yoe = y.rem_euclid(400);
        let m = i64::from(self.month);
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(self.day) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        days * 86_400
            + i64::from(self.hour) * 3600
            + i64::from(self.minute) * 60
            + i64::from(self.second)
    }

    fn now_utc() -> CivilTime {
        let unix_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        CivilTime::from_unix_seconds(unix_s)
    }

    /// 0 = Monday .. 6 = Sunday.
    fn weekday(&self) -> u32 {
        // 1970-01-01 was a Thursday (3).
        (self.to_unix_seconds().div_euclid(86_400) + 3).rem_euclid(7) as u32
    }

    fn day_of_year(&self) -> u32 {
        let jan1 = CivilTime {
            month: 1,
            day: 1,
            hour: 0,
            minute: 0,
            second: 0,
            ..*self
        };
        ((self.to_unix_seconds() - jan1.to_unix_seconds()).div_euclid(86_400) + 1) as u32
    }
}

const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// C `strftime` in the C locale for the codes chat templates use: `%a %A %b %B %d %e %H %I %j
/// %m %M %p %S %y %Y %%`, glibc's `%-d`-style unpadded forms, and `%c %x %X %D %F %T`. `%z`
/// and `%Z` are empty (naive time, as Python's `datetime.now()`); other codes are copied.
pub fn strftime(format: &str, t: &CivilTime) -> String {
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let Some(code) = chars.next() else {
            out.push('%');
            break;
        };
        let num = |n: u32, width: usize| {
            if unpadded {
                n.to_string()
            } else {
                format!("{n:0width$}")
            }
        };
        let hour12 = match t.hour % 12 {
            0 => 12,
            h => h,
        };
        let piece = match code {
            'a' => WEEKDAYS[t.weekday() as usize][..3].to_owned(),
            'A' => WEEKDAYS[t.weekday() as usize].to_owned(),
            'b' | 'h' => MONTHS[t.month as usize - 1][..3].to_owned(),
            'B' => MONTHS[t.month as usize - 1].to_owned(),
            'd' => num(t.day, 2),
            'e' => {
                if unpadded {
                    t.day.to_string()
                } else {
                    format!("{:2}", t.day)
                }
            }
            'H' => num(t.hour, 2),
            'I' => num(hour12, 2),
            'j' => num(t.day_of_year(), 3),
            'm' => num(t.month, 2),
            'M' => num(t.minute, 2),
            'p' => if t.hour < 12 { "AM" } else { "PM" }.to_owned(),
            'S' => num(t.second, 2),
            'y' => num(t.year.rem_euclid(100) as u32, 2),
            'Y' => t.year.to_string(),
            'c' => strftime("%a %b %e %H:%M:%S %Y", t),
            'x' | 'D' => strftime("%m/%d/%y", t),
            'X' | 'T' => strftime("%H:%M:%S", t),
            'F' => strftime("%Y-%m-%d", t),
            'z' | 'Z' => String::new(),
            '%' => "%".to_owned(),
            other => format!("%{}{other}", if unpadded { "-" } else { "" }),
        };
        out.push_str(&piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(json: &str, options: &JsonDumps) -> String {
        let value: serde_json::Value = serde_json::from_str(json).expect("test JSON parses");
        py_json_dumps(&value, options)
    }

    #[test]
    fn float_repr_matches_python() {
        for (x, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (1e-4, "0.0001"),
            (9.99e-5, "9.99e-05"),
            (123456789.125, "123456789.125"),
            (9999999999999998.0, "9999999999999998.0"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (f64::INFINITY, "Infinity"),
        ] {
            assert_eq!(py_float_repr(x), want, "{x:?}");
        }
    }

    #[test]
    fn dumps_matches_python_layouts() {
        let compact = JsonDumps::default();
        let doc = r#"{"b": [1, 2.0, {}], "a": "x<\u00e9>\n", "c": [], "d": null}"#;
        assert_eq!(
            dumps(doc, &compact),
            "{\"b\": [1, 2.0, {}], \"a\": \"x<\u{e9}>\\n\", \"c\": [], \"d\": null}"
        );
        let indented = JsonDumps {
            indent: Some("  ".into()),
            sort_keys: true,
            ..JsonDumps::default()
        };
        assert_eq!(
            dumps(doc, &indented),
            "{\n  \"a\": \"x<\u{e9}>\\n\",\n  \"b\": [\n    1,\n    2.0,\n    {}\n  ],\n  \"c\": [],\n  \"d\": null\n}"
        );
        let ascii = JsonDumps {
            ensure_ascii: true,
            ..JsonDumps::default()
        };
        assert_eq!(
            dumps(r#""é😀\u0001""#, &ascii),
            r#""\u00e9\ud83d\ude00\u0001""#
        );
    }

    #[test]
    fn civil_time_round_trips_and_formats() {
        let t = CivilTime {
            year: 2024,
            month: 7,
            day: 6,
            hour: 15,
            minute: 4,
            second: 5,
        };
        assert_eq!(CivilTime::from_unix_seconds(t.to_unix_seconds()), t);
        assert_eq!(CivilTime::from_unix_seconds(0).year, 1970);
        assert_eq!(
            strftime("%d %b %Y|%A %B %-d %e|%I%p %j %y %%|%q", &t),
            "06 Jul 2024|Saturday July 6  6|03PM 188 24 %|%q"
        );
    }
}
