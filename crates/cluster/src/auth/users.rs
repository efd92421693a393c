//! The users file: who may log in, and with which password.
//!
//! One `name:hash` line per user, where `hash` is an Argon2 PHC string
//! (`$argon2id$v=19$m=...`) as `gyre passwd NAME` prints it. Blank lines and lines
//! starting with `#` are ignored. Passwords are never stored, only their salted hashes.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

/// The users allowed to log in, by name.
#[derive(Debug, Clone, Default)]
pub struct Users {
    hashes: HashMap<String, String>,
}

impl Users {
    /// Reads a users file; an error names the file and the line at fault.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the users file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("users file {}: {e}", path.display()))
    }

    /// Parses the text of a users file.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut hashes = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, hash) = line
                .split_once(':')
                .ok_or_else(|| format!("line {}: expected name:hash", i + 1))?;
            check_name(name).map_err(|e| format!("line {}: {e}", i + 1))?;
            PasswordHash::new(hash).map_err(|e| {
                format!(
                    "line {}: the hash of {name} is not a PHC string ({e}); make it with `gyre passwd {name}`",
                    i + 1
                )
            })?;
            if hashes.insert(name.to_string(), hash.to_string()).is_some() {
                return Err(format!("line {}: user {name} appears twice", i + 1));
            }
        }
        if hashes.is_empty() {
            return Err("no users in it".to_string());
        }
        Ok(Self { hashes })
    }

    /// Whether `password` is `name`'s. An unknown name costs as much time as a known
    /// one, so that timing does not tell which names exist.
    pub fn verify(&self, name: &str, password: &str) -> bool {
        let (hash, known) = match self.hashes.get(name) {
            Some(h) => (h.as_str(), true),
            None => (unknown_user_hash(), false),
        };
        let Ok(hash) = PasswordHash::new(hash) else {
            return false;
        };
        let matches = Argon2::default()
            .verify_password(password.as_bytes(), &hash)
            .is_ok();
        matches && known
    }

    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }
}

/// A user name fits in a users-file line and in HTTP Basic credentials.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 128 {
        return Err("a user name has 1 to 128 characters".to_string());
    }
    if name
        .chars()
        .any(|c| c == ':' || c == '#' || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "user name {name:?} contains ':', '#', a space or a control character"
        ));
    }
    Ok(())
}

/// The users-file line for `name` with `password` (Argon2id, default parameters, a
/// random salt).
pub fn user_line(name: &str, password: &str) -> Result<String, String> {
    check_name(name)?;
    if password.is_empty() {
        return Err("the password is empty".to_string());
    }
    Ok(format!("{name}:{}", hash_password(password)?))
}

fn hash_password(password: &str) -> Result<String, String> {
    let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>())
        .map_err(|e| format!("cannot make a salt: {e}"))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| format!("cannot hash the password: {e}"))
}

/// A hash no password is known for, checked against when the name is unknown.
fn unknown_user_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| {
        hash_password(&format!("{:032x}", rand::random::<u128>())).unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_made_by_passwd_verify_their_password_only() {
        let alice = user_line("alice", "s3cret pass").unwrap();
        let bob = user_line("bob", "other").unwrap();
        let users = Users::parse(&format!("# team\n{alice}\n\n{bob}\n")).unwrap();
        assert_eq!(users.len(), 2);
        assert!(users.verify("alice", "s3cret pass"));
        assert!(!users.verify("alice", "s3cret pas"));
        assert!(!users.verify("alice", "other"));
        assert!(users.verify("bob", "other"));
        assert!(!users.verify("carol", "other"));
        // The line holds no trace of the password.
        assert!(!alice.contains("s3cret"));
    }

    #[test]
    fn bad_files_and_names_are_refused_with_the_line() {
        let e = Users::parse("alice\n").unwrap_err();
        assert!(e.contains("line 1") && e.contains("name:hash"), "{e}");
        let e = Users::parse("alice:plaintext\n").unwrap_err();
        assert!(e.contains("gyre passwd alice"), "{e}");
        let line = user_line("alice", "x").unwrap();
        let e = Users::parse(&format!("{line}\n{line}\n")).unwrap_err();
        assert!(e.contains("line 2") && e.contains("twice"), "{e}");
        assert!(Users::parse("# nobody\n").is_err());
        assert!(user_line("a:b", "x").is_err());
        assert!(user_line("a b", "x").is_err());
        assert!(user_line("", "x").is_err());
        assert!(user_line("alice", "").is_err());
    }
}
