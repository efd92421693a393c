//! Stored procedures: transactions written in Rust, called by name with arguments.
//!
//! HyPer (and ScyPer after it) runs OLTP as pre-canned procedures: a procedure's name
//! and arguments are all a logical redo entry needs, provided its outcome depends only
//! on the database state. A procedure that reads the clock or draws random numbers
//! says so ([`Procedure::deterministic`]) and is logged physically.

use crate::error::{Error, Result};
use crate::txn::Txn;
use crate::value::{Column, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

pub trait Procedure: Send + Sync {
    fn name(&self) -> &str;

    /// The parameters: names, types and whether NULL is allowed.
    fn params(&self) -> Vec<Column>;

    /// The columns of the rows [`Procedure::run`] returns (none by default).
    fn returns(&self) -> Vec<Column> {
        Vec::new()
    }

    /// Whether the same arguments on the same state always make the same changes.
    fn deterministic(&self) -> bool {
        true
    }

    /// The transaction's body: reads and writes through `txn`; an error rolls it back.
    /// Returns the rows the caller sees (none for most).
    fn run(&self, txn: &mut Txn<'_>, args: &[Value]) -> Result<Vec<Vec<Value>>>;
}

/// The procedures a database can call (and replay).
#[derive(Clone, Default)]
pub struct Procedures {
    by_name: BTreeMap<String, Registered>,
}

/// A procedure and its parameters, asked for once: every call is checked against
/// them, and building them per call cost a TPC-C transaction a few percent.
#[derive(Clone)]
struct Registered {
    procedure: Arc<dyn Procedure>,
    params: Arc<[Column]>,
}

impl std::fmt::Debug for Procedures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.by_name.keys()).finish()
    }
}

impl Procedures {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, procedure: impl Procedure + 'static) -> Self {
        self.register(Arc::new(procedure));
        self
    }

    pub fn register(&mut self, procedure: Arc<dyn Procedure>) {
        let params = procedure.params().into();
        self.by_name.insert(
            procedure.name().to_ascii_lowercase(),
            Registered { procedure, params },
        );
    }

    /// The procedure with this name (case-insensitive, as SQL names are).
    pub fn get(&self, name: &str) -> Result<&Arc<dyn Procedure>> {
        self.registered(name).map(|r| &r.procedure)
    }

    fn registered(&self, name: &str) -> Result<&Registered> {
        let found = if name.bytes().any(|b| b.is_ascii_uppercase()) {
            self.by_name.get(&name.to_ascii_lowercase())
        } else {
            self.by_name.get(name)
        };
        found.ok_or_else(|| Error::NoSuchProcedure(name.to_string()))
    }

    /// The procedure with this name, once `args` are checked against its parameters.
    pub fn for_call(&self, name: &str, args: &[Value]) -> Result<&Arc<dyn Procedure>> {
        let r = self.registered(name)?;
        check_params(r.procedure.name(), &r.params, args)?;
        Ok(&r.procedure)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

/// Checks `args` against the parameters of the procedure `name`.
fn check_params(name: &str, params: &[Column], args: &[Value]) -> Result<()> {
    if params.len() != args.len() {
        return Err(Error::Arguments(format!(
            "{name} takes {} arguments, got {}",
            params.len(),
            args.len()
        )));
    }
    for (p, a) in params.iter().zip(args) {
        p.check(a)
            .map_err(|e| Error::Arguments(format!("{name}: {}: {e}", p.name)))?;
    }
    Ok(())
}
