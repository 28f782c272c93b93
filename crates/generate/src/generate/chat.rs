//! Chat templates: how a model wants a conversation laid out as one prompt, a Jinja template as
//! Hugging Face ships it (`tokenizer_config.json`'s `chat_template`, a string or a list of named
//! templates of which `default` is taken; or a `chat_template.jinja` file beside it), rendered
//! with `messages`, `add_generation_prompt` and the tokenizer's `bos_token` / `eos_token`, as
//! `transformers`' `apply_chat_template` renders it. Python's string methods (`strip`,
//! `startswith`, ...) work as templates expect, `raise_exception(message)` refuses a
//! conversation with the template's own message, and `strftime_now(format)` gives today's date
//! (UTC; transformers gives the server's local time).
//!
//! A template is a model file, so it is bounded: its size, and the work one rendering may do
//! (a template that loops without end fails that request, not the server).

use minijinja::value::Value;
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;
use std::path::Path;

/// Largest `tokenizer_config.json` read (it may list many added tokens).
const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// Largest template.
const MAX_TEMPLATE_BYTES: usize = 1 << 20;

/// Instructions one rendering may run.
const FUEL: u64 = 10_000_000;

/// Largest prompt one rendering may produce.
const MAX_PROMPT_BYTES: usize = 16 << 20;

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// A model's chat template, compiled.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

/// A special token as `tokenizer_config.json` writes it: a string, or `{"content": ...}`.
fn token(config: &serde_json::Value, key: &str) -> String {
    match &config[key] {
        serde_json::Value::String(token) => token.clone(),
        serde_json::Value::Object(token) => token
            .get("content")
            .and_then(|c| c.as_str())
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    /// The chat template in `dir` of model `name`, if it has one; one that cannot be used is
    /// logged and kept as the reason its chats are refused (completions need none).
    pub fn load_for(name: &str, dir: &Path) -> Option<Result<ChatTemplate, String>> {
        match ChatTemplate::load(dir) {
            Ok(template) => template.map(Ok),
            Err(why) => {
                tracing::warn!(model = %name, "chats are refused: {why}");
                Some(Err(why))
            }
        }
    }

    /// The chat template in `dir`, if the model has one.
    ///
    /// # Errors
    /// A file that is too large or not what it should be, or a template that does not compile.
    pub fn load(dir: &Path) -> Result<Option<ChatTemplate>, String> {
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.is_file() {
            let size = std::fs::metadata(&config_path).map_or(0, |m| m.len());
            if size > MAX_CONFIG_BYTES {
                return Err(format!(
                    "{} holds {size} bytes, more than the {MAX_CONFIG_BYTES} kiln reads",
                    config_path.display()
                ));
            }
            let text = std::fs::read_to_string(&config_path)
                .map_err(|e| format!("cannot read {}: {e}", config_path.display()))?;
            serde_json::from_str(&text)
                .map_err(|e| format!("{} is not JSON: {e}", config_path.display()))?
        } else {
            serde_json::Value::Null
        };
        let template = match &config["chat_template"] {
            serde_json::Value::String(template) => Some(template.clone()),
            serde_json::Value::Array(named) => named
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .map(str::to_string),
            _ => None,
        };
        let template = match template {
            Some(template) => template,
            None => {
                let file = dir.join("chat_template.jinja");
                if !file.is_file() {
                    return Ok(None);
                }
                let size = std::fs::metadata(&file).map_or(0, |m| m.len());
                if size > MAX_TEMPLATE_BYTES as u64 {
                    return Err(format!(
                        "{} holds {size} bytes, more than the {MAX_TEMPLATE_BYTES} kiln reads",
                        file.display()
                    ));
                }
                std::fs::read_to_string(&file)
                    .map_err(|e| format!("cannot read {}: {e}", file.display()))?
            }
        };
        let template = ChatTemplate::new(
            template,
            token(&config, "bos_token"),
            token(&config, "eos_token"),
        )
        .map_err(|e| {
            format!(
                "the chat template of {} does not compile: {e}",
                dir.display()
            )
        })?;
        Ok(Some(template))
    }

    /// Compiles `template`.
    ///
    /// # Errors
    /// A template that is too large or does not compile.
    pub fn new(template: String, bos: String, eos: String) -> Result<ChatTemplate, String> {
        if template.len() > MAX_TEMPLATE_BYTES {
            return Err(format!(
                "the template holds {} bytes, more than the {MAX_TEMPLATE_BYTES} kiln reads",
                template.len()
            ));
        }
        let mut env = Environment::new();
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        // transformers gives templates today's date this way (Llama 3, Granite); UTC here.
        env.add_function("strftime_now", |format: String| -> String {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            strftime(&format, now)
        });
        // Hugging Face's templates trim blocks and lstrip them as transformers configures Jinja.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_template_owned("chat", template)
            .map_err(|e| e.to_string())?;
        Ok(ChatTemplate { env, bos, eos })
    }

    /// The prompt for `messages`, ending where the assistant's answer begins.
    ///
    /// # Errors
    /// The template refused the conversation (`raise_exception`), failed, ran out of fuel, or
    /// produced a prompt larger than kiln takes.
    pub fn render(&self, messages: &[Message]) -> Result<String, String> {
        let template = self.env.get_template("chat").map_err(|e| e.to_string())?;
        let context = minijinja::context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => true,
            bos_token => &self.bos,
            eos_token => &self.eos,
        };
        let prompt = template.render(context).map_err(|e| match e.kind() {
            ErrorKind::InvalidOperation => e.detail().unwrap_or("invalid conversation").to_string(),
            _ => format!("the chat template failed: {e}"),
        })?;
        if prompt.len() > MAX_PROMPT_BYTES {
            return Err(format!(
                "the chat template produced {} bytes, more than the {MAX_PROMPT_BYTES} kiln takes",
                prompt.len()
            ));
        }
        Ok(prompt)
    }
}

