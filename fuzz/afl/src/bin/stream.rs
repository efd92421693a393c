//! AFL++ target: `gyre_fuzz::stream`.

fn main() -> std::process::ExitCode {
    gyre_afl::drive(gyre_fuzz::stream::seeds, gyre_fuzz::stream::run)
}
