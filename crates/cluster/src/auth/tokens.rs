//! Bearer tokens handed out by a successful login.
//!
//! A token is 128 random bits; it names the user who logged in and lives while it is
//! used. Tokens idle for [`IDLE_TOKEN`] end, and at most [`MAX_TOKENS`] live at once
//! (the least recently used one ends first), so clients that log in again and again
//! cannot grow the coordinator without bound.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A token unused this long ends; its client logs in again.
pub const IDLE_TOKEN: Duration = Duration::from_secs(8 * 3600);

/// At most this many tokens live at once.
pub const MAX_TOKENS: usize = 4096;

struct Entry {
    user: String,
    last_used: Instant,
}

/// The live tokens.
#[derive(Default)]
pub struct Tokens {
    live: Mutex<HashMap<String, Entry>>,
}

impl Tokens {
    /// A new token for `user`.
    pub fn issue(&self, user: &str) -> String {
        let token = format!("{:032x}", rand::random::<u128>());
        let now = Instant::now();
        let mut live = self.live.lock();
        live.retain(|_, e| now.duration_since(e.last_used) < IDLE_TOKEN);
        while live.len() >= MAX_TOKENS {
            let Some(oldest) = live
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(t, _)| t.clone())
            else {
                break;
            };
            live.remove(&oldest);
        }
        live.insert(
            token.clone(),
            Entry {
                user: user.to_string(),
                last_used: now,
            },
        );
        token
    }

    /// The user a live token belongs to.
    pub fn user_of(&self, token: &str) -> Option<String> {
        let now = Instant::now();
        let mut live = self.live.lock();
        let e = live.get_mut(token)?;
        if now.duration_since(e.last_used) >= IDLE_TOKEN {
            live.remove(token);
            return None;
        }
        e.last_used = now;
        Some(e.user.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_their_user_and_are_bounded() {
        let tokens = Tokens::default();
        let a = tokens.issue("alice");
        let b = tokens.issue("bob");
        assert_ne!(a, b);
        assert_eq!(tokens.user_of(&a).as_deref(), Some("alice"));
        assert_eq!(tokens.user_of(&b).as_deref(), Some("bob"));
        assert_eq!(tokens.user_of("0"), None);
        for _ in 0..MAX_TOKENS + 5 {
            tokens.issue("carol");
        }
        assert_eq!(tokens.live.lock().len(), MAX_TOKENS);
        // The least recently used went first.
        assert_eq!(tokens.user_of(&a), None);
    }
}
