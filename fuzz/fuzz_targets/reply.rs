//! Fuzzes `bitfold_fuzz_targets::reply` (its oracle is documented there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bitfold_fuzz_targets::reply(data));
