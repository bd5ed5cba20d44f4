//! The config parser fed damaged configs: a clear error or a config, never a panic.

use appease_fuzz::{fuzz, text};

#[test]
fn the_config_parser_never_panics_on_damaged_configs() {
    let seed = include_bytes!("../../../config/default.toml");
    fuzz("config", seed, |b| {
        let _clear_error_or_config = appease_config::Config::parse(&text(b), "fuzz.toml");
    });
}
