//! AFL++ target: `gyre_fuzz::cyclo`.

fn main() -> std::process::ExitCode {
    gyre_afl::drive(gyre_fuzz::cyclo::seeds, gyre_fuzz::cyclo::run)
}
