//! AFL++ target: `gyre_fuzz::redo`.

fn main() -> std::process::ExitCode {
    gyre_afl::drive(gyre_fuzz::redo::seeds, gyre_fuzz::redo::run)
}
