//! TPC-C on Gyre's primary (the OLTP half of the CH-benCHmark that ScyPer is measured
//! with, Rödiger's thesis, chapter 5): the schema as transactional tables, a loader and
//! the five transactions as deterministic stored procedures, a terminal's input
//! generator, and the specification's consistency conditions.
//!
//! - [`schema`]: the nine tables and two secondary indexes as tables, their keys, and
//!   `CREATE TABLE` statements for SQL.
//! - [`random`]: the specification's random data, from a generator whose sequence is
//!   fixed (a logged load is replayed by drawing it again).
//! - [`load`]: the initial database as procedures, per warehouse and per district.
//! - [`transactions`]: New-Order, Payment, Order-Status, Delivery and Stock-Level.
//! - [`workload`]: what a terminal calls next.
//! - [`consistency`]: conditions any correct state satisfies.
//! - [`ch`]: CH-benCHmark's analytical queries over the same tables.

pub mod ch;
pub mod consistency;
pub mod load;
pub mod random;
pub mod schema;
pub mod transactions;
mod values;
pub mod workload;

pub use workload::{Call, Kind, Mix, Scale, Terminal, call_sql};

use gyre_replica::{Database, Procedures, Result, Value};

/// Every TPC-C procedure: the loaders and the five transactions.
pub fn procedures() -> Procedures {
    Procedures::new()
        .with(load::LoadItems)
        .with(load::LoadWarehouse)
        .with(load::LoadDistrict)
        .with(transactions::NewOrder)
        .with(transactions::Payment)
        .with(transactions::OrderStatus)
        .with(transactions::Delivery)
        .with(transactions::StockLevel)
}

/// The loading calls for a database of `scale`, in order: items, then per warehouse
/// the warehouse and its districts. `load_time` (nanoseconds since the epoch) stamps
/// the initial orders, customers and history.
pub fn load_calls(scale: Scale, load_time: i64) -> Vec<(&'static str, Vec<Value>)> {
    let mut calls = vec![("tpcc_load_items", vec![Value::Int(scale.items)])];
    for w in 1..=scale.warehouses {
        calls.push((
            "tpcc_load_warehouse",
            vec![
                Value::Int(w),
                Value::Int(scale.items),
                Value::Int(scale.customers),
            ],
        ));
        for d in 1..=load::DISTRICTS {
            calls.push((
                "tpcc_load_district",
                vec![
                    Value::Int(w),
                    Value::Int(d),
                    Value::Int(scale.items),
                    Value::Int(scale.customers),
                    Value::Timestamp(load_time),
                ],
            ));
        }
    }
    calls
}

/// Creates the tables in `db` (which has [`procedures`]) and loads them.
pub fn create_and_load(db: &Database, scale: Scale, load_time: i64) -> Result<()> {
    schema::create_tables(db)?;
    for (procedure, args) in load_calls(scale, load_time) {
        db.call(procedure, &args)?;
    }
    Ok(())
}
