//! AFL++ target: `gyre_fuzz::control`.

fn main() -> std::process::ExitCode {
    gyre_afl::drive(gyre_fuzz::control::seeds, gyre_fuzz::control::run)
}
