//! The blast command alone (`gyre-testbed-blast serve|send ...`), for measuring a
//! testbed without the gyre binary (the crate's own tests use it).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = gyre_testbed::blast::run_cli(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
