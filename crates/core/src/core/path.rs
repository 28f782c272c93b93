//! Paths compared as written: made absolute and normal without touching the file system, so that
//! what a client names is checked as the kernel will walk it from the same text, and links (the
//! operator's) are never resolved into paths that may not exist here (a modelcar's
//! `/proc/<pid>/root/...`).

use std::path::{Component, Path, PathBuf};

/// `path` made absolute (from the working directory) with `.` and `..` folded lexically, as
/// C++'s `std::filesystem::absolute(path.lexically_normal())`: links are not followed, and `..`
/// at the root stays at the root.
pub fn absolute_lexical(path: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut normal = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::Normal(part) => normal.push(part),
            Component::ParentDir => {
                normal.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    normal
}

/// Whether `path` is `root` or below it, both taken lexically ([`absolute_lexical`]).
pub fn within(path: &Path, root: &Path) -> bool {
    absolute_lexical(path).starts_with(absolute_lexical(root))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_folded_as_written() {
        for (path, normal) in [
            ("/a/b/../c", "/a/c"),
            ("/a/./b/", "/a/b"),
            ("/../../etc", "/etc"),
            ("/a/b/../../..", "/"),
            ("//a//b", "/a/b"),
        ] {
            assert_eq!(
                absolute_lexical(Path::new(path)),
                Path::new(normal),
                "{path}"
            );
        }
        let here = std::env::current_dir().unwrap();
        assert_eq!(absolute_lexical(Path::new("x/../y")), here.join("y"));
        assert!(within(Path::new("/r/m/../env"), Path::new("/r")));
        assert!(within(Path::new("/r"), Path::new("/r/")));
        assert!(!within(Path::new("/r/m/../../env"), Path::new("/r")));
        assert!(!within(Path::new("/rx/env"), Path::new("/r")));
        assert!(within(Path::new("/anything"), Path::new("/")));
    }
}
