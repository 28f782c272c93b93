//! `config.pbtxt` text: protobuf text-format parsing (with the list-colon rewrite), then every
//! normalisation and check a loaded config goes through before any model file is opened.
#![no_main]

use kiln::repository::config::{
    batching_config, config_to_json, normalize_identity, normalize_instance_groups, parse_config,
    validate_io,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(mut config) = parse_config(text) else {
        return;
    };
    let _ = config_to_json(&config);
    if normalize_identity(&mut config, "m").is_err()
        || normalize_instance_groups(&mut config).is_err()
    {
        return;
    }
    let _ = validate_io(&config);
    let _ = batching_config(&config);
});
