//! The library's production sources as the size test reads them: comments and literals blanked,
//! test files and `#[cfg(test)]` items left out. Test code only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// `source` with its comments, string and character literals blanked (newlines kept), so that
/// what is left is code whose braces and paths can be read as they are.
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut at = 0;
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while at < chars.len() {
        let end = literal_end(&chars, at);
        if end > at {
            chars[at..end].iter().for_each(|&c| blank(&mut out, c));
            at = end;
        } else {
            out.push(chars[at]);
            at += 1;
        }
    }
    out
}

/// Where the comment or literal starting at `at` ends (`at`: none starts there).
fn literal_end(chars: &[char], at: usize) -> usize {
    let next = |offset: usize| chars.get(at + offset).copied();
    match (chars[at], next(1)) {
        ('/', Some('/')) => (at..chars.len())
            .find(|&i| chars[i] == '\n')
            .unwrap_or(chars.len()),
        ('/', Some('*')) => block_comment_end(chars, at),
        ('"', _) => string_end(chars, at + 1, 0),
        ('r', Some('"' | '#')) if at == 0 || !is_ident(chars[at - 1]) => {
            let hashes = chars[at + 1..].iter().take_while(|&&c| c == '#').count();
            match chars.get(at + 1 + hashes) {
                Some('"') => string_end(chars, at + 2 + hashes, hashes),
                _ => at,
            }
        }
        ('b', Some('"' | '\'' | 'r')) if at == 0 || !is_ident(chars[at - 1]) => {
            match literal_end(chars, at + 1) {
                end if end > at + 1 => end,
                _ => at,
            }
        }
        // An escaped character: its closing quote comes after the escape's first character.
        ('\'', Some('\\')) => (at + 3..chars.len())
            .find(|&i| chars[i] == '\'')
            .map_or(chars.len(), |i| i + 1),
        // A character, not a lifetime: one character between quotes.
        ('\'', Some(_)) if next(2) == Some('\'') => at + 3,
        _ => at,
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The end of a (nested) block comment starting at `at`.
fn block_comment_end(chars: &[char], at: usize) -> usize {
    let (mut depth, mut i) = (0, at);
    while i + 1 < chars.len() {
        match (chars[i], chars[i + 1]) {
            ('/', '*') => (depth, i) = (depth + 1, i + 2),
            ('*', '/') => {
                (depth, i) = (depth - 1, i + 2);
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    chars.len()
}

/// The end of a string whose text starts at `from`, closed by `"` and `hashes` hashes (a raw
/// string when `hashes` > 0 or when it began with `r`; escapes only matter in plain ones,
/// where a raw string's `\` is never followed by its closing quote anyway).
fn string_end(chars: &[char], from: usize, hashes: usize) -> usize {
    let mut i = from;
    while i < chars.len() {
        match chars[i] {
            '\\' if hashes == 0 => i += 2,
            '"' if chars[i + 1..]
                .iter()
                .take(hashes)
                .filter(|&&c| c == '#')
                .count()
                == hashes =>
            {
                return i + 1 + hashes;
            }
            _ => i += 1,
        }
    }
    chars.len()
}

/// `code` (see [`code_only`]) with the items under `#[cfg(test)]` blanked; the files of the
/// test modules it declares (`#[cfg(test)] mod name;`) go to `test_files`, relative to `dir`.
fn without_tests(code: &str, dir: &Path, test_files: &mut BTreeSet<PathBuf>) -> String {
    const ATTRIBUTE: &str = "#[cfg(test)]";
    let mut out = code.to_string();
    let mut from = 0;
    while let Some(found) = out[from..].find(ATTRIBUTE) {
        let start = from + found;
        let item = start + ATTRIBUTE.len();
        let end = item_end(&out, item);
        let declared = out[item..end].split_whitespace().collect::<Vec<_>>();
        if let [.., "mod", name] = declared.as_slice() {
            let name = name.trim_end_matches(';');
            test_files.insert(dir.join(format!("{name}.rs")));
            test_files.insert(dir.join(name).join("mod.rs"));
        }
        let blanked: String = out[start..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(start..end, &blanked);
        from = end;
    }
    out
}

/// Where the item starting at `from` ends: at its `;` (before any brace: `use`, `mod name;`)
/// or at the brace that closes its first one.
fn item_end(code: &str, from: usize) -> usize {
    let mut depth = 0usize;
    for (offset, c) in code[from..].char_indices() {
        match c {
            ';' if depth == 0 => return from + offset + 1,
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return from + offset + 1;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// Whether `file` (under `src/`) is test code by its name: a `tests.rs` or under a `tests/`.
fn named_as_tests(file: &Path) -> bool {
    file.file_name().is_some_and(|name| name == "tests.rs")
        || file.components().any(|part| part.as_os_str() == "tests")
}

/// The library's production sources under `src`, as (file relative to `src`, its code with
/// comments, literals and `#[cfg(test)]` items blanked), sorted: test files (`tests.rs`,
/// `tests/`, and the files of `#[cfg(test)] mod name;`) and `main.rs`, the binary outside the
/// library (it reaches it as `kiln::`), are left out.
pub(super) fn production_sources(src: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut test_files = BTreeSet::new();
    let mut sources = Vec::new();
    for path in files {
        let file = path.strip_prefix(src).expect("under src/").to_path_buf();
        if file == Path::new("main.rs") || named_as_tests(&file) || test_files.contains(&path) {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("a readable source file");
        let dir = path.parent().expect("a file's directory");
        // `foo.rs` declares its modules in `foo/`, `mod.rs` and `lib.rs` in their own directory.
        let dir = match path.file_stem().and_then(|s| s.to_str()) {
            Some("mod" | "lib") => dir.to_path_buf(),
            Some(stem) => dir.join(stem),
            None => dir.to_path_buf(),
        };
        sources.push((
            file,
            without_tests(&code_only(&source), &dir, &mut test_files),
        ));
    }
    sources
}
