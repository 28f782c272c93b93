//! The server log: Triton's settings (`--log-info`, `--log-warning`, `--log-error`,
//! `--log-verbose`, `--log-format`, `--log-file`), its line formats, and their update at run time
//! through the `logging` extension (`/v2/logging`, the `LogSettings` RPC).
//!
//! The settings are process-wide, as the subscriber is: they live in atomics that the filter reads
//! for every event, and an update rebuilds tracing's interest cache so that newly enabled levels
//! reach callsites that had been skipped. The severity switches map onto tracing's levels (ERROR,
//! WARN, INFO); verbose level 1 adds kiln's DEBUG events and ONNX Runtime's INFO, level 2 kiln's
//! TRACE and every other crate's DEBUG, level 3 everything. `RUST_LOG`, when set, chooses the
//! per-target levels instead of the verbose level; the three severity switches still apply.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How each log line starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// glog's layout, as Triton writes it: `I1130 12:05:12.123456 <pid> <file>:<line>] ...` (UTC).
    Default,
    /// `2026-11-30T12:05:12Z I <pid> <file>:<line>] ...` (UTC).
    Iso8601,
}

impl LogFormat {
    /// Triton's names: `default` and `ISO8601`.
    pub fn parse(name: &str) -> Option<LogFormat> {
        match name {
            "default" => Some(LogFormat::Default),
            "ISO8601" => Some(LogFormat::Iso8601),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Default => "default",
            LogFormat::Iso8601 => "ISO8601",
        }
    }
}

/// The log settings as the `logging` extension reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// Where the log goes; empty: standard error.
    pub file: String,
    pub info: bool,
    pub warning: bool,
    pub error: bool,
    pub verbose_level: u32,
    pub format: LogFormat,
}

/// The settings a client may change at run time; `None` keeps the current value. The log file
/// is fixed at start-up, as in Triton.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogUpdate {
    pub info: Option<bool>,
    pub warning: Option<bool>,
    pub error: Option<bool>,
    pub verbose_level: Option<u32>,
    pub format: Option<LogFormat>,
}

/// Triton's answer when a client names `log_file` in an update.
pub const FILE_NOT_UPDATABLE: &str =
    "log file location can not be updated through network protocol";

struct Control {
    info: AtomicBool,
    warning: AtomicBool,
    error: AtomicBool,
    verbose_level: AtomicU32,
    /// 0: default, 1: ISO8601.
    format: AtomicU8,
    file: OnceLock<String>,
}

static CONTROL: Control = Control {
    info: AtomicBool::new(true),
    warning: AtomicBool::new(true),
    error: AtomicBool::new(true),
    verbose_level: AtomicU32::new(0),
    format: AtomicU8::new(0),
    file: OnceLock::new(),
};

/// The current settings.
pub fn settings() -> LogSettings {
    LogSettings {
        file: CONTROL.file.get().cloned().unwrap_or_default(),
        info: CONTROL.info.load(Ordering::Relaxed),
        warning: CONTROL.warning.load(Ordering::Relaxed),
        error: CONTROL.error.load(Ordering::Relaxed),
        verbose_level: CONTROL.verbose_level.load(Ordering::Relaxed),
        format: current_format(),
    }
}

/// Applies `update` and returns the settings now in force.
pub fn update(update: &LogUpdate) -> LogSettings {
    let store = |flag: &AtomicBool, value: Option<bool>| {
        if let Some(value) = value {
            flag.store(value, Ordering::Relaxed);
        }
    };
    store(&CONTROL.info, update.info);
    store(&CONTROL.warning, update.warning);
    store(&CONTROL.error, update.error);
    if let Some(level) = update.verbose_level {
        CONTROL.verbose_level.store(level, Ordering::Relaxed);
    }
    if let Some(format) = update.format {
        CONTROL
            .format
            .store(u8::from(format == LogFormat::Iso8601), Ordering::Relaxed);
    }
    // Callsites that were skipped as disabled must be asked again, and the global maximum level
    // recomputed from the filter's new hint.
    tracing::callsite::rebuild_interest_cache();
    settings()
}

fn current_format() -> LogFormat {
    if CONTROL.format.load(Ordering::Relaxed) == 1 {
        LogFormat::Iso8601
    } else {
        LogFormat::Default
    }
}

