//! Which session a Flight SQL call belongs to.
//!
//! A session holds a client's settings (`SET datafusion.*`, `SET gyre.*`) and prepared
//! statements over the coordinator's shared catalog, so that one client's `SET` never
//! changes another's plans. Flight SQL names a session by the cookie
//! `arrow_flight_session_id` (clients that keep cookies, such as the JDBC driver, send
//! it back); a client that does not is one session per connection, as ADBC opens one
//! gRPC connection per database connection. Sessions idle for [`IDLE_SESSION`] end,
//! and at most [`MAX_SESSIONS`] live at once (the least recently used one ends first),
//! so clients that never close theirs cannot grow the coordinator without bound.

use datafusion::prelude::SessionContext;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tonic::metadata::MetadataMap;

/// The cookie that names a Flight SQL session.
pub const SESSION_COOKIE: &str = "arrow_flight_session_id";

/// A session unused this long ends.
pub const IDLE_SESSION: Duration = Duration::from_secs(8 * 3600);

/// At most this many sessions live at once.
pub const MAX_SESSIONS: usize = 1024;

struct Entry {
    session: SessionContext,
    peer: Option<SocketAddr>,
    last_used: Instant,
}

/// The coordinator's client sessions, by id and by connection.
#[derive(Default)]
pub struct ClientSessions {
    inner: Mutex<Sessions>,
}

#[derive(Default)]
struct Sessions {
    by_id: HashMap<String, Entry>,
    by_peer: HashMap<SocketAddr, String>,
}

/// The session of a call, and the cookie to send back when the call started it.
pub struct CallSession {
    pub session: SessionContext,
    pub new_cookie: Option<String>,
}

impl ClientSessions {
    /// The session a call with `metadata` from `peer` belongs to: the one its cookie
    /// names, else its connection's, else a new one made by `new_session`.
    pub fn of(
        &self,
        metadata: &MetadataMap,
        peer: Option<SocketAddr>,
        new_session: impl FnOnce() -> SessionContext,
    ) -> CallSession {
        let mut s = self.inner.lock();
        let now = Instant::now();
        if let Some(id) = s.find(metadata, peer)
            && let Some(e) = s.by_id.get_mut(&id)
        {
            e.last_used = now;
            return CallSession {
                session: e.session.clone(),
                new_cookie: None,
            };
        }
        s.end_idle(now);
        let id = format!("{:032x}", rand::random::<u128>());
        let session = new_session();
        s.by_id.insert(
            id.clone(),
            Entry {
                session: session.clone(),
                peer,
                last_used: now,
            },
        );
        if let Some(p) = peer {
            s.by_peer.insert(p, id.clone());
        }
        CallSession {
            session,
            new_cookie: Some(format!("{SESSION_COOKIE}={id}")),
        }
    }

    /// Ends the session a call belongs to (Flight's `CloseSession`); whether there was one.
    pub fn close(&self, metadata: &MetadataMap, peer: Option<SocketAddr>) -> bool {
        let mut s = self.inner.lock();
        match s.find(metadata, peer) {
            Some(id) => {
                s.remove(&id);
                true
            }
            None => false,
        }
    }

    /// How many sessions live.
    pub fn len(&self) -> usize {
        self.inner.lock().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Sessions {
    /// The id of the live session a call's cookie names, else its connection's.
    fn find(&self, metadata: &MetadataMap, peer: Option<SocketAddr>) -> Option<String> {
        cookie_session(metadata)
            .filter(|id| self.by_id.contains_key(id))
            .or_else(|| peer.and_then(|p| self.by_peer.get(&p).cloned()))
    }

    fn remove(&mut self, id: &str) {
        if let Some(e) = self.by_id.remove(id)
            && let Some(p) = e.peer
            && self.by_peer.get(&p).is_some_and(|i| i == id)
        {
            self.by_peer.remove(&p);
        }
    }

    /// Ends idle sessions, and the least recently used ones beyond the limit, leaving
    /// room for one more.
    fn end_idle(&mut self, now: Instant) {
        let idle: Vec<String> = self
            .by_id
            .iter()
            .filter(|(_, e)| now.duration_since(e.last_used) >= IDLE_SESSION)
            .map(|(id, _)| id.clone())
            .collect();
        for id in idle {
            self.remove(&id);
        }
        while self.by_id.len() >= MAX_SESSIONS {
            let Some(oldest) = self
                .by_id
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            self.remove(&oldest);
        }
    }
}

/// The session id in a call's cookies, if any.
fn cookie_session(metadata: &MetadataMap) -> Option<String> {
    metadata
        .get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, id)| id.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    #[test]
    fn connections_and_cookies_name_sessions() {
        let sessions = ClientSessions::default();
        let none = MetadataMap::new();
        let a = sessions.of(&none, peer(1000), SessionContext::new);
        let cookie = a
            .new_cookie
            .clone()
            .expect("a new session sends its cookie");
        // The same connection, another connection, and the cookie from elsewhere.
        let again = sessions.of(&none, peer(1000), SessionContext::new);
        assert!(again.new_cookie.is_none());
        assert_eq!(again.session.session_id(), a.session.session_id());
        let b = sessions.of(&none, peer(1001), SessionContext::new);
        assert_ne!(b.session.session_id(), a.session.session_id());
        let mut with_cookie = MetadataMap::new();
        with_cookie.insert("cookie", format!("x=1; {cookie}").parse().unwrap());
        let c = sessions.of(&with_cookie, peer(2000), SessionContext::new);
        assert_eq!(c.session.session_id(), a.session.session_id());
        // An unknown cookie starts a new session.
        let mut stale = MetadataMap::new();
        stale.insert("cookie", format!("{SESSION_COOKIE}=0").parse().unwrap());
        let d = sessions.of(&stale, peer(3000), SessionContext::new);
        assert!(d.new_cookie.is_some());
        assert_eq!(sessions.len(), 3);
        assert!(sessions.close(&none, peer(1000)));
        assert!(!sessions.close(&none, peer(1000)));
        assert_eq!(sessions.len(), 2);
    }

    #[test]
    fn sessions_are_bounded() {
        let sessions = ClientSessions::default();
        let none = MetadataMap::new();
        let first = sessions.of(&none, peer(1), SessionContext::new);
        for port in 2..(MAX_SESSIONS as u16 + 10) {
            sessions.of(&none, peer(port), SessionContext::new);
        }
        assert_eq!(sessions.len(), MAX_SESSIONS);
        // The least recently used one ended: its connection gets a new session.
        let again = sessions.of(&none, peer(1), SessionContext::new);
        assert_ne!(again.session.session_id(), first.session.session_id());
    }
}
