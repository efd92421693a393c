//! AFL++ driver for the fuzz targets of `crates/fuzz`: one binary per target
//! (`src/bin/`), each running
//!
//! ```text
//! TARGET seeds DIR     writes the target's seeds into DIR (AFL's -i)
//! TARGET               decodes inputs under afl-fuzz (persistent mode), or one input
//!                      from stdin outside it (to replay a crash)
//! ```
//!
//! One binary per target, not one for all: the linker then keeps only the code a
//! target can reach, and with it only that code's coverage counters. AFL++ clears and
//! scans the whole counter map on every input, so a binary holding all of DataFusion
//! (4.8 million counters) runs a decoder of a few microseconds 500 times slower.
//!
//! `fuzz_nohook!` rather than `fuzz!`: some decoders contain panics of the libraries
//! beneath them (arrow-ipc) and turn them into errors, which AFL's panic hook would
//! abort before they can. A panic that escapes a target still aborts, and AFL records
//! the input as a crash.

use std::process::ExitCode;

/// The body of each target's `main`.
pub fn drive(seeds: fn() -> Vec<Vec<u8>>, run: fn(&[u8])) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["seeds", dir] => match write_seeds(seeds(), dir) {
            Ok(n) => {
                eprintln!("{n} seeds in {dir}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        [] => {
            afl::fuzz_nohook!(|input: &[u8]| run(input));
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("usage: TARGET [seeds DIR]");
            ExitCode::FAILURE
        }
    }
}

/// Writes `seeds` into `dir`, one file each.
fn write_seeds(seeds: Vec<Vec<u8>>, dir: &str) -> Result<usize, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{dir}: {e}"))?;
    for (i, s) in seeds.iter().enumerate() {
        let path = format!("{dir}/seed-{i:03}");
        std::fs::write(&path, s).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(seeds.len())
}
