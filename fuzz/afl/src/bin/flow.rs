//! AFL++ target: `gyre_fuzz::flow`.

fn main() -> std::process::ExitCode {
    gyre_afl::drive(gyre_fuzz::flow::seeds, gyre_fuzz::flow::run)
}
