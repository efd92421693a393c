//! AFL++ target: `gyre_fuzz::ipc`.

fn main() -> std::process::ExitCode {
    gyre_afl::drive(gyre_fuzz::ipc::seeds, gyre_fuzz::ipc::run)
}
