//! TPC-C's five transactions (clause 2) as stored procedures.
//!
//! Every input the specification draws at the terminal (items, amounts, the current
//! time) is an argument, so each procedure's effect depends only on the database and
//! its arguments: all five are deterministic and log logically under `--log logical`.
//! New-Order's unused item number (1 % of them) makes it fail, which rolls it back
//! entirely, as clause 2.4.2.3 asks.

mod delivery;
mod new_order;
mod order_status;
mod payment;
mod stock_level;

pub use delivery::Delivery;
pub use new_order::NewOrder;
pub use order_status::OrderStatus;
pub use payment::Payment;
pub use stock_level::StockLevel;

use crate::schema::col;
use crate::values::int_of;
use gyre_replica::{Result, Row, TableId, Txn, Value};

/// The row with this key, or an error naming what is missing.
fn get(txn: &Txn<'_>, table: TableId, key: &[Value], what: &str) -> Result<Row> {
    txn.get(table, key)?
        .ok_or_else(|| Txn::abort(format!("no {what} {key:?}")))
}

/// Sets some columns of the row with this key: in place, if the caller let go of the
/// row it read (no copy of the row, no check of the columns it keeps).
fn set(
    txn: &mut Txn<'_>,
    table: TableId,
    key: &[Value],
    changes: impl IntoIterator<Item = (usize, Value)>,
) -> Result<()> {
    let columns = changes.into_iter().map(|(i, v)| (i as u32, v)).collect();
    txn.patch(table, key, columns)
}

/// `row` with some columns replaced.
fn with(row: &[Value], changes: impl IntoIterator<Item = (usize, Value)>) -> Vec<Value> {
    let mut out = row.to_vec();
    for (i, v) in changes {
        out[i] = v;
    }
    out
}

/// The customer a Payment or Order-Status names: by number, or by last name, in which
/// case the one in the middle of those with that name sorted by first name
/// (clause 2.5.2.2), found by the `customer_name` index.
fn customer(txn: &Txn<'_>, w: i64, d: i64, id: &Value, last: &Value) -> Result<Row> {
    let table = txn.table("customer")?;
    let c = match (id, last) {
        (Value::Int(c), _) => *c,
        (Value::Null, Value::Text(name)) => {
            let index = txn.table("customer_name")?;
            let prefix = [Value::Int(w), Value::Int(d), last.clone()];
            // In key order: by first name, then number.
            let ids: Vec<i64> = txn
                .prefix(index, &prefix)?
                .map(|(_, r)| int_of(r, col::customer_name::C_ID))
                .collect();
            if ids.is_empty() {
                return Err(Txn::abort(format!(
                    "no customer named {name} in district {d} of warehouse {w}"
                )));
            }
            ids[(ids.len() - 1) / 2]
        }
        _ => {
            return Err(Txn::abort(
                "give either a customer number or a last name, not both",
            ));
        }
    };
    get(
        txn,
        table,
        &[Value::Int(w), Value::Int(d), Value::Int(c)],
        "customer",
    )
}
