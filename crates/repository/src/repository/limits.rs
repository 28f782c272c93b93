//! Bounds on model files. A repository is input like any other: a truncated or hostile model, a
//! config declaring absurd sizes, or a directory with thousands of entries must fail its own
//! model's load with a clear reason, quickly and in little memory, while the server serves the
//! rest. Each bound below refuses values no real model needs, before anything is sized from
//! them. (Malformed ONNX files are ONNX Runtime's to refuse; it also keeps external data inside
//! the model's directory.)

use std::io::{Error, ErrorKind, Read};
use std::path::Path;

/// Largest `config.pbtxt` (and load API `config` override) read: configs are a few KiB, and the
/// text parser holds the whole file and its parsed form in memory.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Largest label file read: one label per line; a million classes of 16 bytes fit.
pub const MAX_LABEL_FILE_BYTES: u64 = 16 << 20;
/// Most labels (lines) a label file may hold: 2^20 classes. Each label is kept as its own string,
/// so a file of empty lines would otherwise cost some 50 bytes of memory per byte read.
pub const MAX_LABELS: usize = 1 << 20;
/// Largest `tokenizer.json` read: the tokenizers of large multilingual models are some 30 MiB,
/// and the whole file is parsed in memory.
pub const MAX_TOKENIZER_BYTES: u64 = 64 << 20;
/// Most entries (version directories and files) a model directory may hold. A model has a config,
/// perhaps label files, and a few versions; the listing is read on every load, so a directory
/// with thousands of entries is refused as soon as the listing passes this bound.
pub const MAX_MODEL_DIR_ENTRIES: usize = 1024;
/// Most ONNX Runtime sessions one model may start (selected versions × instances per version).
/// Each session is a thread holding its own copy of the weights; an `instance_group` count or a
/// version policy asking for more would exhaust memory and threads for every other model.
pub const MAX_SESSIONS_PER_MODEL: usize = 256;
/// Largest `max_batch_size`: 2^20 rows per batch, far beyond any real deployment (Triton's
/// examples use 8 to 1024).
pub const MAX_BATCH_SIZE: i32 = 1 << 20;
/// Most elements the fixed dims of one tensor may describe for one batch row: 2^32 (16 GiB of
/// FP32). With [`MAX_BATCH_SIZE`] and 8-byte elements a whole batch stays below 2^55 bytes, so no
/// size computed from a config can overflow.
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 32;
/// Most inputs, and most outputs, a model may declare: ten times a large decoder with a key and
/// a value cache tensor per layer. Matching tensors by name costs inputs × graph inputs.
pub const MAX_TENSORS: usize = 1024;

