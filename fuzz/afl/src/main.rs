//! AFL++ driver for the fuzz targets of `crates/fuzz`.
//!
//! ```text
//! gyre-afl list                 the targets of this build
//! gyre-afl seeds TARGET DIR     writes the target's seeds into DIR (AFL's -i)
//! gyre-afl run TARGET           decodes inputs under afl-fuzz (persistent mode), or
//!                               one input from stdin outside it (to replay a crash)
//! ```
//!
//! `fuzz_nohook!` rather than `fuzz!`: some decoders contain panics of the libraries
//! beneath them (arrow-ipc) and turn them into errors, which AFL's panic hook would
//! abort before they can. A panic that escapes a target still aborts, and AFL records
//! the input as a crash.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["list"] => {
            for t in gyre_fuzz::targets() {
                println!("{}", t.name);
            }
            ExitCode::SUCCESS
        }
        ["seeds", name, dir] => match seeds(name, dir) {
            Ok(n) => {
                eprintln!("{n} seeds of {name} in {dir}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("gyre-afl: {e}");
                ExitCode::FAILURE
            }
        },
        ["run", name] => {
            let Some(target) = gyre_fuzz::target(name) else {
                eprintln!("gyre-afl: no target {name} in this build (see `gyre-afl list`)");
                return ExitCode::FAILURE;
            };
            afl::fuzz_nohook!(|input: &[u8]| (target.run)(input));
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("usage: gyre-afl list | seeds TARGET DIR | run TARGET");
            ExitCode::FAILURE
        }
    }
}

/// Writes the seeds of `name` into `dir`, one file each.
fn seeds(name: &str, dir: &str) -> Result<usize, String> {
    let target = gyre_fuzz::target(name).ok_or(format!("no target {name} in this build"))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{dir}: {e}"))?;
    let seeds = (target.seeds)();
    for (i, s) in seeds.iter().enumerate() {
        let path = format!("{dir}/seed-{i:03}");
        std::fs::write(&path, s).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(seeds.len())
}
