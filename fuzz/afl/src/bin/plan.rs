//! AFL++ target: `gyre_fuzz::plan`.

fn main() -> std::process::ExitCode {
    gyre_afl::drive(gyre_fuzz::plan::seeds, gyre_fuzz::plan::run)
}
