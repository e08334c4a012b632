//! Reading the JSON-lines files a trainer appends to (`metrics.jsonl`, `eval.jsonl`) while it
//! may still be writing, or after it was killed mid-line: the dashboard (`ui/runs.rs`) and
//! `cairn plot` (`plot.rs`) read them through [`read`].

use std::path::Path;

use serde_json::{Map, Value as Json};

/// The lines of a JSON-lines file.
#[derive(Debug, Default)]
pub struct Lines {
    /// The objects, in file order.
    pub rows: Vec<Map<String, Json>>,
    /// Lines that are not a JSON object, and a file that cannot be read: `"FILE line N: why"`.
    pub problems: Vec<String>,
    /// The 1-based number of a last line that was left out because it is cut off: it has no
    /// newline and does not parse (being written, or what a killed writer left).
    pub cut_off: Option<usize>,
}

/// Reads `path` as JSON lines. A missing file gives no lines (a run that has not written it
/// yet); blank lines are skipped; a cut-off last line is left out ([`Lines::cut_off`]).
pub fn read(path: &Path) -> Lines {
    let text = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lines::default(),
        Err(e) => {
            return Lines {
                problems: vec![format!("{}: {e}", path.display())],
                ..Lines::default()
            }
        }
    };
    let complete = text.last() == Some(&b'\n');
    let text = String::from_utf8_lossy(&text);
    let mut lines = Lines::default();
    let all: Vec<&str> = text.lines().collect();
    for (i, line) in all.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Json>(line) {
            Ok(Json::Object(m)) => lines.rows.push(m),
            Err(_) if i + 1 == all.len() && !complete => lines.cut_off = Some(i + 1),
            Ok(_) => lines.problems.push(format!(
                "{} line {}: not a JSON object",
                path.display(),
                i + 1
            )),
            Err(e) => lines
                .problems
                .push(format!("{} line {}: {e}", path.display(), i + 1)),
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_off_last_line_is_left_out_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        std::fs::write(&path, "{\"step\":1}\nnot json\n{\"step\":3,\"lo").unwrap();
        let lines = read(&path);
        assert_eq!((lines.rows.len(), lines.cut_off), (1, Some(3)));
        assert_eq!(lines.problems.len(), 1);
        assert!(lines.problems[0].contains("line 2"), "{:?}", lines.problems);
        // A last line without its newline that parses counts; one with its newline that does
        // not parse is a problem like any other.
        std::fs::write(&path, "{\"step\":1}\n{\"step\":2}").unwrap();
        let lines = read(&path);
        assert_eq!((lines.rows.len(), lines.cut_off), (2, None));
        std::fs::write(&path, "{\"step\":1}\n{\"step\":2,\n").unwrap();
        let lines = read(&path);
        assert_eq!((lines.rows.len(), lines.cut_off), (1, None));
        assert!(lines.problems[0].contains("line 2"), "{:?}", lines.problems);
    }
}
