//! Files and functions that fit in a head (issue 36): no production file over
//! [`MAX_FILE_LINES`] lines, no function over [`MAX_FN_LINES`] lines or with more than
//! [`MAX_PARAMS`] parameters. A test reads the production sources of every crate of the
//! workspace (`src/` and `crates/*/src/`, as [`super::scan`] reads them: test files and
//! `#[cfg(test)]` items left out) and fails on any over a limit, naming it. The ones over today ([`KNOWN_FILES`], [`KNOWN_FNS`]) are tolerated until
//! they shrink; one that fits must leave its list too, so that the lists only shrink.

use std::path::Path;

use super::scan::production_sources;

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 120;
const MAX_PARAMS: usize = 7;

/// Production files over [`MAX_FILE_LINES`] today (from the repository's root). Each is a debt.
const KNOWN_FILES: &[&str] = &[];

/// Functions over [`MAX_FN_LINES`] lines or [`MAX_PARAMS`] parameters today, as (file from the
/// repository's root, function name). Each is a debt.
const KNOWN_FNS: &[(&str, &str)] = &[];

/// A function's size where it is: `lines` from its `fn` to its closing brace.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Function {
    name: String,
    line: usize,
    lines: usize,
    params: usize,
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every function with a body in `code` (comments and literals blanked, see
/// `scan::code_only`): a `fn` keyword followed by a name, its parameter list and a body.
fn functions(code: &str) -> Vec<Function> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("fn ").map(|i| from + i) {
        from = at + 3;
        if at > 0 && is_ident(bytes[at - 1] as char) {
            continue;
        }
        let start = from + (code[from..].len() - code[from..].trim_start().len());
        let name: String = code[start..].chars().take_while(|&c| is_ident(c)).collect();
        let mut open = start + name.len();
        // Generics come before the parameters, and may hold parentheses (`F: Fn(u8)`).
        if bytes.get(open) == Some(&b'<') {
            open = matching(code, open, b'<', b'>') + 1;
        }
        if name.is_empty() || bytes.get(open) != Some(&b'(') {
            continue;
        }
        let close = matching(code, open, b'(', b')');
        let Some(body) = code[close..].find(['{', ';']).map(|i| close + i) else {
            break;
        };
        if bytes[body] == b';' {
            continue;
        }
        let end = matching(code, body, b'{', b'}');
        let line = code[..at].matches('\n').count() + 1;
        found.push(Function {
            name,
            line,
            lines: code[at..end].matches('\n').count() + 1,
            params: params(&code[open + 1..close]),
        });
    }
    found
}

/// The index of the byte that closes the bracket at `open` (the end when none does); the `>`
/// of an arrow (`->`) closes no generics.
fn matching(code: &str, open: usize, left: u8, right: u8) -> usize {
    let mut depth = 0usize;
    for (i, &b) in code.as_bytes()[open..].iter().enumerate() {
        if b == left {
            depth += 1;
        } else if b == right && !(b == b'>' && i > 0 && code.as_bytes()[open + i - 1] == b'-') {
            depth -= 1;
            if depth == 0 {
                return open + i;
            }
        }
    }
    code.len()
}

/// How many parameters a parameter list (between its parentheses) has: its commas outside
/// brackets and generics, plus one unless it is empty or ends with a comma; a tuple pattern
/// (`(a, b): (A, B)`) counts each of its names, as it would if it were written out.
fn params(list: &str) -> usize {
    split_top(list)
        .iter()
        .map(|param| {
            let param = param.trim();
            match param.strip_prefix('(') {
                Some(rest) => {
                    let close = matching(param, 0, b'(', b')');
                    let inner = &rest[..close.saturating_sub(1).min(rest.len())];
                    split_top(inner).len().max(1)
                }
                None => 1,
            }
        })
        .sum()
}