/// Installs the process's subscriber with `initial` settings, writing to `initial.file` (appended
/// to) or to standard error.
///
/// # Errors
/// When the log file cannot be opened.
pub fn init(initial: &LogSettings) -> std::io::Result<()> {
    update(&LogUpdate {
        info: Some(initial.info),
        warning: Some(initial.warning),
        error: Some(initial.error),
        verbose_level: Some(initial.verbose_level),
        format: Some(initial.format),
    });
    let _ = CONTROL.file.set(initial.file.clone());
    let filter = SettingsFilter {
        env: EnvFilter::try_from_default_env().ok(),
    };
    let writer = if initial.file.is_empty() {
        tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr)
    } else {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&initial.file)?;
        tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::sync::Mutex::new(file))
    };
    let color = initial.file.is_empty() && std::io::stderr().is_terminal();
    let layer = tracing_subscriber::fmt::layer()
        .event_format(TritonFormat { color })
        .with_writer(writer)
        .with_filter(filter);
    tracing_subscriber::registry().with(layer).init();
    Ok(())
}

/// Which events pass: the severity switches always; the verbose level (or `RUST_LOG`) for the
/// rest.
struct SettingsFilter {
    env: Option<EnvFilter>,
}

/// kiln's own events (the `kiln` crate and its layers' `kiln_<layer>` crates), whose DEBUG
/// output verbose level 1 shows.
fn is_kiln(target: &str) -> bool {
    let name = target.split("::").next().unwrap_or(target);
    name == "kiln" || name.starts_with("kiln_")
}

/// ONNX Runtime's own messages (forwarded by `ort`) and ort's.
fn is_onnx_runtime(target: &str) -> bool {
    target == "ort" || target.starts_with("ort::")
}

/// Whether the settings let an event of `level` from `target` through, before `RUST_LOG`.
fn passes(level: Level, target: &str, verbose: u32, env_decides: bool) -> bool {
    let severity = match level {
        Level::ERROR => return CONTROL.error.load(Ordering::Relaxed),
        Level::WARN => return CONTROL.warning.load(Ordering::Relaxed),
        Level::INFO => {
            if !CONTROL.info.load(Ordering::Relaxed) {
                return false;
            }
            0
        }
        Level::DEBUG => 1,
        _ => 2,
    };
    if env_decides {
        return true;
    }
    // How much verbosity the event needs: kiln's own DEBUG at 1, ONNX Runtime's INFO at 1,
    // everything one step later than kiln.
    let needed = if is_kiln(target) {
        severity
    } else if is_onnx_runtime(target) {
        severity + 1
    } else if severity == 0 {
        0
    } else {
        severity + 1
    };
    verbose >= needed
}

