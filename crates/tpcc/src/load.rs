//! The initial database (clause 4.3.3.1) as deterministic stored procedures: each
//! draws its data from a generator seeded by its arguments, so a logical redo entry
//! of a whole warehouse is its procedure name and five numbers.
//!
//! Loading is split so that no transaction grows large: the items, then per warehouse
//! the warehouse row and its stock, then per district its customers, history, orders,
//! order lines and new orders. `customers` scales a district down from the
//! specification's 3000 customers and 3000 orders (tests use less); the last 30 % of
//! orders are undelivered, as the specification's 900 of 3000 are.

use crate::random::{C_LAST_LOAD, Random, last_name, nurand_a};
use crate::schema::{TIMESTAMP, col};
use crate::values::{dec, int, ints, text};
use gyre_replica::{Column, ColumnType, Procedure, Result, Txn, Value};

/// The specification's sizes.
pub const ITEMS: i64 = 100_000;
pub const DISTRICTS: i64 = 10;
pub const CUSTOMERS: i64 = 3000;

fn param(name: &str, t: ColumnType) -> Column {
    Column::new(name, t, false)
}

/// The first order id that is still undelivered at load time.
pub fn first_new_order(customers: i64) -> i64 {
    customers - customers * 900 / 3000 + 1
}

fn check_sizes(items: i64, customers: i64) -> Result<()> {
    if !(1..=10_000_000).contains(&items) || !(1..=1_000_000).contains(&customers) {
        return Err(Txn::abort(format!(
            "{items} items and {customers} customers per district is out of range"
        )));
    }
    Ok(())
}

/// `tpcc_load_items(items)`: the ITEM table.
pub struct LoadItems;

impl Procedure for LoadItems {
    fn name(&self) -> &str {
        "tpcc_load_items"
    }

    fn params(&self) -> Vec<Column> {
        vec![param("items", ColumnType::Int32)]
    }

    fn run(&self, txn: &mut Txn<'_>, args: &[Value]) -> Result<Vec<Vec<Value>>> {
        let [items] = ints(args);
        check_sizes(items, 1)?;
        let item = txn.table("item")?;
        let mut r = Random::for_parts(&[1]);
        for i in 1..=items {
            txn.insert(
                item,
                vec![
                    int(i),
                    int(r.uniform(1, 10_000)),
                    text(r.astring(14, 24)),
                    dec(r.uniform(100, 10_000)),
                    text(r.data_with_original()),
                ],
            )?;
        }
        Ok(vec![])
    }
}

/// `tpcc_load_warehouse(w_id, items, customers)`: a warehouse and its stock.
pub struct LoadWarehouse;

impl Procedure for LoadWarehouse {
    fn name(&self) -> &str {
        "tpcc_load_warehouse"
    }

    fn params(&self) -> Vec<Column> {
        vec![
            param("w_id", ColumnType::Int32),
            param("items", ColumnType::Int32),
            param("customers", ColumnType::Int32),
        ]
    }

    fn run(&self, txn: &mut Txn<'_>, args: &[Value]) -> Result<Vec<Vec<Value>>> {
        let [w, items, customers] = ints(args);
        check_sizes(items, customers)?;
        let mut r = Random::for_parts(&[2, w as u64]);
        let warehouse = txn.table("warehouse")?;
        let mut row = vec![int(w), text(r.astring(6, 10))];
        row.extend(address(&mut r));
        // w_ytd is what the history of its districts' customers adds up to (300 000.00
        // at full size), so that the consistency conditions hold from the start.
        row.extend([dec(r.uniform(0, 2000)), dec(DISTRICTS * customers * 1000)]);
        txn.insert(warehouse, row)?;
        let stock = txn.table("stock")?;
        for i in 1..=items {
            let mut row = vec![int(i), int(w), int(r.uniform(10, 100))];
            row.extend((0..10).map(|_| text(r.astring(24, 24))));
            row.extend([int(0), int(0), int(0), text(r.data_with_original())]);
            txn.insert(stock, row)?;
        }
        Ok(vec![])
    }
}

fn address(r: &mut Random) -> [Value; 5] {
    [
        text(r.astring(10, 20)),
        text(r.astring(10, 20)),
        text(r.astring(10, 20)),
        text(r.astring(2, 2)),
        text(r.zip()),
    ]
}

