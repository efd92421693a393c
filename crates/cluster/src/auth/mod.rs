//! Who may call a node.
//!
//! Clients log in with a user name and password from a users file ([`users`]) and get
//! a bearer token ([`tokens`]); cluster nodes sign their control messages with the
//! cluster secret ([`node`]). [`gate::Gate`] wraps a Flight service and lets a call
//! through only when it passes. TLS ([`tls`]) keeps passwords, tokens and results off
//! the wire.

pub mod gate;
pub mod node;
pub mod tls;
pub mod tokens;
pub mod users;

pub use gate::{Admission, Clients, Gate, HeaderCheck};
pub use node::{NODE_HEADER, NodeKey};
pub use tls::TlsIdentity;
pub use users::Users;