fn max_level(verbose: u32) -> LevelFilter {
    if verbose >= 2 {
        LevelFilter::TRACE
    } else if verbose >= 1 {
        LevelFilter::DEBUG
    } else if CONTROL.info.load(Ordering::Relaxed) {
        LevelFilter::INFO
    } else if CONTROL.warning.load(Ordering::Relaxed) {
        LevelFilter::WARN
    } else if CONTROL.error.load(Ordering::Relaxed) {
        LevelFilter::ERROR
    } else {
        LevelFilter::OFF
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Filter<S> for SettingsFilter {
    fn enabled(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        let verbose = CONTROL.verbose_level.load(Ordering::Relaxed);
        passes(*meta.level(), meta.target(), verbose, self.env.is_some())
            && self
                .env
                .as_ref()
                .is_none_or(|env| Filter::<S>::enabled(env, meta, cx))
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        // Settings change at run time: ask again for every event, unless RUST_LOG rules it out.
        match &self.env {
            Some(env) if Filter::<S>::callsite_enabled(env, meta).is_never() => {
                tracing::subscriber::Interest::never()
            }
            _ => tracing::subscriber::Interest::sometimes(),
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        match &self.env {
            Some(env) => Filter::<S>::max_level_hint(env),
            None => Some(max_level(CONTROL.verbose_level.load(Ordering::Relaxed))),
        }
    }

    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        cx: Context<'_, S>,
    ) {
        if let Some(env) = &self.env {
            Filter::<S>::on_new_span(env, attrs, id, cx);
        }
    }

    fn on_enter(&self, id: &tracing::span::Id, cx: Context<'_, S>) {
        if let Some(env) = &self.env {
            Filter::<S>::on_enter(env, id, cx);
        }
    }

    fn on_exit(&self, id: &tracing::span::Id, cx: Context<'_, S>) {
        if let Some(env) = &self.env {
            Filter::<S>::on_exit(env, id, cx);
        }
    }

    fn on_close(&self, id: tracing::span::Id, cx: Context<'_, S>) {
        if let Some(env) = &self.env {
            Filter::<S>::on_close(env, id, cx);
        }
    }
}

/// Triton's line layout, in either format; the message, then any other fields as `key=value`.
struct TritonFormat {
    /// Colour the severity letter (standard error on a terminal).
    color: bool,
}

impl<S, N> FormatEvent<S, N> for TritonFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        let letter = match *meta.level() {
            Level::ERROR => 'E',
            Level::WARN => 'W',
            // Triton writes its verbose messages with an I as well.
            _ => 'I',
        };
        let severity = match (self.color, letter) {
            (true, 'E') => "\x1b[31mE\x1b[0m".to_string(),
            (true, 'W') => "\x1b[33mW\x1b[0m".to_string(),
            _ => letter.to_string(),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let line = prefix(
            current_format(),
            &severity,
            now.as_secs(),
            now.subsec_micros(),
            std::process::id(),
            &location(meta),
        );
        writer.write_str(&line)?;
        let mut fields = Fields::default();
        event.record(&mut fields);
        writer.write_str(&fields.message)?;
        writer.write_str(&fields.rest)?;
        writer.write_char('\n')
    }
}

/// `file:line` for kiln's events; the module path for other crates', whose file paths point
/// into the build machine's cargo registry.
fn location(meta: &Metadata<'_>) -> String {
    match (meta.file(), meta.line()) {
        (Some(file), Some(line)) if !Path::new(file).is_absolute() => format!("{file}:{line}"),
        _ => meta.module_path().unwrap_or(meta.target()).to_string(),
    }
}

/// Everything before the message.
fn prefix(
    format: LogFormat,
    severity: &str,
    unix_secs: u64,
    micros: u32,
    pid: u32,
    location: &str,
) -> String {
    let (year, month, day) = civil_date(unix_secs / 86_400);
    let of_day = unix_secs % 86_400;
    let (hour, minute, second) = (of_day / 3600, of_day / 60 % 60, of_day % 60);
    match format {
        LogFormat::Default => format!(
            "{severity}{month:02}{day:02} {hour:02}:{minute:02}:{second:02}.{micros:06} {pid} \
             {location}] "
        ),
        LogFormat::Iso8601 => format!(
            "{year}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z {severity} {pid} \
             {location}] "
        ),
    }
}

/// The proleptic Gregorian (year, month, day) of a count of days since 1970-01-01.
fn civil_date(days: u64) -> (u64, u64, u64) {
    // Days since 0000-03-01, split into 400-year eras of 146,097 days.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153; // 0 = March
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        let out = if field.name() == "message" {
            &mut self.message
        } else {
            let _ = write!(self.rest, " {}=", field.name());
            &mut self.rest
        };
        let from = out.len();
        out.push_str(value);
        escape_controls(out, from);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let out = if field.name() == "message" {
            &mut self.message
        } else {
            let _ = write!(self.rest, " {}=", field.name());
            &mut self.rest
        };
        let from = out.len();
        let _ = write!(out, "{value:?}");
        escape_controls(out, from);
    }
}

