//! `config.pbtxt` text: protobuf text-format parsing (with the list-colon rewrite), then every
//! normalisation and check a loaded config goes through before any model file is opened, with
//! instance groups placed as on a machine with one usable GPU (so the CUDA options are checked).
#![no_main]

use kiln::backend::{Gpu, GpuInventory};
use kiln::repository::config::{
    batching_config, config_to_json, normalize_identity, parse_config, validate_io,
};
use kiln::repository::placement::place;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(mut config) = parse_config(text) else {
        return;
    };
    let _ = config_to_json(&config);
    // A Python-based backend (a `model.py` found beside the config) for odd lengths.
    if normalize_identity(&mut config, "m", text.len() % 2 == 1).is_err()
        || place(&mut config, &one_gpu, false).is_err()
    {
        return;
    }
    let _ = validate_io(&config);
    let _ = batching_config(&config, true);
});

fn one_gpu() -> GpuInventory {
    GpuInventory::Usable(vec![Gpu {
        id: 0,
        uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
    }])
}
