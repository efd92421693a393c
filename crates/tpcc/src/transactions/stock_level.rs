//! Stock-Level (clause 2.8): how many items of a district's last 20 orders are low in
//! stock; reads only.

use super::get;
use crate::schema::col;
use crate::values::{int, int_of, ints};
use gyre_replica::{Column, ColumnType, Procedure, Result, Txn, Value};
use std::collections::BTreeSet;
use std::ops::Bound;

/// `tpcc_stock_level(w_id, d_id, threshold)`: one row, the number of distinct items.
pub struct StockLevel;

/// How many of the newest orders are examined.
const ORDERS: i64 = 20;

impl Procedure for StockLevel {
    fn name(&self) -> &str {
        "tpcc_stock_level"
    }

    fn params(&self) -> Vec<Column> {
        vec![
            Column::new("w_id", ColumnType::Int32, false),
            Column::new("d_id", ColumnType::Int32, false),
            Column::new("threshold", ColumnType::Int32, false),
        ]
    }

    fn returns(&self) -> Vec<Column> {
        vec![Column::new("low_stock", ColumnType::Int64, false)]
    }

    fn run(&self, txn: &mut Txn<'_>, args: &[Value]) -> Result<Vec<Vec<Value>>> {
        let [w, d, threshold] = ints(args);
        let d_row = get(txn, txn.table("district")?, &[int(w), int(d)], "district")?;
        let next = int_of(&d_row, col::district::NEXT_O_ID);
        let order_line = txn.table("order_line")?;
        let lo = [int(w), int(d), int(next - ORDERS)];
        let hi = [int(w), int(d), int(next)];
        let items: BTreeSet<i64> = txn
            .range(
                order_line,
                Bound::Included(&lo[..]),
                Bound::Excluded(&hi[..]),
            )?
            .map(|(_, l)| int_of(l, col::order_line::I_ID))
            .collect();
        let stock = txn.table("stock")?;
        let mut low = 0;
        for i in items {
            let s_row = get(txn, stock, &[int(w), int(i)], "stock")?;
            if int_of(&s_row, col::stock::QUANTITY) < threshold {
                low += 1;
            }
        }
        Ok(vec![vec![int(low)]])
    }
}
