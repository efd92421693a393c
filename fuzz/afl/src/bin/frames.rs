//! AFL++ target: `gyre_fuzz::frames`.

fn main() -> std::process::ExitCode {
    gyre_afl::drive(gyre_fuzz::frames::seeds, gyre_fuzz::frames::run)
}