/// Reads a UTF-8 text file of at most `limit` bytes; a larger one fails with
/// [`ErrorKind::FileTooLarge`] after reading no more than `limit + 1` bytes (the length is checked
/// first, and again while reading, as a file can grow). Only regular files are read: opening a
/// FIFO would wait for a writer forever, and a device may never end.
///
/// # Errors
/// The I/O error; [`ErrorKind::InvalidInput`] for anything but a regular file.
pub fn read_text(path: &Path, limit: u64) -> std::io::Result<String> {
    let too_large = || {
        Error::new(
            ErrorKind::FileTooLarge,
            format!("the file is larger than the {limit} bytes kiln reads"),
        )
    };
    let metadata = std::fs::metadata(path)?;
    if !metadata.is_file() {
        return Err(Error::new(ErrorKind::InvalidInput, "not a regular file"));
    }
    if metadata.len() > limit {
        return Err(too_large());
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(limit + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(text)
}

/// Checks a tensor's config dims as Triton does (each at least 1, or -1 for variable) and that
/// the fixed ones multiply to at most [`MAX_TENSOR_ELEMENTS`]. `prefix` names the tensor and
/// `what` the list (`dims`, `reshape dims`) in the message.
///
/// # Errors
/// The reason, naming the tensor and its dims.
pub fn check_dims(prefix: &str, what: &str, dims: &[i64]) -> Result<(), String> {
    if dims.iter().any(|&d| d < 1 && d != -1) {
        return Err(format!(
            "{prefix}: {what} {dims:?}: each dimension must be an integer >= 1, or -1 to \
             indicate a variable-size dimension"
        ));
    }
    let elements = dims
        .iter()
        .filter(|&&d| d > 0)
        .try_fold(1u64, |product, &d| product.checked_mul(d as u64))
        .filter(|&n| n <= MAX_TENSOR_ELEMENTS);
    if elements.is_none() {
        return Err(format!(
            "{prefix}: {what} {dims:?} describe more than the {MAX_TENSOR_ELEMENTS} elements \
             kiln allows per tensor"
        ));
    }
    Ok(())
}

/// The reason a model directory with more than [`MAX_MODEL_DIR_ENTRIES`] entries is refused.
pub fn too_many_entries(name: &str) -> String {
    format!(
        "the directory of model '{name}' holds more than {MAX_MODEL_DIR_ENTRIES} entries \
         (version directories and files), more than kiln reads"
    )
}

/// Refuses a load that would start more than [`MAX_SESSIONS_PER_MODEL`] sessions.
///
/// # Errors
/// The reason, with the versions and instances asked for.
pub fn check_sessions(name: &str, versions: usize, instances: usize) -> Result<(), String> {
    let sessions = versions.saturating_mul(instances);
    if sessions > MAX_SESSIONS_PER_MODEL {
        return Err(format!(
            "model '{name}' would start {sessions} ONNX Runtime sessions ({versions} versions × \
             {instances} instances), more than the {MAX_SESSIONS_PER_MODEL} kiln allows per model"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_must_be_positive_or_variable() {
        assert!(check_dims("t", "dims", &[-1, 16]).is_ok());
        assert!(check_dims("t", "dims", &[]).is_ok());
        for dims in [&[0][..], &[-7], &[4, -2], &[i64::MIN]] {
            let err = check_dims("t", "dims", dims).unwrap_err();
            assert!(
                err.contains("each dimension must be an integer >= 1, or -1"),
                "{err}"
            );
        }
        assert_eq!(
            check_dims("model 'm', output 'b'", "reshape dims", &[-3]).unwrap_err(),
            "model 'm', output 'b': reshape dims [-3]: each dimension must be an integer >= 1, or \
             -1 to indicate a variable-size dimension"
        );
    }

    #[test]
    fn element_counts_are_bounded_without_overflow() {
        assert!(check_dims("t", "dims", &[-1, 1 << 32]).is_ok());
        assert!(check_dims("t", "dims", &[1 << 16, 1 << 16]).is_ok());
        assert_eq!(
            check_dims("t", "dims", &[1 << 16, (1 << 16) + 1]).unwrap_err(),
            "t: dims [65536, 65537] describe more than the 4294967296 elements kiln allows per \
             tensor"
        );
        assert_eq!(
            check_dims("t", "dims", &[1 << 40, 1 << 40]).unwrap_err(),
            "t: dims [1099511627776, 1099511627776] describe more than the 4294967296 elements \
             kiln allows per tensor"
        );
        // The product would overflow 64 bits: refused, not wrapped.
        assert_eq!(
            check_dims("t", "dims", &[i64::MAX, i64::MAX, 4]).unwrap_err(),
            "t: dims [9223372036854775807, 9223372036854775807, 4] describe more than the \
             4294967296 elements kiln allows per tensor"
        );
    }

    #[test]
    fn session_count_is_bounded() {
        assert!(check_sessions("m", 1, MAX_SESSIONS_PER_MODEL).is_ok());
        assert!(check_sessions("m", 128, 2).is_ok());
        assert_eq!(
            check_sessions("m", 5000, 2).unwrap_err(),
            "model 'm' would start 10000 ONNX Runtime sessions (5000 versions × 2 instances), \
             more than the 256 kiln allows per model"
        );
        assert_eq!(
            check_sessions("m", usize::MAX, 2).unwrap_err(),
            format!(
                "model 'm' would start {max} ONNX Runtime sessions ({max} versions × 2 \
                 instances), more than the 256 kiln allows per model",
                max = usize::MAX
            )
        );
    }

    #[test]
    fn text_reads_are_capped() {
        let path = std::env::temp_dir().join(format!("kiln-read-text-{}", std::process::id()));
        std::fs::write(&path, "x".repeat(10)).unwrap();
        assert_eq!(read_text(&path, 10).unwrap().len(), 10);
        let refused = read_text(&path, 9).unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::FileTooLarge);
        assert_eq!(
            refused.to_string(),
            "the file is larger than the 9 bytes kiln reads"
        );
        // A sparse 100 MiB file is refused from its length, without reading it.
        std::fs::File::create(&path)
            .unwrap()
            .set_len(100 << 20)
            .unwrap();
        assert_eq!(
            read_text(&path, MAX_CONFIG_BYTES).unwrap_err().kind(),
            ErrorKind::FileTooLarge
        );
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            read_text(&path, 10).unwrap_err().kind(),
            ErrorKind::NotFound
        );
        // Neither a FIFO (opening it would block) nor a device is read.
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        assert_eq!(
            read_text(&path, 10).unwrap_err().to_string(),
            "not a regular file"
        );
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            read_text(Path::new("/dev/zero"), 10).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }
}