/// `text[from..]` with every control character but a tab escaped as Rust writes it (`\n`,
/// `\u{1b}`): whatever a message quotes (a model name, a client's request id, a model's error)
/// stays on its own line and cannot forge another or send a terminal escape sequence. Nothing is
/// copied when there is none.
fn escape_controls(text: &mut String, from: usize) {
    let controls = |c: char| c.is_control() && c != '\t';
    if !text[from..].contains(controls) {
        return;
    }
    let tail = text.split_off(from);
    for c in tail.chars() {
        if controls(c) {
            let _ = write!(text, "{}", c.escape_debug());
        } else {
            text.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        let mut text = String::from("kept\n: ");
        escape_controls(&mut text, 7);
        assert_eq!(text, "kept\n: ");
        let mut text = String::from("name ");
        text.push_str("a\nE1207 00:00:00.000000 1 forged.cc:1] x\x1b[31m\r\tü\u{9b}");
        escape_controls(&mut text, 5);
        assert_eq!(
            text,
            "name a\\nE1207 00:00:00.000000 1 forged.cc:1] x\\u{1b}[31m\\r\tü\\u{9b}"
        );
    }

    #[test]
    fn dates_follow_the_gregorian_calendar() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(59), (1970, 3, 1));
        // 2000 is a leap year, 2100 is not.
        assert_eq!(civil_date(11_016), (2000, 2, 29));
        assert_eq!(civil_date(11_017), (2000, 3, 1));
        assert_eq!(civil_date(47_540), (2100, 2, 28));
        assert_eq!(civil_date(47_541), (2100, 3, 1));
        assert_eq!(civil_date(20_787), (2026, 11, 30));
        assert_eq!(civil_date(20_818), (2026, 12, 31));
        assert_eq!(civil_date(20_819), (2027, 1, 1));
    }

    #[test]
    fn line_prefixes_match_tritons_two_formats() {
        // 2026-11-30 12:05:12 UTC.
        let secs = 20_787 * 86_400 + 12 * 3600 + 5 * 60 + 12;
        assert_eq!(
            prefix(
                LogFormat::Default,
                "I",
                secs,
                42,
                7,
                "crates/server/src/server.rs:221"
            ),
            "I1130 12:05:12.000042 7 crates/server/src/server.rs:221] "
        );
        assert_eq!(
            prefix(LogFormat::Iso8601, "W", secs, 42, 7, "h2::proto"),
            "2026-11-30T12:05:12Z W 7 h2::proto] "
        );
    }

    #[test]
    fn format_names_are_tritons() {
        assert_eq!(LogFormat::parse("default"), Some(LogFormat::Default));
        assert_eq!(LogFormat::parse("ISO8601"), Some(LogFormat::Iso8601));
        assert_eq!(LogFormat::parse("iso8601"), None);
        for format in [LogFormat::Default, LogFormat::Iso8601] {
            assert_eq!(LogFormat::parse(format.name()), Some(format));
        }
    }

    /// One test changes the process-wide settings and checks every consequence, so that no other
    /// test sees them half-changed.
    #[test]
    fn switches_and_verbose_levels_decide_what_passes() {
        let initial = settings();
        assert_eq!(initial.verbose_level, 0);
        assert!(passes(Level::INFO, "kiln::server", 0, false));
        // The layers' crates are kiln's too; a crate merely named alike is not.
        assert!(!passes(Level::DEBUG, "kiln_engine::engine", 0, false));
        assert!(passes(Level::DEBUG, "kiln_engine::engine", 1, false));
        assert!(!passes(Level::DEBUG, "kilnish::x", 1, false));
        assert!(passes(Level::INFO, "h2::codec", 0, false));
        assert!(!passes(Level::INFO, "ort::session", 0, false));
        assert!(!passes(Level::DEBUG, "kiln::scheduler", 0, false));
        assert!(passes(Level::DEBUG, "kiln::scheduler", 1, false));
        assert!(passes(Level::INFO, "ort::session", 1, false));
        assert!(!passes(Level::DEBUG, "h2::codec", 1, false));
        assert!(!passes(Level::TRACE, "kiln::scheduler", 1, false));
        assert!(passes(Level::TRACE, "kiln::scheduler", 2, false));
        assert!(passes(Level::DEBUG, "h2::codec", 2, false));
        assert!(!passes(Level::TRACE, "h2::codec", 2, false));
        assert!(passes(Level::TRACE, "h2::codec", 3, false));
        // RUST_LOG decides the rest; the switches still hold.
        assert!(passes(Level::TRACE, "h2::codec", 0, true));
        assert_eq!(max_level(0), LevelFilter::INFO);

        let after = update(&LogUpdate {
            info: Some(false),
            error: Some(false),
            verbose_level: Some(1),
            format: Some(LogFormat::Iso8601),
            ..LogUpdate::default()
        });
        assert_eq!(
            after,
            LogSettings {
                info: false,
                error: false,
                verbose_level: 1,
                format: LogFormat::Iso8601,
                ..initial.clone()
            }
        );
        assert!(!passes(Level::INFO, "kiln::server", 1, false));
        assert!(!passes(Level::ERROR, "kiln::server", 1, true));
        assert!(passes(Level::WARN, "kiln::server", 1, false));
        // Verbose messages do not depend on log_info, as in Triton.
        assert!(passes(Level::DEBUG, "kiln::server", 1, false));
        assert_eq!(max_level(1), LevelFilter::DEBUG);
        assert_eq!(max_level(0), LevelFilter::WARN);

        // An empty update changes nothing.
        assert_eq!(update(&LogUpdate::default()), after);
        let restored = update(&LogUpdate {
            info: Some(true),
            warning: Some(true),
            error: Some(true),
            verbose_level: Some(0),
            format: Some(LogFormat::Default),
        });
        assert_eq!(restored, initial);
    }
}
