//! Trace setting values, the changes a client may ask for, and their parsing from Triton's
//! strings: the `--trace-config` flag, the REST body and the `TraceSetting` RPC all come here.

use crate::core::Error;
use crate::invalid_arg;

/// What a trace records: bit 1 timestamps, bit 2 tensors (Triton's `TRITONSERVER_TRACE_LEVEL_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Level(u8);

impl Level {
    pub const OFF: Level = Level(0);
    pub const TIMESTAMPS: Level = Level(1);
    pub const TENSORS: Level = Level(2);

    pub fn is_off(self) -> bool {
        self.0 == 0
    }

    pub fn contains(self, other: Level) -> bool {
        self.0 & other.0 == other.0 && !other.is_off()
    }

    /// Triton's names for the level: `["OFF"]`, or any of `TIMESTAMPS`, `TENSORS`.
    pub fn names(self) -> Vec<&'static str> {
        if self.is_off() {
            return vec!["OFF"];
        }
        [
            (Level::TIMESTAMPS, "TIMESTAMPS"),
            (Level::TENSORS, "TENSORS"),
        ]
        .into_iter()
        .filter(|(level, _)| self.contains(*level))
        .map(|(_, name)| name)
        .collect()
    }

    /// A level from its names: `OFF` alone, or `TIMESTAMPS` and/or `TENSORS`.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for `OFF` beside another name (Triton's text) or an unknown name.
    pub fn parse<S: AsRef<str>>(names: &[S]) -> Result<Level, Error> {
        let mut level = Level::OFF;
        for name in names {
            match name.as_ref() {
                "OFF" if names.len() == 1 => {}
                "OFF" => {
                    return Err(invalid_arg!(
                        "Expect only one trace level 'OFF' is specified"
                    ))
                }
                "TIMESTAMPS" => level.0 |= Level::TIMESTAMPS.0,
                "TENSORS" => level.0 |= Level::TENSORS.0,
                other => {
                    return Err(invalid_arg!(
                        "unknown trace level '{other}': expected OFF, TIMESTAMPS or TENSORS"
                    ))
                }
            }
        }
        Ok(level)
    }
}

/// Where traces go: Triton's JSON file, or OpenTelemetry spans to a collector. Server-wide, set
/// at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceMode {
    #[default]
    Triton,
    OpenTelemetry,
}

impl TraceMode {
    /// Triton's names.
    pub fn name(self) -> &'static str {
        match self {
            TraceMode::Triton => "triton",
            TraceMode::OpenTelemetry => "opentelemetry",
        }
    }
}

/// One complete set of trace settings, as reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceSettings {
    pub level: Level,
    /// One request in `rate` is traced.
    pub rate: u32,
    /// Traces still to take; -1: no limit.
    pub count: i32,
    /// Traces per numbered file (`<file>.<n>`); 0: everything goes to `file` when the settings
    /// change or the server stops.
    pub log_frequency: u32,
    pub file: String,
    /// Numbered files before they wrap to `<file>.0` (kiln's `triton,file-limit=N`, start-up
    /// only and not reported); 0: no limit, as in Triton.
    pub file_limit: u32,
    pub mode: TraceMode,
}

impl Default for TraceSettings {
    /// `tritonserver`'s defaults: off, one request in 1,000, no limit, one file at the end.
    fn default() -> TraceSettings {
        TraceSettings {
            level: Level::OFF,
            rate: 1000,
            count: -1,
            log_frequency: 0,
            file: String::new(),
            file_limit: super::file::DEFAULT_FILE_LIMIT,
            mode: TraceMode::Triton,
        }
    }
}

impl TraceSettings {
    /// Why these settings cannot trace, if they cannot (Triton's reasons).
    pub fn invalid_reason(&self) -> Option<&'static str> {
        let triton = self.mode == TraceMode::Triton;
        if self.level.is_off() {
            Some("tracing is disabled")
        } else if self.rate == 0 && triton {
            // In OpenTelemetry mode rate 0 traces only requests that carry a trace context.
            Some("sample rate must be non-zero")
        } else if self.file.is_empty() && triton {
            Some("trace file name is not given")
        } else {
            None
        }
    }

    /// The settings as Triton reports them: each value a list of strings, in Triton's order.
    pub fn report(&self) -> Vec<(&'static str, Vec<String>)> {
        vec![
            (
                "trace_level",
                self.level.names().into_iter().map(String::from).collect(),
            ),
            ("trace_rate", vec![self.rate.to_string()]),
            ("trace_count", vec![self.count.to_string()]),
            ("log_frequency", vec![self.log_frequency.to_string()]),
            ("trace_file", vec![self.file.clone()]),
            ("trace_mode", vec![self.mode.name().to_string()]),
        ]
    }
}

/// What `--trace-config` sets: the start-up settings and, in OpenTelemetry mode, where spans go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceConfig {
    pub settings: TraceSettings,
    pub otel: Option<super::otel::OtelConfig>,
}

/// What an update does to one setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Change<T> {
    #[default]
    Keep,
    /// Back to the value it mirrors (the global setting's, or the start-up one).
    Clear,
    Set(T),
}

/// The changes one request asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceUpdate {
    pub level: Change<Level>,
    pub rate: Change<u32>,
    pub count: Change<i32>,
    pub log_frequency: Change<u32>,
}