/// `tpcc_load_district(w_id, d_id, items, customers, load_time)`: a district with its
/// customers, their history, and its orders.
pub struct LoadDistrict;

impl Procedure for LoadDistrict {
    fn name(&self) -> &str {
        "tpcc_load_district"
    }

    fn params(&self) -> Vec<Column> {
        vec![
            param("w_id", ColumnType::Int32),
            param("d_id", ColumnType::Int32),
            param("items", ColumnType::Int32),
            param("customers", ColumnType::Int32),
            param("load_time", TIMESTAMP),
        ]
    }

    fn run(&self, txn: &mut Txn<'_>, args: &[Value]) -> Result<Vec<Vec<Value>>> {
        let [w, d, items, customers] = ints(args);
        let now = args[4].clone();
        check_sizes(items, customers)?;
        let mut r = Random::for_parts(&[3, w as u64, d as u64]);
        let district = txn.table("district")?;
        let mut row = vec![int(d), int(w), text(r.astring(6, 10))];
        row.extend(address(&mut r));
        row.extend([
            dec(r.uniform(0, 2000)),
            dec(customers * 1000),
            int(customers + 1),
        ]);
        txn.insert(district, row)?;

        let customer = txn.table("customer")?;
        let customer_name = txn.table("customer_name")?;
        let history = txn.table("history")?;
        let last_range = customers.min(1000) - 1;
        for c in 1..=customers {
            let last = if c <= 1000 {
                last_name(c - 1)
            } else {
                last_name(r.nurand(nurand_a(last_range + 1), C_LAST_LOAD, 0, last_range))
            };
            let mut row = vec![int(c), int(d), int(w), text(r.astring(8, 16)), text("OE")];
            row.push(text(last));
            row.extend(address(&mut r));
            row.extend([
                text(r.nstring(16)),
                now.clone(),
                text(if r.uniform(1, 10) == 1 { "BC" } else { "GC" }),
                dec(5_000_000),
                dec(r.uniform(0, 5000)),
                dec(-1000),
                dec(1000),
                int(1),
                int(0),
                text(r.astring(300, 500)),
            ]);
            let (first, last) = (&row[col::customer::FIRST], &row[col::customer::LAST]);
            let name = vec![int(w), int(d), last.clone(), first.clone(), int(c)];
            txn.insert(customer, row)?;
            txn.insert(customer_name, name)?;
            txn.insert(
                history,
                vec![
                    int(c),
                    int(d),
                    int(w),
                    int(d),
                    int(w),
                    now.clone(),
                    dec(1000),
                    text(r.astring(12, 24)),
                    int(1),
                ],
            )?;
        }

        // Orders go to the customers in a random permutation (Fisher-Yates).
        let mut owner: Vec<i64> = (1..=customers).collect();
        for i in (1..owner.len()).rev() {
            let j = r.uniform(0, i as i64) as usize;
            owner.swap(i, j);
        }
        let orders = txn.table("orders")?;
        let customer_order = txn.table("customer_order")?;
        let order_line = txn.table("order_line")?;
        let new_order = txn.table("new_order")?;
        let undelivered = first_new_order(customers);
        for o in 1..=customers {
            let delivered = o < undelivered;
            let lines = r.uniform(5, 15);
            let c = owner[o as usize - 1];
            txn.insert(customer_order, vec![int(w), int(d), int(c), int(o)])?;
            txn.insert(
                orders,
                vec![
                    int(o),
                    int(d),
                    int(w),
                    int(c),
                    now.clone(),
                    if delivered {
                        int(r.uniform(1, 10))
                    } else {
                        Value::Null
                    },
                    int(lines),
                    int(1),
                ],
            )?;
            for n in 1..=lines {
                txn.insert(
                    order_line,
                    vec![
                        int(o),
                        int(d),
                        int(w),
                        int(n),
                        int(r.uniform(1, items)),
                        int(w),
                        if delivered { now.clone() } else { Value::Null },
                        int(5),
                        dec(if delivered { 0 } else { r.uniform(1, 999_999) }),
                        text(r.astring(24, 24)),
                    ],
                )?;
            }
            if !delivered {
                txn.insert(new_order, vec![int(o), int(d), int(w)])?;
            }
        }
        Ok(vec![])
    }
}