/// `list` split at its commas outside brackets and generics; no empty last piece.
fn split_top(list: &str) -> Vec<&str> {
    let (mut depth, mut prev, mut start) = (0i32, ' ', 0);
    let mut pieces = Vec::new();
    for (i, c) in list.char_indices() {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            // `->` in `impl Fn(u8) -> u8` closes nothing.
            '>' if prev == '-' => {}
            ')' | ']' | '}' | '>' => depth -= 1,
            ',' if depth == 0 => {
                pieces.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        prev = c;
    }
    if !list[start..].trim().is_empty() {
        pieces.push(&list[start..]);
    }
    pieces
}

#[test]
fn files_and_functions_fit_in_a_head() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![Path::new("src").to_path_buf()];
    let mut crates: Vec<_> = std::fs::read_dir(root.join("crates"))
        .expect("the workspace's crates/")
        .map(|entry| {
            Path::new("crates")
                .join(entry.expect("an entry").file_name())
                .join("src")
        })
        .collect();
    crates.sort();
    dirs.extend(crates);
    let sources: Vec<_> = dirs
        .iter()
        .flat_map(|dir| {
            production_sources(&root.join(dir))
                .into_iter()
                .map(move |(file, code)| (dir.join(file), code))
        })
        .collect();
    assert!(sources.len() > 50, "the scan read {} files", sources.len());
    let (mut over, mut files_over, mut fns_over) = (Vec::new(), Vec::new(), Vec::new());
    for (file, code) in &sources {
        let file = file.to_string_lossy().into_owned();
        let lines = code.lines().count();
        if lines > MAX_FILE_LINES {
            files_over.push(file.clone());
            if !KNOWN_FILES.contains(&file.as_str()) {
                over.push(format!("{file}: {lines} lines"));
            }
        }
        for f in functions(code) {
            if f.lines > MAX_FN_LINES || f.params > MAX_PARAMS {
                fns_over.push((file.clone(), f.name.clone()));
                if !KNOWN_FNS.contains(&(file.as_str(), f.name.as_str())) {
                    let (name, lines, params) = (&f.name, f.lines, f.params);
                    let at = format!("{file}:{}", f.line);
                    over.push(format!(
                        "{at}: fn {name}: {lines} lines, {params} parameters"
                    ));
                }
            }
        }
    }
    let gone: Vec<String> = KNOWN_FILES
        .iter()
        .filter(|file| !files_over.iter().any(|f| f == *file))
        .map(|file| format!("\"{file}\""))
        .chain(
            KNOWN_FNS
                .iter()
                .filter(|(file, name)| !fns_over.iter().any(|(f, n)| f == file && n == name))
                .map(|(file, name)| format!("(\"{file}\", \"{name}\")")),
        )
        .collect();
    assert!(
        over.is_empty() && gone.is_empty(),
        "files up to {MAX_FILE_LINES} lines, functions up to {MAX_FN_LINES} lines and \
         {MAX_PARAMS} parameters (see src/sizes.rs)\nover:\n{}\nknown ones that fit now (take \
         them out of KNOWN_FILES/KNOWN_FNS):\n{}",
        over.join("\n"),
        gone.join("\n"),
    );
}

#[test]
fn the_scan_measures_functions_by_their_braces_and_parameters() {
    let code = "impl A {\n    pub fn short(&self) -> impl Fn(u8) -> u8 { |x| x }\n\
                fn decl(a: u8, b: u8);\n}\nfn long<T: Into<u8>, F: Fn(u8)>(\n    a: T,\n    b: (u8, u8),\n\
                    c: HashMap<u8, u8>,\n) -> Result<(), E>\nwhere T: Copy\n{\n    if a { b }\n}\n";
    let found = functions(code);
    let sizes: Vec<(&str, usize, usize, usize)> = found
        .iter()
        .map(|f| (f.name.as_str(), f.line, f.lines, f.params))
        .collect();
    assert_eq!(sizes, [("short", 2, 1, 1), ("long", 5, 9, 3)]);
    // A tuple pattern counts each name it binds; a tuple type is one parameter.
    assert_eq!(params("(a, b): (u8, u8), c: u8"), 3);
    assert_eq!(params("x: (u8, u8), (y,): (u8,)"), 2);
    assert_eq!(params("&self, f: impl Fn(u8, u8) -> u8,"), 2);
    assert_eq!(params(""), 0);
}