/// `format` (C's strftime conversions for dates and times) for `secs` since the epoch, UTC.
/// Conversions it does not know stay as written.
fn strftime(format: &str, secs: u64) -> String {
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
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    const BEFORE: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    let (hour, minute, second) = (rest / 3600, rest % 3600 / 60, rest % 60);
    // The civil date of a day count (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let ordinal = BEFORE[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let month_name = MONTHS[(month - 1) as usize];
    let day_name = DAYS[days.rem_euclid(7) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('j') => out.push_str(&format!("{ordinal:03}")),
            Some('B') => out.push_str(month_name),
            Some('b' | 'h') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(day_name),
            Some('a') => out.push_str(&day_name[..3]),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ChatML template as small models ship it (SmolLM, Qwen), with a check.
    const CHATML: &str = "{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role ' + message['role']) }}{% endif %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'].strip() + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn message(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn conversations_render_as_the_template_lays_them_out() {
        let template = ChatTemplate::new(CHATML.into(), "<s>".into(), "</s>".into()).unwrap();
        let prompt = template
            .render(&[message("system", "Be brief. "), message("user", " Hi")])
            .unwrap();
        assert_eq!(
            prompt,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            template.render(&[message("tool", "x")]).unwrap_err(),
            "unknown role tool"
        );
        let tokens = ChatTemplate::new(
            "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}".into(),
            "<s>".into(),
            "</s>".into(),
        )
        .unwrap();
        assert_eq!(tokens.render(&[message("user", "x")]).unwrap(), "<s>x</s>");
    }

    #[test]
    fn dates_as_strftime_writes_them() {
        // 2026-11-30 12:05:09 UTC, a Monday, day 334; and 2024-03-01, after a leap day.
        let now = 1_796_040_309;
        assert_eq!(strftime("%d %b %Y", now), "30 Nov 2026");
        assert_eq!(strftime("%A, %B %e, %y", now), "Monday, November 30, 26");
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %I%p %j %a %% %Q", now),
            "2026-11-30 12:05:09 12PM 334 Mon % %Q"
        );
        assert_eq!(strftime("%j %d %b", 1_709_251_200), "061 01 Mar");
        let template = ChatTemplate::new(
            "{{ strftime_now('%Y') }}".into(),
            String::new(),
            String::new(),
        )
        .unwrap();
        assert_eq!(template.render(&[]).unwrap().len(), 4);
    }

    #[test]
    fn templates_are_bounded() {
        let endless = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
                .into(),
            String::new(),
            String::new(),
        )
        .unwrap();
        let error = endless.render(&[]).unwrap_err();
        assert!(error.contains("fuel"), "{error}");
        assert!(ChatTemplate::new("{% for %}".into(), String::new(), String::new()).is_err());
        assert!(ChatTemplate::new(
            "x".repeat(MAX_TEMPLATE_BYTES + 1),
            String::new(),
            String::new()
        )
        .is_err());
    }

    #[test]
    fn templates_come_from_the_tokenizer_config_or_a_file() {
        let dir = std::env::temp_dir().join(format!("kiln-chat-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert!(ChatTemplate::load(&dir).unwrap().is_none());
        std::fs::write(
            dir.join("chat_template.jinja"),
            "file:{{ messages[0].content }}",
        )
        .unwrap();
        let from_file = ChatTemplate::load(&dir).unwrap().unwrap();
        assert_eq!(from_file.render(&[message("user", "a")]).unwrap(), "file:a");
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"bos_token": {"content": "<s>"}, "eos_token": "</s>",
                "chat_template": [{"name": "tool_use", "template": "no"},
                                  {"name": "default", "template": "{{ bos_token }}config:{{ messages[0].content }}"}]}"#,
        )
        .unwrap();
        let from_config = ChatTemplate::load(&dir).unwrap().unwrap();
        assert_eq!(
            from_config.render(&[message("user", "a")]).unwrap(),
            "<s>config:a"
        );
        std::fs::write(dir.join("tokenizer_config.json"), "{").unwrap();
        assert!(ChatTemplate::load(&dir)
            .unwrap_err()
            .contains("is not JSON"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
