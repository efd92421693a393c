//! Flow-Join control messages (reports of heavy hitters, announcements, fetches), as
//! the coordinating and the participating workers decode them.

use gyre_join::flow::control::{Control, Side};

/// One message of each kind.
pub fn seeds() -> Vec<Vec<u8>> {
    [
        Control::Report {
            side: Side::Build,
            iteration: 1,
            window: 4096,
            total: 1 << 20,
            candidates: vec![(1, 100), (7, 90), (u64::MAX, 3)],
        },
        Control::Announce {
            side: Side::Probe,
            iteration: 2,
            keys: vec![(1, 0), (7, 1)],
        },
        Control::Fetch {
            side: Side::Build,
            iteration: 2,
            keys: vec![],
        },
    ]
    .iter()
    .map(Control::encode)
    .collect()
}

/// Decodes the input as a Flow-Join message.
pub fn run(input: &[u8]) {
    let _ = Control::decode(input);
}
