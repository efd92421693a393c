//! Order-Status (clause 2.6): a customer's last order and its lines; reads only.

use super::{customer, get};
use crate::schema::{TIMESTAMP, col};
use crate::values::{int, int_of, ints};
use gyre_replica::{Column, ColumnType, Procedure, Result, Txn, Value};

/// `tpcc_order_status(w_id, d_id, c_id, c_last)`: one row per line of the customer's
/// newest order.
pub struct OrderStatus;

impl Procedure for OrderStatus {
    fn name(&self) -> &str {
        "tpcc_order_status"
    }

    fn params(&self) -> Vec<Column> {
        vec![
            Column::new("w_id", ColumnType::Int32, false),
            Column::new("d_id", ColumnType::Int32, false),
            Column::new("c_id", ColumnType::Int32, true),
            Column::new("c_last", ColumnType::Text, true),
        ]
    }

    fn returns(&self) -> Vec<Column> {
        let money = ColumnType::Decimal {
            precision: 12,
            scale: 2,
        };
        vec![
            Column::new("c_id", ColumnType::Int32, false),
            Column::new("c_balance", money, false),
            Column::new("o_id", ColumnType::Int32, false),
            Column::new("o_entry_d", TIMESTAMP, false),
            Column::new("o_carrier_id", ColumnType::Int32, true),
            Column::new("ol_i_id", ColumnType::Int32, false),
            Column::new("ol_supply_w_id", ColumnType::Int32, false),
            Column::new("ol_quantity", ColumnType::Int32, false),
            Column::new("ol_amount", money, false),
            Column::new("ol_delivery_d", TIMESTAMP, true),
        ]
    }

    fn run(&self, txn: &mut Txn<'_>, args: &[Value]) -> Result<Vec<Vec<Value>>> {
        let [w, d] = ints(args);
        let c_row = customer(txn, w, d, &args[2], &args[3])?;
        let c_id = int_of(&c_row, col::customer::ID);
        // The customer's newest order: the last of its orders in the index.
        let index = txn.table("customer_order")?;
        let Some(newest) = txn.last_with_prefix(index, &[int(w), int(d), int(c_id)])? else {
            return Ok(vec![]);
        };
        let o_id = int_of(&newest, col::customer_order::O_ID);
        let orders = txn.table("orders")?;
        let o_row = get(txn, orders, &[int(w), int(d), int(o_id)], "order")?;
        let order_line = txn.table("order_line")?;
        let head = [
            int(c_id),
            c_row[col::customer::BALANCE].clone(),
            int(o_id),
            o_row[col::orders::ENTRY_D].clone(),
            o_row[col::orders::CARRIER_ID].clone(),
        ];
        Ok(txn
            .prefix(order_line, &[int(w), int(d), int(o_id)])?
            .map(|(_, l)| {
                let mut row = head.to_vec();
                for i in [
                    col::order_line::I_ID,
                    col::order_line::SUPPLY_W_ID,
                    col::order_line::QUANTITY,
                    col::order_line::AMOUNT,
                    col::order_line::DELIVERY_D,
                ] {
                    row.push(l[i].clone());
                }
                row
            })
            .collect())
    }
}