impl TraceUpdate {
    /// Reads one setting from its string values; `None` clears it (REST `null`, an empty list
    /// over gRPC).
    ///
    /// # Errors
    /// UNSUPPORTED for `trace_file`, which only the command line sets; INVALID_ARGUMENT for a
    /// value that does not parse, for more than one value where one is expected, and for an
    /// unknown setting.
    pub fn set(&mut self, key: &str, values: Option<&[String]>) -> Result<(), Error> {
        if key == "trace_file" {
            return Err(Error::Unsupported(
                "trace file location can not be updated through network protocol".into(),
            ));
        }
        let Some(values) = values else {
            match key {
                "trace_level" => self.level = Change::Clear,
                "trace_rate" => self.rate = Change::Clear,
                "trace_count" => self.count = Change::Clear,
                "log_frequency" => self.log_frequency = Change::Clear,
                _ => return Err(unknown_setting(key)),
            }
            return Ok(());
        };
        if key == "trace_level" {
            self.level = Change::Set(Level::parse(values)?);
            return Ok(());
        }
        let [value] = values else {
            return Err(invalid_arg!("expect only 1 value for '{key}'"));
        };
        match key {
            "trace_rate" => self.rate = Change::Set(parse_u32(key, value)?),
            "trace_count" => self.count = Change::Set(parse_count(value)?),
            "log_frequency" => self.log_frequency = Change::Set(parse_u32(key, value)?),
            _ => return Err(unknown_setting(key)),
        }
        Ok(())
    }
}

fn unknown_setting(key: &str) -> Error {
    invalid_arg!(
        "unknown trace setting '{key}': expected trace_level, trace_rate, trace_count or \
         log_frequency"
    )
}

fn parse_u32(key: &str, value: &str) -> Result<u32, Error> {
    let number: i128 = value
        .trim()
        .parse()
        .map_err(|_| invalid_arg!("Unable to parse '{key}', got: {value}"))?;
    u32::try_from(number).map_err(|_| {
        invalid_arg!(
            "Unable to parse '{key}', value is out of range [ 0, {} ], got: {value}",
            u32::MAX
        )
    })
}

fn parse_count(value: &str) -> Result<i32, Error> {
    let number: i128 = value
        .trim()
        .parse()
        .map_err(|_| invalid_arg!("Unable to parse 'trace_count', got: {value}"))?;
    if number < -1 {
        return Err(invalid_arg!(
            "Unable to parse 'trace_count'. Expecting value >= -1, got: {value}"
        ));
    }
    i32::try_from(number).map_err(|_| {
        invalid_arg!(
            "Unable to parse 'trace_count', value is out of range [ -1, {} ], got: {value}",
            i32::MAX
        )
    })
}

/// The start-up settings from `--trace-config` values, in `tritonserver`'s form:
/// `level=OFF|TIMESTAMPS|TENSORS` (repeatable), `rate=N`, `count=N`, `mode=triton`, and the
/// Triton mode's `triton,file=PATH` and `triton,log-frequency=N`; and kiln's
/// `triton,file-limit=N`.
///
/// # Errors
/// A message naming the value that does not parse.
pub fn from_flags(values: &[String]) -> Result<TraceConfig, String> {
    let mut settings = TraceSettings::default();
    let mut otel = super::otel::OtelConfig::default();
    let mut levels: Vec<String> = Vec::new();
    for value in values {
        let (mode, setting) = match value.split_once(',') {
            Some((mode, setting)) => (Some(mode), setting),
            None => (None, value.as_str()),
        };
        if mode.is_some_and(|mode| mode != "triton" && mode != "opentelemetry") {
            return Err(format!(
                "--trace-config {value}: the trace modes are 'triton' and 'opentelemetry'"
            ));
        }
        let (key, text) = setting
            .split_once('=')
            .ok_or_else(|| format!("--trace-config {value}: expected <setting>=<value>"))?;
        let bad = |e: Error| format!("--trace-config {value}: {}", e.message());
        match (mode, key) {
            (None, "level") => levels.push(text.to_string()),
            (None, "rate") => settings.rate = parse_u32("rate", text).map_err(bad)?,
            (None, "count") => settings.count = parse_count(text).map_err(bad)?,
            (None, "mode") => {
                settings.mode = match text {
                    "triton" => TraceMode::Triton,
                    "opentelemetry" => TraceMode::OpenTelemetry,
                    _ => {
                        return Err(format!(
                            "--trace-config {value}: the trace modes are 'triton' and \
                             'opentelemetry'"
                        ))
                    }
                }
            }
            (Some("triton"), "file") => settings.file = text.to_string(),
            (Some("triton"), "file-limit") => {
                settings.file_limit = parse_u32("file-limit", text).map_err(bad)?
            }
            (Some("triton"), "log-frequency") => {
                settings.log_frequency = parse_u32("log-frequency", text).map_err(bad)?
            }
            (Some("opentelemetry"), _) => otel
                .set(key, text)
                .map_err(|e| format!("--trace-config {value}: {e}"))?,
            _ => return Err(format!("--trace-config {value}: unknown setting '{key}'")),
        }
    }
    if !levels.is_empty() {
        // `level=OFF` with another level switches tracing off, as in Triton.
        settings.level = if levels.iter().any(|l| l == "OFF") {
            Level::OFF
        } else {
            Level::parse(&levels).map_err(|e| format!("--trace-config: {}", e.message()))?
        };
    }
    let triton = settings.mode == TraceMode::Triton;
    if !settings.level.is_off() && triton && settings.file.is_empty() {
        return Err("--trace-config: tracing needs a file (triton,file=<path>)".into());
    }
    Ok(TraceConfig {
        settings,
        otel: (!triton).then(|| {
            otel.with_environment(std::env::var("OTEL_RESOURCE_ATTRIBUTES").ok().as_deref())
        }),
    })
}
